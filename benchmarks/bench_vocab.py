"""Wall time and peak resident memory of audits against the vocabulary size (a script, not a test).

Each measurement is one fresh process (``subprocess``), its peak resident set read from the
OS (``VmHWM`` of the child, whole process: interpreter, torch and report included; not
``ru_maxrss``, which on Linux carries the parent's peak into the child), its wall time from the parent.  Two kinds of rows:

* ``decoder-smoke``: ``specverify audit --decoder ... --tier smoke`` of the reference decoder at
  ``top_k=20`` with ``vocab_size=V`` (the README's decoder audit, 2 prompts x 4,000 samples x
  8 tokens, report written); only for V up to ``--max-smoke-vocab`` (its time is linear in V:
  ~8 min at V = 32,000 on two cores);
* ``decoder-core``: one prompt, ``--samples`` samples x 8 tokens of the same decoder, then the
  exact analysis of them against the target (:func:`specverify.decoder.conditionals.analyse_exact`)
  -- the two stages whose memory once grew with samples x V -- at every V;
* ``endpoint-smoke`` (``--endpoint-vocab V ...``): the endpoint smoke audit of the local server
  (``python -m specverify.endpoint.localserver --vocab-size V``) at top-k 20 with
  ``--top-logprobs 21 --vocab-size V``: the client's peak, the server's (its VmHWM read before it
  is stopped) and the sample store's size;
* ``verifier-smoke`` and ``tree-smoke``: the canonical rules' smoke audits (their real-vocabulary
  scenarios are at V = 128,256 and 151,936 whatever V is: one row each).

Usage: python benchmarks/bench_vocab.py [--vocab 64 32000 128256 151936 262144] [--samples 500]
       [--max-smoke-vocab 32000] [--no-batteries] [--json benchmarks/results/vocab_scaling.json]
(``--samples 0`` skips the decoder-core rows.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Child preamble: ``peak_kib()`` is the child's own high-water resident set (VmHWM).  Not
#: ``getrusage().ru_maxrss``: on Linux that carries the parent's peak across fork and exec, so a
#: child of a 2 GB pytest worker "peaks" at 2 GB whatever it does.
PEAK = r"""
import json, sys
from pathlib import Path


def peak_kib():
    return int(next(l for l in Path('/proc/self/status').read_text().splitlines() if l.startswith('VmHWM:')).split()[1])
"""

CORE = (
    PEAK
    + r"""
import torch
from specverify.cli.factories import reference_decoder, reference_target
from specverify.decoder.conditionals import ExactPlan, analyse_exact
V, N = int(sys.argv[1]), int(sys.argv[2])
decoder, target = reference_decoder(vocab_size=V, top_k=20), reference_target(vocab_size=V, top_k=20)
prompt = torch.arange(6) * 7 % V
tokens = decoder.generate(prompt, num_samples=N, max_new_tokens=8, seed=0)
out = analyse_exact(target, prompt, tokens, V, scenario="bench", plan=ExactPlan(), pit_seed=0)
print(json.dumps({"peak_kib": peak_kib(), "tests": len(out.results)}))
"""
)

#: Prints the child's own peak resident set (KiB) after running the CLI in-process.
CLI = (
    PEAK
    + r"""
from specverify.cli.commands import console_main
status = console_main()  # as the specverify executable runs it (specverify.core.allocator)
print(json.dumps({"peak_kib": peak_kib(), "status": status}))
"""
)


def measure(code: str, args: list[str]) -> dict:
    """Run ``code`` with ``args`` in a fresh interpreter: wall seconds and its own peak RSS."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {args}\n{done.stderr[-2000:]}")
    last = json.loads(done.stdout.strip().splitlines()[-1])
    row = {"wall_s": round(wall, 2), "peak_gb": round(last["peak_kib"] * 1024 / 1e9, 3)}
    if "status" in last:  # the audit's exit status: 0 the gate passes (PASS or SUSPICIOUS), 1 FAIL, 2 ERROR
        row["status"] = last["status"]
    return row


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def measure_endpoint(V: int, out: str, top_logprobs: int, per_request: int) -> dict:
    """The endpoint smoke audit of the local server at ``V`` (top-k 20, ``--top-logprobs``): wall
    time, the client's and the server's peak resident sets, and the store's size."""
    server = subprocess.Popen(
        [sys.executable, "-m", "specverify.endpoint.localserver", "--port", "0", "--max-logprobs", "-1",
         "--vocab-size", str(V)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        url = server.stdout.readline().split()[1]  # "serving URL ..."
        sparse = [] if top_logprobs == 0 else ["--top-logprobs", str(top_logprobs), "--vocab-size", str(V)]
        row = measure(CLI, ["audit", "--endpoint", url, "--model", "tiny-reference", "--top-k", "20", *sparse,
                            "--samples-per-request", str(per_request), "--out", out])  # fmt: skip
        row["server_peak_gb"] = round(_status_kib(server.pid, "VmHWM") * 1024 / 1e9, 3)
    finally:
        server.kill()
        server.wait()
    row["store_mb"] = round((Path(out) / "samples.jsonl").stat().st_size / 1e6, 2)
    return row


def decoder_cli(V: int, out: str) -> list[str]:
    factories = "specverify.cli.factories"
    return [
        "audit", "--decoder", f"{factories}:reference_decoder", "--target", f"{factories}:reference_target",
        "--decoder-option", "top_k=20", "--target-option", "top_k=20",
        "--decoder-option", f"vocab_size={V}", "--target-option", f"vocab_size={V}", "--out", out,
    ]  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="*", default=[64, 32000, 128256, 151936, 262144])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--max-smoke-vocab", type=int, default=32000)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-batteries", action="store_true", help="skip the verifier and tree smoke rows")
    parser.add_argument(
        "--endpoint-vocab", type=int, nargs="*", default=[], help="vocabularies of endpoint smoke rows (default none)"
    )
    parser.add_argument("--top-logprobs", type=int, default=21, help="the endpoint rows' --top-logprobs (0: off)")
    parser.add_argument("--samples-per-request", type=int, default=100, help="the endpoint rows' n per request")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        batteries = (
            ("verifier-smoke", ["audit", "--verifier", "reference.rules:verify", "--out", f"{tmp}/v"]),
            ("tree-smoke", ["audit", "--tree-verifier", "reference.tree_rules:verify_tree", "--out", f"{tmp}/t"]),
        )
        for name, cli in () if args.no_batteries else batteries:
            rows.append({"audit": name, "vocab": "2-151936", **measure(CLI, cli)})
            print(rows[-1], flush=True)
        for V in args.vocab:
            if args.samples:
                core = measure(CORE, [str(V), str(args.samples)])
                rows.append({"audit": f"decoder-core N={args.samples}", "vocab": V, **core})
                print(rows[-1], flush=True)
            if V <= args.max_smoke_vocab:
                rows.append({"audit": "decoder-smoke", "vocab": V, **measure(CLI, decoder_cli(V, f"{tmp}/d{V}"))})
                print(rows[-1], flush=True)
        for V in args.endpoint_vocab:
            rows.append(
                {
                    "audit": "endpoint-smoke",
                    "vocab": V,
                    **measure_endpoint(V, f"{tmp}/e{V}", args.top_logprobs, args.samples_per_request),
                }
            )
            print(rows[-1], flush=True)
    print("\n| audit | V | wall (s) | peak RSS (GB) | verdict |\n|---|---|---|---|---|")
    for row in rows:
        extra = f" (server {row['server_peak_gb']} GB, store {row['store_mb']} MB)" if "store_mb" in row else ""
        status = {0: "gate passes", 1: "FAIL", 2: "ERROR"}.get(row.get("status"), "")
        print(f"| {row['audit']} | {row['vocab']} | {row['wall_s']} | {row['peak_gb']}{extra} | {status} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

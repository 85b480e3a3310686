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
* ``verifier-smoke`` and ``tree-smoke``: the canonical rules' smoke audits (their real-vocabulary
  scenarios are at V = 128,256 and 151,936 whatever V is: one row each).

Usage: python benchmarks/bench_vocab.py [--vocab 64 32000 128256 151936 262144] [--samples 500]
       [--max-smoke-vocab 32000] [--json benchmarks/results/vocab_scaling.json]
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
from specverify.cli.commands import main
status = main(sys.argv[1:])
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
    return {"wall_s": round(wall, 2), "peak_gb": round(last["peak_kib"] * 1024 / 1e9, 3)}


def decoder_cli(V: int, out: str) -> list[str]:
    factories = "specverify.cli.factories"
    return [
        "audit", "--decoder", f"{factories}:reference_decoder", "--target", f"{factories}:reference_target",
        "--decoder-option", "top_k=20", "--target-option", "top_k=20",
        "--decoder-option", f"vocab_size={V}", "--target-option", f"vocab_size={V}", "--out", out,
    ]  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[64, 32000, 128256, 151936, 262144])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--max-smoke-vocab", type=int, default=32000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in (
            ("verifier-smoke", ["audit", "--verifier", "reference.rules:verify", "--out", f"{tmp}/v"]),
            ("tree-smoke", ["audit", "--tree-verifier", "reference.tree_rules:verify_tree", "--out", f"{tmp}/t"]),
        ):
            rows.append({"audit": name, "vocab": "2-151936", **measure(CLI, cli)})
            print(rows[-1], flush=True)
        for V in args.vocab:
            rows.append(
                {"audit": f"decoder-core N={args.samples}", "vocab": V, **measure(CORE, [str(V), str(args.samples)])}
            )
            print(rows[-1], flush=True)
            if V <= args.max_smoke_vocab:
                rows.append({"audit": "decoder-smoke", "vocab": V, **measure(CLI, decoder_cli(V, f"{tmp}/d{V}"))})
                print(rows[-1], flush=True)
    print("\n| audit | V | wall (s) | peak RSS (GB) |\n|---|---|---|---|")
    for row in rows:
        print(f"| {row['audit']} | {row['vocab']} | {row['wall_s']} | {row['peak_gb']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

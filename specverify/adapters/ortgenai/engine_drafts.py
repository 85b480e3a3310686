"""Can the ``Engine`` API's caller-supplied draft path (``Request.set_draft_tokens``) be driven here?

onnxruntime-genai 0.18.0's ``Engine`` verifies drafts a caller attaches with
``Request.set_draft_tokens`` by sample-and-match (``ScheduledRequests::SelectSampledRows``,
``src/engine/scheduled_requests.cpp``), but only on an ``Engine`` configured for dynamic batching
(``engine.dynamic_batching`` in ``genai_config.json``), which needs a decoder exported with paged
attention; the model builder exports that only for CUDA (fp16 / bf16) or WebGPU (fp16), and the
PyPI wheels run neither on a CPU-only machine.  :func:`probe_draft_verification` records each
step of that chain on the tiny models of :func:`~specverify.adapters.ortgenai.decoder.export_tiny_models`
(the exact error messages, for the report); :func:`format_probe` renders them (engine-free).
onnxruntime_genai is imported inside functions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specverify.adapters.ortgenai.decoder import EOS_TOKEN, _import_engine, export_tiny_models
from specverify.core.errors import InvalidArgument

__all__ = ["PROMPT", "probe_draft_verification", "format_probe"]

#: The prompt of every probe request (token ids of the tiny vocabulary).
PROMPT = (1, 2, 3)


def _error(call) -> str:
    """``call()``'s outcome: ``"ok: <value>"`` or ``"<ExceptionType>: <message>"`` (first line, trimmed)."""
    try:
        return f"ok: {call()}"
    except Exception as error:  # the message is the measurement
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {message[:300]}"


def _request(og, engine, *, top_k: int, min_tokens: int = 0):
    """A sampled request on ``engine`` with :data:`PROMPT`: 8 new tokens, at least ``min_tokens`` (EOS masked)."""
    import numpy as np

    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_do_sample(True)
    options.set_temperature(1.0)
    options.set_top_k(top_k)
    options.set_max_generated_tokens(8)
    options.set_min_generated_tokens(min_tokens)
    request.begin_turn(np.array(PROMPT, dtype=np.int32), options)
    return request


def _drafts():
    import numpy as np

    return np.array([4, 5, 6], dtype=np.int32)


def _after_one_step(og, engine, *, top_k: int, min_tokens: int = 0) -> str:
    """``set_draft_tokens`` once the request has decoded its first token (one ``Engine.run``)."""
    request = _request(og, engine, top_k=top_k, min_tokens=min_tokens)
    engine.run(engine.create_event_buffer(16))
    outcome = _error(lambda: request.set_draft_tokens(_drafts()))
    while engine.has_pending_requests():  # drain, so the next probe starts on an idle engine
        engine.run(engine.create_event_buffer(16))
    return outcome


def _paged_export(hf_dir: Path) -> str:
    """The model builder asked for paged attention on the CPU (fp32): its last error line."""
    with tempfile.TemporaryDirectory(prefix="ortgenai-paged-") as tmp:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", f"{tmp}/out"]
        cmd += ["-p", "fp32", "-e", "cpu", "-c", f"{tmp}/cache", "--extra_options", "use_paged_attention=true"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return "ok: exported"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else f"exit status {proc.returncode}"


def probe_draft_verification(*, seed: int = 0) -> list[tuple[str, str]]:
    """Drive ``Request.set_draft_tokens`` as far as this machine allows: ``[(step, outcome), ...]``.

    Steps, on the tiny target exported for the CPU (:func:`export_tiny_models`): the static
    ``Engine``'s ``max_draft_tokens_per_proposal()``; ``set_draft_tokens`` before the first decode
    step, then after it with ``top_k = 0`` and with ``top_k = V`` (with and without a minimum
    length); an ``Engine`` on the same export
    with ``engine.dynamic_batching`` added to its ``genai_config.json``; the builder asked for paged
    attention on the CPU; and onnxruntime's execution providers.
    """
    og = _import_engine()
    import onnxruntime

    base = export_tiny_models(seed=seed)
    config = json.loads((base / "target" / "genai_config.json").read_text())
    vocab_size = int(config["model"]["vocab_size"])
    if not 0 < EOS_TOKEN < vocab_size:
        raise InvalidArgument(f"EOS token {EOS_TOKEN} outside the exported vocabulary of {vocab_size}")
    steps = []
    engine = og.Engine(og.Model(str(base / "target")))
    steps.append(("static `Engine`: `max_draft_tokens_per_proposal()`", _error(engine.max_draft_tokens_per_proposal)))
    request = _request(og, engine, top_k=vocab_size)
    steps.append(
        ("`set_draft_tokens` before the first decode step", _error(lambda: request.set_draft_tokens(_drafts())))
    )
    while engine.has_pending_requests():
        engine.run(engine.create_event_buffer(16))
    steps.append(("`set_draft_tokens` after one step, sampled, `top_k = 0`", _after_one_step(og, engine, top_k=0)))
    full = f"`top_k = {vocab_size}` (= V)"
    steps.append(
        (
            f"`set_draft_tokens` after one step, sampled, {full}, `set_min_generated_tokens(8)` (EOS masked)",
            _after_one_step(og, engine, top_k=vocab_size, min_tokens=8),
        )
    )
    steps.append(
        (
            f"`set_draft_tokens` after one step, sampled, {full}, no minimum",
            _after_one_step(og, engine, top_k=vocab_size),
        )
    )
    with tempfile.TemporaryDirectory(prefix="ortgenai-dynamic-") as tmp:
        dynamic = Path(tmp) / "target"
        shutil.copytree(base / "target", dynamic)
        config["engine"] = {"dynamic_batching": {"max_batch_size": 1}}
        (dynamic / "genai_config.json").write_text(json.dumps(config, indent=1))
        steps.append(
            (
                "`Engine` with `engine.dynamic_batching` on the CPU fp32 export",
                _error(lambda: og.Engine(og.Model(str(dynamic))).max_draft_tokens_per_proposal()),
            )
        )
    steps.append(
        (
            "model builder, `-e cpu -p fp32 --extra_options use_paged_attention=true`",
            _paged_export(base / "hf" / "target"),
        )
    )
    steps.append(("onnxruntime execution providers", ", ".join(onnxruntime.get_available_providers())))
    return steps


def format_probe(steps) -> str:
    """Markdown list of :func:`probe_draft_verification`'s ``(step, outcome)`` pairs."""
    lines = []
    for step, outcome in steps:
        if not isinstance(step, str) or not isinstance(outcome, str) or not step or not outcome:
            raise InvalidArgument(f"a probe step is a pair of non-empty strings, got {(step, outcome)!r}")
        lines.append(f"- {step}: `{outcome.replace('`', chr(39))}`")
    if not lines:
        raise InvalidArgument("no probe steps to format")
    return "\n".join(lines)

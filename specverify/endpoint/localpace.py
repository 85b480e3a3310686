"""The local server's simulated accelerator: paced decoding steps, streamed replies and spec-decode counters.

A speculative decoder on a real accelerator is memory bound at small batch: a target pass takes
about the time it needs to read the target's weights, a drafter pass the drafter's.  The local
server's tiny models take well under a millisecond, so its timings say nothing about speculation;
with a :class:`Pace` they do.  Every decoding step is held to a fixed schedule: step ``j`` of a
request ends ``j`` step-times after the request started (the step's own computation is absorbed,
as long as it is shorter than the step).  A step is one round of the speculative decoder (``K``
drafter passes and one target pass: ``K d + P``) or one token of plain sampling (one target pass:
``P``).  So the true speedup of speculation over plain sampling, for replies of ``L`` tokens
that took ``R`` rounds each on average, is known in closed form (:func:`paced_speedup`)::

    speedup = L P / (R (K d + P))     (first token to last: (L - 1) P / ((R - 1) (K d + P)))
    saved per request = L P - R (K d + P)

and a benchmark must recover it (``tests/test_bench.py``).  :func:`decode` runs a request's rows
under the pace and hands each step's new tokens to a callback (the server streams them as
server-sent events); :class:`SpecCounters` counts drafts and acceptances as vLLM's metrics do
(``GET /metrics``), so the benchmark reads acceptance from this server as it reads it from vLLM.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument

__all__ = ["EventStream", "Pace", "SpecCounters", "decode", "paced_saving", "paced_speedup"]


@dataclass(frozen=True)
class Pace:
    """Simulated cost of one target pass and one drafter pass, in seconds (0: not paced)."""

    pass_seconds: float = 0.0
    draft_seconds: float = 0.0

    def __post_init__(self):
        for name in ("pass_seconds", "draft_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 60:
                raise InvalidArgument(f"{name} must be a number of seconds in [0, 60], got {value!r}")

    @property
    def on(self) -> bool:
        return self.pass_seconds > 0 or self.draft_seconds > 0

    def step_seconds(self, k: int) -> float:
        """One step: a round of ``k`` drafter passes and a target pass (``k`` = 0: plain sampling)."""
        return self.pass_seconds + k * self.draft_seconds


def paced_saving(pace: Pace, *, k: int, max_tokens: int, rounds_per_request: float) -> float:
    """The end-to-end seconds speculation saves per reply on the paced servers: ``L P - R (K d + P)``
    (a request's own handling costs both servers alike and cancels; arguments as :func:`paced_speedup`)."""
    if not rounds_per_request > 0:
        raise InvalidArgument(f"rounds_per_request must be positive, got {rounds_per_request!r}")
    return max_tokens * pace.pass_seconds - rounds_per_request * pace.step_seconds(k)


def paced_speedup(
    pace: Pace, *, k: int, max_tokens: int, rounds_per_request: float, decode_only: bool = False
) -> float:
    """The true speedup of the paced speculative server over the paced plain one: ``L P / (R (K d + P))``;
    of the decoding phase alone (first token to last, the time-per-output-token ratio) with
    ``decode_only``: ``(L - 1) P / ((R - 1) (K d + P))``.

    Parameters
    ----------
    pace : Pace
        Both servers' pace (``pass_seconds`` > 0).
    k : int
        The speculative server's draft length.
    max_tokens : int
        Tokens per reply, ``L`` (every reply runs to ``max_tokens``: the local server has no stop token).
    rounds_per_request : float
        Mean rounds per reply, ``R`` (from the server's counters: drafts / replies).  With a drafter
        whose drafts are always accepted it is ``ceil(L / (K + 1))``.

    Only the steps are paced: a request's own handling (HTTP, JSON: a few milliseconds) adds the
    same time to both servers' end-to-end latency and so pulls the measured end-to-end ratio
    towards 1; the decoding phase holds none of it.
    """
    if pace.pass_seconds <= 0:
        raise InvalidArgument(f"pace.pass_seconds must be positive, got {pace.pass_seconds!r}")
    if not rounds_per_request > (1 if decode_only else 0):
        raise InvalidArgument(f"rounds_per_request must be above {int(decode_only)}, got {rounds_per_request!r}")
    if decode_only:
        return (max_tokens - 1) * pace.pass_seconds / ((rounds_per_request - 1) * pace.step_seconds(k))
    return max_tokens * pace.pass_seconds / (rounds_per_request * pace.step_seconds(k))


class SpecCounters:
    """Cumulative speculative-decoding counters, named and counted as vLLM's Prometheus metrics.

    ``drafts``: verification steps per sequence (vLLM's ``num_drafts``); ``draft_tokens``: tokens
    proposed (``K`` per draft); ``accepted``: drafts accepted; ``accepted_per_pos[i]``: drafts
    accepted at in-block position ``i`` (0-based, as vLLM labels them).
    """

    def __init__(self, k: int):
        self.k = k
        self.requests = 0
        self.generation_tokens = 0
        self.drafts = 0
        self.accepted_per_pos = [0] * k
        self.overruns = 0  # paced steps whose computation outlasted the step (the pace did not hold)
        self._lock = threading.Lock()

    def overran(self) -> None:
        with self._lock:
            self.overruns += 1

    def add(self, *, tokens: int, stats=None) -> None:
        """One reply of ``tokens`` tokens, and the decoder's ``DecodeStats`` when it speculated."""
        with self._lock:
            self.requests += 1
            self.generation_tokens += tokens
            if stats is not None:
                self.drafts += int(stats.row_rounds)
                for i, count in enumerate(stats.accepted[: self.k]):
                    self.accepted_per_pos[i] += int(count)

    def prometheus(self, model_name: str, speculative: bool) -> str:
        """The counters in Prometheus' text format (the spec-decode ones only when speculating)."""
        labels = f'engine="0",model_name="{model_name}"'
        with self._lock:
            lines = [
                "# TYPE vllm:request_success_total counter",
                f"vllm:request_success_total{{{labels}}} {float(self.requests)}",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}",
                "# TYPE specverify_paced_step_overruns_total counter",
                f"specverify_paced_step_overruns_total{{{labels}}} {float(self.overruns)}",
            ]
            if speculative:
                for name, value in (
                    ("num_drafts", self.drafts),
                    ("num_draft_tokens", self.drafts * self.k),
                    ("num_accepted_tokens", sum(self.accepted_per_pos)),
                ):
                    lines += [f"# TYPE vllm:spec_decode_{name}_total counter",
                              f"vllm:spec_decode_{name}_total{{{labels}}} {float(value)}"]  # fmt: skip
                lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
                lines += [
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(count)}'
                    for i, count in enumerate(self.accepted_per_pos)
                ]
        return "\n".join(lines) + "\n"


def decode(
    decoder,
    prompt: list[int],
    *,
    n: int,
    max_tokens: int,
    seed: int,
    step_seconds: float = 0.0,
    emit=None,
    counters: SpecCounters | None = None,
    device: threading.Lock | None = None,
):
    """``n`` continuations of ``prompt`` as one batch, each step held to ``step_seconds``: (tokens, stats).

    The tokens are those of ``decoder.generate(prompt, num_samples=n, max_new_tokens=max_tokens,
    seed=seed)`` when the ``n`` rows fit one chunk (one generator seeded ``seed``, one batch): the
    caller checks that.  ``emit(row, new_tokens)`` is called after each step with each row's new
    tokens (a list of ints; rows with none are skipped).  ``stats`` is the speculative decoder's
    ``DecodeStats`` (None for plain sampling).  A paced step whose computation outlasted it is
    counted in ``counters.overruns``: where there are any, the pace did not hold.  ``device``, a
    lock shared by the server's requests, is held while a step computes and released while it
    waits: one step computes at a time, as on one accelerator, and concurrent requests do not
    contend for the interpreter step by step (which on two cores made steps outlast their pace).
    """
    generator = torch.Generator(device=decoder.device).manual_seed(seed)
    started = time.monotonic()
    steps = 0
    sent = [0] * n

    def on_step(outputs: list[torch.Tensor]) -> None:
        nonlocal steps
        steps += 1
        if device is not None:
            device.release()
        pause = started + steps * step_seconds - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        elif step_seconds > 0 and counters is not None:
            counters.overran()
        if emit is not None:
            for row, output in enumerate(outputs):
                if output.numel() > sent[row]:
                    emit(row, output[sent[row] :].tolist())
                    sent[row] = output.numel()
        if device is not None:
            device.acquire()

    prompts = torch.tensor(prompt, device=decoder.device).long().expand(n, -1)  # (n, T)
    with device if device is not None else contextlib.nullcontext():
        result = decoder.generate_batch(prompts, max_tokens, generator=generator, on_step=on_step)
    return getattr(result, "tokens", result), getattr(result, "stats", None)


class EventStream:
    """A completions reply streamed as server-sent events over HTTP/1.1 chunked encoding, as vLLM streams.

    ``handler`` is the request's ``BaseHTTPRequestHandler``.  The status line and headers go out
    when :meth:`open` is called -- once the request is found valid, before decoding starts, as
    servers start a streamed response -- or with the first event; an error found before that is
    still a plain JSON error reply.
    """

    def __init__(self, handler, *, reply_id: str, model: str, created: int):
        self.handler = handler
        self.head = {"id": reply_id, "object": "text_completion", "created": created, "model": model}
        self.started = False

    def open(self) -> None:
        """Send the status line and headers (once)."""
        if not self.started:
            self.handler.send_response(200)
            self.handler.send_header("Content-Type", "text/event-stream")
            self.handler.send_header("Transfer-Encoding", "chunked")
            self.handler.end_headers()
            self.started = True

    def _send(self, payload: str) -> None:
        self.open()
        data = f"data: {payload}\n\n".encode()
        self.handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.handler.wfile.flush()

    def choice(self, index: int, tokens: list[int], finish_reason: str | None = None) -> None:
        """One event: new tokens of choice ``index`` (text: the ids joined by spaces, as the server writes them)."""
        text = " ".join(str(t) for t in tokens)
        entry = {"index": index, "text": text, "token_ids": tokens, "logprobs": None, "finish_reason": finish_reason}
        self._send(json.dumps({**self.head, "choices": [entry]}))

    def finish(self, n: int, usage: dict | None) -> None:
        """Each choice's finish reason, the usage (when asked), ``[DONE]`` and the chunked body's end."""
        for index in range(n):
            self.choice(index, [], "length")
        if usage is not None:
            self._send(json.dumps({**self.head, "choices": [], "usage": usage}))
        self._send("[DONE]")
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()

"""What a benchmark times: one request to a served endpoint (streamed) or to an in-process decoder.

A subject answers :meth:`request` with a :class:`Timing` -- when the first token arrived, when
the reply ended, how many tokens it held -- and :meth:`counters` with its cumulative
speculative-decoding counters (:mod:`specverify.bench.counters`) or None, with ``counters_note``
saying why not.

* :class:`EndpointSubject`: an OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang,
  llama-server, the local server), asked to stream (``stream: true`` with
  ``stream_options.include_usage``), with ``ignore_eos`` so every reply runs to ``max_tokens``
  and ``return_token_ids`` (vLLM's: each event's token ids, where a server without a tokenizer
  streams no text).
  The first token's time is the arrival of the first event that carries text or token ids; the
  token count is the usage's ``completion_tokens`` (else the token ids' count).  The server is
  untrusted: a reply is bounded in bytes (:data:`REPLY_BYTES`) and time (the client's limits),
  an event in bytes (:data:`EVENT_BYTES`).  Counters: ``GET /metrics`` (vLLM's or llama-server's names), else the
  replies' ``timings.draft_n`` / ``draft_n_accepted`` (llama-server).
* :class:`DecoderSubject`: a decoder object with ``generate_batch(prompts, max_new_tokens, *,
  generator[, on_step])`` (the reference decoders and the adapters built on them): the first
  token's time is the first ``on_step`` call, counters are summed from the ``DecodeStats`` it
  returns.  A decoder with only the protocol's ``generate`` is timed end to end.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from dataclasses import dataclass

import torch

from specverify.bench.counters import SpecCounts, from_prometheus
from specverify.core.errors import InvalidArgument
from specverify.core.seeds import derive_seed
from specverify.endpoint.http import EndpointError, HttpClient, server_text

__all__ = ["Timing", "EndpointSubject", "DecoderSubject", "EventReader", "REPLY_BYTES", "EVENT_BYTES"]

#: Bytes a streamed reply may hold in all (a reply of 4,096 tokens in one event per token is ~1.5 MB).
REPLY_BYTES = 16 << 20
#: Bytes one server-sent event may hold before its end.
EVENT_BYTES = 1 << 20
#: Bytes of a ``/metrics`` page.
METRICS_BYTES = 8 << 20


@dataclass(frozen=True)
class Timing:
    """One request: seconds to the first token and to the last (None when the subject does not stream), to
    the end of the reply, and its tokens."""

    first_token: float | None
    latency: float
    tokens: int
    last_token: float | None = None

    @property
    def per_output_token(self) -> float | None:
        """Time per output token after the first: ``(last_token - first_token) / (tokens - 1)`` (vLLM's TPOT
        takes the reply's end for the last token; the last token's own arrival leaves out what a server
        sends after it)."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)


def _first_last(arrivals: list[float], latency: float, tokens: int) -> tuple:
    """Timing's fields from the token arrivals (seconds after the request): first, end, tokens, last."""
    return (arrivals[0] if arrivals else None, latency, tokens, arrivals[-1] if arrivals else None)


class EventReader:
    """Server-sent events from pieces of a body: ``feed(piece)`` -> the completed events' ``data`` payloads."""

    def __init__(self, limit: int = EVENT_BYTES):
        self.limit = limit
        self.pending = b""

    def feed(self, piece: bytes) -> list[str]:
        self.pending += piece.replace(b"\r\n", b"\n")
        *events, self.pending = self.pending.split(b"\n\n")
        if len(self.pending) > self.limit:
            raise EndpointError(f"a streamed event grew past {self.limit:,} bytes without ending")
        payloads = []
        for event in events:
            lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines).decode("utf-8", "replace"))
        return payloads


class EndpointSubject:
    """A streamed completions endpoint (see the module docstring).

    Parameters
    ----------
    client : HttpClient
        The server's client (its limits bound every exchange).
    model : str
        The served model's name.
    max_tokens : int
        Tokens per reply (``ignore_eos`` asks the server not to stop earlier).
    sampling : dict
        Sampling fields sent with every request (``temperature``, ``top_k``, ...).
    seed : int
        Root of the per-request seeds (request ``i`` is seeded ``derive_seed(seed, i)`` on both arms).
    reply_bytes : int
        Bytes one streamed reply may hold (:data:`REPLY_BYTES`).
    """

    streams = True

    def __init__(
        self,
        client: HttpClient,
        *,
        model: str,
        max_tokens: int,
        sampling: dict,
        seed: int,
        reply_bytes: int = REPLY_BYTES,
    ):
        self.client, self.model, self.max_tokens, self.reply_bytes = client, model, max_tokens, reply_bytes
        self.sampling, self.seed = dict(sampling), seed
        self.name = client.base_url
        self._lock = threading.Lock()
        self._timings = SpecCounts(drafts=None, draft_tokens=0, accepted=0)
        self._timed = False
        self._metrics: bool | None = None
        self._metrics_note = ""
        self.counters_note = ""

    def request(self, prompt: list[int] | str, index: int) -> Timing:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True, "return_token_ids": True,
                "seed": derive_seed(self.seed, index), **self.sampling}  # fmt: skip
        reader = EventReader()
        arrivals: list[float] = []  # when each event that carried tokens arrived
        state = {"ids": 0, "usage": None, "done": False, "timings": None}
        started = time.perf_counter()

        def on_data(piece: bytes) -> None:
            for payload in reader.feed(piece):
                if payload.strip() == "[DONE]":
                    state["done"] = True
                    continue
                self._event(payload, state, arrivals, started)

        self.client.stream("completions", body, on_data, max_bytes=self.reply_bytes)
        latency = time.perf_counter() - started
        if not state["done"]:
            raise EndpointError(f"the stream from {self.name} ended without its [DONE] event")
        usage = state["usage"]
        tokens = usage if isinstance(usage, int) else state["ids"]
        if not tokens:
            raise EndpointError(
                f"{self.name} streamed a reply with neither usage nor token ids: its tokens are unknown"
            )
        if not 0 < tokens <= self.max_tokens:
            raise EndpointError(f"{self.name} reported {tokens} tokens in a reply of at most {self.max_tokens}")
        if state["timings"] is not None:
            with self._lock:
                self._timings = self._timings + state["timings"]
                self._timed = True
        return Timing(*_first_last(arrivals, latency, int(tokens)))

    def _event(self, payload: str, state: dict, arrivals: list[float], started: float) -> None:
        try:
            event = json.loads(payload)
        except ValueError:
            raise EndpointError(f"a streamed event is not JSON: {server_text(payload, limit=120)}") from None
        if not isinstance(event, dict):
            raise EndpointError(f"a streamed event is not a JSON object: {server_text(payload, limit=120)}")
        if "error" in event:
            raise EndpointError(f"the server streamed an error: {server_text(event['error'], limit=200)}")
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                state["ids"] += len(ids)
            if choice.get("text") or ids:
                arrivals.append(time.perf_counter() - started)
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            state["usage"] = usage["completion_tokens"]
        timings = event.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
            accepted = timings.get("draft_n_accepted")
            state["timings"] = SpecCounts(None, timings["draft_n"], accepted if isinstance(accepted, int) else None)

    def counters(self) -> SpecCounts | None:
        """``GET /metrics`` (vLLM's names) if the server has it, else the replies' llama-server timings."""
        if self._metrics is not False:
            why = "its /metrics page has no spec_decode counters"
            try:
                counts = from_prometheus(self.client.get_text("/metrics", max_bytes=METRICS_BYTES))
            except EndpointError as error:
                counts, why = None, f"GET /metrics: {error}"
            if counts is not None:
                self._metrics = True
                return counts
            self._metrics = False
            self._metrics_note = why
        with self._lock:
            if self._timed:
                return self._timings
        self.counters_note = f"{self._metrics_note}; no llama-server draft timings in its replies"
        return None


class DecoderSubject:
    """An in-process decoder (see the module docstring).

    Parameters
    ----------
    decoder : object
        Has ``generate_batch(prompts, max_new_tokens, *, generator)`` or the protocol's ``generate``.
    max_tokens : int
        Tokens per reply.
    seed : int
        Request ``i`` is decoded with a generator seeded ``derive_seed(seed, i)``.
    """

    def __init__(self, decoder, *, max_tokens: int, seed: int, name: str = "decoder"):
        if not callable(getattr(decoder, "generate_batch", None)) and not callable(getattr(decoder, "generate", None)):
            raise InvalidArgument(f"decoder must have generate_batch or generate, got {type(decoder).__name__}")
        self.decoder, self.max_tokens, self.seed, self.name = decoder, max_tokens, seed, name
        batch = getattr(decoder, "generate_batch", None)
        self.streams = batch is not None and "on_step" in inspect.signature(batch).parameters
        self._lock = threading.Lock()
        self._counts: SpecCounts | None = None
        self.counters_note = "the decoder returns no DecodeStats"

    def request(self, prompt: list[int] | str, index: int) -> Timing:
        if isinstance(prompt, str):
            raise InvalidArgument("an in-process decoder takes token-id prompts, got text")
        seed = derive_seed(self.seed, index)
        arrivals: list[float] = []  # when each step that emitted tokens ended
        count = [0]
        started = time.perf_counter()
        batch = getattr(self.decoder, "generate_batch", None)
        if batch is None:
            tokens = self.decoder.generate(
                torch.tensor(prompt), num_samples=1, max_new_tokens=self.max_tokens, seed=seed
            )
            return Timing(None, time.perf_counter() - started, int(tokens.shape[-1]))

        def on_step(outputs) -> None:
            if outputs[0].numel() > count[0]:
                arrivals.append(time.perf_counter() - started)
                count[0] = outputs[0].numel()

        generator = torch.Generator(device=getattr(self.decoder, "device", "cpu")).manual_seed(seed)
        prompts = torch.tensor([prompt], dtype=torch.long)  # (1, T)
        options = {"on_step": on_step} if self.streams else {}
        result = batch(prompts, self.max_tokens, generator=generator, **options)
        latency = time.perf_counter() - started
        stats = getattr(result, "stats", None)
        if stats is not None:
            counts = SpecCounts(int(stats.row_rounds), int(stats.row_rounds) * int(stats.k), int(sum(stats.accepted)),
                                tuple(int(a) for a in stats.accepted))  # fmt: skip
            with self._lock:
                self._counts = counts if self._counts is None else self._counts + counts
        tokens = getattr(result, "tokens", result)
        return Timing(*_first_last(arrivals, latency, int(tokens.shape[-1])))

    def counters(self) -> SpecCounts | None:
        with self._lock:
            return self._counts

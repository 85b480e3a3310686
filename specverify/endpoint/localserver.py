"""A small OpenAI-compatible completions server around the reference decoder, for audits over real HTTP.

::

    python -m specverify.endpoint.localserver --port 8000 [--no-speculation] [--mutant NAME] [--max-logprobs -1]

Serves ``GET /v1/models`` and ``POST /v1/completions`` on 127.0.0.1 the way vLLM does for what
an audit uses: token-id prompts, ``n``, ``max_tokens``, ``temperature``, ``top_k``, ``top_p``,
``seed`` (``n`` samples of one request share one generator seeded ``seed``), ``return_token_ids``
(``choices[i].token_ids``), ``prompt_logprobs`` (raw log-probabilities of the prompt tokens, the
whole vocabulary for -1, capped at ``--max-logprobs`` like vLLM's flag, default 20).  The model is
the reference's seeded tiny transformer pair (``specverify.cli.factories``: V = 64, seed 0):
speculative decoding with its early-exit drafter (K = 4) by default, plain sampling of the target
with ``--no-speculation``, or a catalogued decoder mutant (``specverify.mutants``) with
``--mutant``.  ``--flaky N`` answers every N-th completion request with HTTP 503 (to exercise a
client's retries); ``--batch-dependent`` plants a batch-composition fault (a request handled
while another is in flight is sampled at temperature 1).  ``--misbehave KIND`` (after
``--misbehave-after N`` good replies) plays a hostile server's misbehaviour of
:mod:`specverify.endpoint.hostile`, as does any request to ``/hostile/KIND/N/RUN/v1/...``;
``--tls-cert FILE --tls-key FILE`` serves https.  ``--pace-pass S --pace-draft S`` hold every decoding
step to a simulated accelerator's cost (:mod:`specverify.endpoint.localpace`), ``"stream": true``
streams a reply's tokens as server-sent events as they are decoded, and ``GET /metrics`` counts
drafts and accepted tokens under vLLM's Prometheus names.  ``POST /completion`` answers as llama.cpp's
``llama-server`` does (:mod:`specverify.endpoint.localnative`, llama.cpp's sampling law).  The first line printed is
``serving http(s)://127.0.0.1:PORT/v1 model NAME``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import reprlib
import secrets
import ssl
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from specverify.core.errors import SpecVerifyError
from specverify.endpoint.api import STRUCTURED_FIELDS
from specverify.endpoint.fidelity import MAX_TOP_LOGPROBS
from specverify.endpoint.hostile import MISBEHAVIOURS, gzip_bomb, play, redirect_listing, targets
from specverify.endpoint.localnative import NativeError, native_reply
from specverify.endpoint.localpace import EventStream, Pace, SpecCounters, decode
from specverify.endpoint.served_logprobs import LOGPROB_FAULTS, choice_logprobs
from specverify.mutants.decoder import VISIBILITY, fault_visibility, make_decoder_mutant
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler, rows_per_chunk
from specverify_reference.grammar import Grammar, compiles
from specverify_reference.models import make_pair
from specverify_reference.processors import SamplingConfig

__all__ = ["CompletionServer", "make_server", "main"]


class CompletionServer:
    """The model behind the HTTP handler: decoders per sampling configuration, prompt logprobs."""

    def __init__(
        self,
        *,
        model_name: str = "tiny-reference",
        vocab_size: int = 64,
        seed: int = 0,
        k: int = 4,
        speculation: bool = True,
        mutant: str | None = None,
        max_logprobs: int = 20,
        flaky: int = 0,
        batch_dependent: bool = False,
        misbehave: str | None = None,
        misbehave_after: int = 0,
        logprob_fault: str | None = None,
        pace: Pace = Pace(),
        perfect_drafter: bool = False,
    ):
        self.model_name = model_name
        if logprob_fault is not None and logprob_fault not in LOGPROB_FAULTS:
            raise ValueError(f"--logprob-fault must be one of {', '.join(LOGPROB_FAULTS)}, got {logprob_fault!r}")
        self.logprob_fault = logprob_fault
        self.target, self.drafter = make_pair(vocab_size=vocab_size, seed=seed)
        if perfect_drafter:  # the target drafts for itself: every draft is accepted (a known acceptance of 1)
            self.drafter = self.target
        self.perfect_drafter = perfect_drafter
        self.vocab_size = vocab_size
        self.k, self.speculation, self.mutant = k, speculation, mutant
        self.pace = pace
        self.counters = SpecCounters(k)
        self.device = threading.Lock()  # a paced server computes one step at a time (localpace.decode)
        self.max_logprobs = max_logprobs
        self.flaky = flaky
        self.batch_dependent = batch_dependent
        if misbehave is not None and misbehave not in MISBEHAVIOURS:
            raise ValueError(f"--misbehave must be one of {', '.join(MISBEHAVIOURS)}, got {misbehave!r}")
        self.misbehave, self.misbehave_after = misbehave, int(misbehave_after)
        self.spoiled: Counter = Counter()  # (kind, after, run) -> targeted requests seen
        self.retried: Counter = Counter()  # (kind, after, run, request) -> times this request was spoiled
        self.healed: set[str] = set()
        self.seen: dict[str, list[str]] = {"origin": [], "collector": []}  # Authorization headers received
        self.collector_url = ""
        self.in_flight = 0
        self._decoders: dict[SamplingConfig, object] = {}
        self._lock = threading.Lock()
        self._count = 0

    def describe(self) -> str:
        what = (
            f"mutant {self.mutant}"
            if self.mutant
            else (f"speculative K={self.k}" if self.speculation else "no speculation")
            + (", the target drafting for itself" if self.perfect_drafter and self.speculation else "")
        )
        line = f"{self.model_name} ({what}, V={self.vocab_size})"
        if self.pace.on:
            line += f"; paced: target pass {self.pace.pass_seconds:g} s, drafter pass {self.pace.draft_seconds:g} s"
        if self.mutant:
            seen = fault_visibility(self.mutant)
            line += f"; its fault shows with {seen.when}"
            line += f": audit with {' '.join(seen.audit_with)}" if seen.audit_with else ""
        if self.logprob_fault:
            line += f"; planted logprob fault {self.logprob_fault} (the output law is right)"
        if self.misbehave:
            line += f"; misbehaving: {self.misbehave} after {self.misbehave_after} good replies"
        return line

    def declaration(self) -> dict:
        """What ``GET /v1/models`` says of the planted fault, so that an audit can tell whether it can see it."""
        if not self.mutant:
            return {}
        seen = fault_visibility(self.mutant)
        return {
            "specverify": {"mutant": self.mutant, "fault_shows_with": seen.when, "audit_with": list(seen.audit_with)}
        }

    def decoder(self, sampling: SamplingConfig):
        with self._lock:
            if sampling not in self._decoders:
                made: object
                if self.mutant:
                    made = make_decoder_mutant(self.mutant, self.target, self.drafter, k=self.k, sampling=sampling)
                elif self.speculation:
                    made = SpeculativeDecoder(self.target, self.drafter, k=self.k, sampling=sampling)
                else:
                    made = DirectSampler(self.target, sampling)
                self._decoders[sampling] = made
            return self._decoders[sampling]

    def misbehaviour(self, route: tuple | None, body: dict):
        """The misbehaviour that answers ``body`` on ``route`` ((kind, after, run) or None), and its count."""
        kind, after, run = route if route is not None else (self.misbehave, self.misbehave_after, "")
        if kind is None or run in self.healed or not targets(MISBEHAVIOURS[kind], body):
            return None, 0
        with self._lock:
            self.spoiled[(kind, after, run)] += 1
            seen = self.spoiled[(kind, after, run)]
            request = json.dumps(body, sort_keys=True)
            if MISBEHAVIOURS[kind].klass == "transient" and hashlib.sha256(request.encode()).digest()[0] % 3:
                return None, 0  # a transient fault spoils a third of the requests (by a hash of the body)
            earlier = self.retried[(kind, after, run, request)]
            if seen > after:
                self.retried[(kind, after, run, request)] += 1
        return (MISBEHAVIOURS[kind], earlier) if seen > after else (None, 0)

    def record(self, where: str, authorization: str | None) -> None:
        with self._lock:
            if len(self.seen[where]) < 100_000:
                self.seen[where].append(authorization or "")

    def should_fail(self) -> bool:
        with self._lock:
            self._count += 1
            return bool(self.flaky) and self._count % self.flaky == 0

    def complete(self, body: dict, stream: EventStream | None = None) -> dict:
        """The reply to a completions request (raises _HttpError for a bad one); with ``stream``, its
        tokens go out as events while they are decoded."""
        if body.get("model") != self.model_name:
            raise _HttpError(404, f"The model `{body.get('model')}` does not exist.")
        prompt = body.get("prompt")
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise _HttpError(400, "this server takes prompts as a non-empty list of token ids")
        if not all(0 <= t < self.vocab_size for t in prompt):
            raise _HttpError(400, f"prompt token ids must be in [0, {self.vocab_size})")
        n, max_tokens = _int(body, "n", 1, 1), _int(body, "max_tokens", 16, 1)
        sampling = _sampling(body)
        if sampling.grammar is not None:
            try:
                compiles(sampling.grammar, self.vocab_size)
            except SpecVerifyError as error:
                raise _HttpError(400, str(error)) from None
        if any(token >= self.vocab_size for token, _ in sampling.logit_bias):
            raise _HttpError(400, f"logit_bias token ids must be in [0, {self.vocab_size})")
        seed = body.get("seed")
        seed = secrets.randbits(31) if seed is None else _int(body, "seed", 0, 0)
        logprobs = body.get("prompt_logprobs")
        if logprobs is not None:
            wanted = self.vocab_size if logprobs == -1 else int(logprobs)
            cap = self.vocab_size if self.max_logprobs == -1 else self.max_logprobs
            if wanted > cap:
                raise _HttpError(
                    400, f"Requested prompt logprobs of {wanted}, which is greater than max allowed: {cap}"
                )
        one_batch = n <= rows_per_chunk(getattr(self.decoder(sampling), "max_batch", 1), self.vocab_size)
        if stream is not None and (logprobs is not None or body.get("logprobs") is not None):
            raise _HttpError(400, "this server does not stream logprobs")
        if (stream is not None or self.pace.on) and not one_batch:
            raise _HttpError(400, f"n = {n} rows do not fit one batch at V = {self.vocab_size}: not paced or streamed")
        if stream is not None:
            stream.open()  # the request is valid: its response starts before its first token
        with self._lock:
            self.in_flight += 1
            crowded = self.in_flight > 1
        try:
            if crowded and self.batch_dependent:  # the planted fault: batched requests lose their temperature
                sampling = dataclasses.replace(sampling, temperature=1.0)
            decoder = self.decoder(sampling)
            if one_batch:  # the same tokens as generate's one chunk, with the decoder's counters
                step = self.pace.step_seconds(self.k if self.speculation or self.mutant else 0)
                emit = None if stream is None else stream.choice
                tokens, stats = decode(decoder, prompt, n=n, max_tokens=max_tokens, seed=seed, step_seconds=step,
                                       emit=emit, counters=self.counters,
                                       device=self.device if self.pace.on else None)  # fmt: skip
            else:
                tokens, stats = decoder.generate(torch.tensor(prompt), num_samples=n, max_new_tokens=max_tokens,
                                                 seed=seed), None  # fmt: skip
        finally:
            with self._lock:
                self.in_flight -= 1
        self.counters.add(tokens=n * max_tokens, stats=stats)
        prompt_logprobs = None if logprobs is None else self.prompt_logprobs(prompt, logprobs)
        reported: list[dict | None] = [None] * n
        if body.get("logprobs") is not None:
            top = _int(body, "logprobs", 0, 0)
            if top > (self.vocab_size if self.max_logprobs == -1 else self.max_logprobs) or top > MAX_TOP_LOGPROBS:
                raise _HttpError(400, f"Requested sample logprobs of {top}, which is greater than max allowed")
            reported = list(choice_logprobs(self.target, sampling, prompt, tokens, top, self.logprob_fault))
        choices = [
            {
                "index": i,
                "text": " ".join(str(t) for t in row),
                "token_ids": row if body.get("return_token_ids") else None,
                "finish_reason": "length",
                "prompt_logprobs": prompt_logprobs,
                "logprobs": reported[i],
            }
            for i, row in enumerate(tokens.tolist())
        ]
        return {
            "id": f"cmpl-{secrets.token_hex(8)}",
            "object": "text_completion",
            "model": self.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": n * max_tokens},
        }

    def prompt_logprobs(self, prompt: list[int], top: int) -> list:
        """vLLM's prompt_logprobs: None, then per token the raw logprobs of the top ``top`` tokens (-1: all) and the token's own."""
        model = self.drafter if self.logprob_fault == "prompt_draft" else self.target  # the planted fault
        with torch.no_grad():
            logits = model(torch.tensor([prompt]))[0, :-1].double()  # (S - 1, V)
        logprobs = torch.log_softmax(logits, -1)  # (S - 1, V)
        order = torch.sort(-logprobs, dim=-1, stable=True).indices  # (S - 1, V) most likely first, ties by id
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(1, order.shape[-1] + 1).expand_as(order))
        out: list = [None]
        for i in range(logprobs.shape[0]):
            keep = order[i] if top == -1 else order[i, :top]
            ids = list(dict.fromkeys([*keep.tolist(), prompt[i + 1]]))
            at = torch.tensor(ids)
            values, ranks = logprobs[i, at].tolist(), rank[i, at].tolist()
            out.append(
                {str(t): {"logprob": v, "rank": r, "decoded_token": str(t)} for t, v, r in zip(ids, values, ranks)}
            )
        return out


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _int(body: dict, name: str, default: int, minimum: int) -> int:
    value = body.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _HttpError(400, f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _sampling(body: dict) -> SamplingConfig:
    """The request's sampling parameters as vLLM reads them (its law: ``engine="vllm"``)."""
    top_k = body.get("top_k")
    top_p = body.get("top_p")
    min_p = body.get("min_p")
    bias = body.get("logit_bias") or {}
    try:
        if not isinstance(bias, dict) or len(bias) > 300:  # OpenAI's API takes at most 300 entries
            raise ValueError(f"logit_bias must map at most 300 token ids to biases, got {reprlib.repr(bias)}")
        return SamplingConfig(
            temperature=float(body.get("temperature", 1.0)),
            top_k=None if top_k in (None, 0, -1) else top_k,
            top_p=None if top_p in (None, 1, 1.0) else float(top_p),
            min_p=None if min_p in (None, 0, 0.0) else float(min_p),
            engine="vllm",
            repetition_penalty=float(body.get("repetition_penalty", 1.0)),
            frequency_penalty=float(body.get("frequency_penalty", 0.0)),
            presence_penalty=float(body.get("presence_penalty", 0.0)),
            logit_bias={int(token): float(value) for token, value in bias.items()},
            grammar=_grammar(body.get("structured_outputs")),
        )
    except (SpecVerifyError, TypeError, ValueError) as error:
        raise _HttpError(400, str(error)) from None


def _grammar(field) -> Grammar | None:
    """vLLM's ``structured_outputs`` (one of ``json``, ``regex``, ``grammar``) as a Grammar over this
    server's :func:`~specverify_reference.grammar.synthetic_vocabulary`."""
    if field is None:
        return None
    kinds = {field_name: kind for kind, field_name in STRUCTURED_FIELDS.items()}
    if not isinstance(field, dict) or len(field) != 1 or next(iter(field)) not in kinds:
        raise ValueError(f"structured_outputs must hold one of json, regex, grammar, got {reprlib.repr(field)}")
    ((name, value),) = field.items()
    return Grammar(kinds[name], value)


def _route(path: str) -> tuple[tuple | None, str]:
    """``/hostile/KIND/N/RUN/v1/...`` -> ((KIND, N, RUN), "/v1/..."); any other path -> (None, path)."""
    parts = path.split("/")
    if len(parts) > 5 and parts[1] == "hostile" and parts[2] in MISBEHAVIOURS and parts[3].isdigit():
        return (parts[2], int(parts[3]), parts[4]), "/" + "/".join(parts[5:])
    return None, path


def _handler(server: CompletionServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # a streamed event leaves when written (TCP_NODELAY), as servers stream

        def log_message(self, format, *args):  # quiet: an audit sends thousands of requests
            return

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._reply(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def do_GET(self):
            server.record("origin", self.headers.get("Authorization"))
            if self.path == "/hostile/log":
                self._reply(200, {"seen": server.seen, "collector": server.collector_url})
                return
            route, path = _route(self.path)
            if route is not None and route[0] == "redirect" and route[1] == 0 and route[2] not in server.healed:
                redirect_listing(self, server.collector_url)
                return
            if path.rstrip("/") == "/metrics":
                data = server.counters.prometheus(server.model_name, server.speculation or bool(server.mutant)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif path.rstrip("/") == "/v1/models":
                entry = {"id": server.model_name, "object": "model", **server.declaration()}
                self._reply(200, {"object": "list", "data": [entry]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):
            server.record("origin", self.headers.get("Authorization"))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(min(length, 1 << 24))
            if self.path.startswith("/hostile/heal/"):
                server.healed.add(self.path.rsplit("/", 1)[-1])
                self._reply(200, {"healed": self.path.rsplit("/", 1)[-1]})
                return
            route, path = _route(self.path)
            native = route is None and path.rstrip("/") == "/completion"  # llama-server's route
            if path.rstrip("/") != "/v1/completions" and not native:
                self._error(404, f"no route {self.path}")
                return
            if server.should_fail():
                self._error(503, "flaky by request (--flaky)")
                return
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                self._error(400, "the request body is not a JSON object")
                return
            stream = None
            if not native and body.get("stream") is not None and body.get("stream") is not False:
                if body.get("stream") is not True or route is not None:
                    self._error(400, "stream must be true or false (and is not played by a hostile route)")
                    return
                stream = EventStream(self, reply_id=f"cmpl-{secrets.token_hex(8)}", model=server.model_name,
                                     created=int(time.time()))  # fmt: skip
            try:
                reply = native_reply(server, body) if native else server.complete(body, stream)
            except (_HttpError, NativeError) as error:
                if stream is not None and stream.started:
                    raise  # the events already went out: the connection drops
                self._error(error.status, str(error))
                return
            if stream is not None:
                options = body.get("stream_options") or {}
                usage = reply["usage"] if isinstance(options, dict) and options.get("include_usage") else None
                stream.finish(len(reply["choices"]), usage)
                return
            misbehaviour, count = server.misbehaviour(route, body)
            if misbehaviour is None:
                self._reply(200, reply)
                return
            play(self, misbehaviour, reply, count=count, collector=server.collector_url,
                 authorization=self.headers.get("Authorization") or "", vocab_size=server.vocab_size)  # fmt: skip

    return Handler


def _collector(server: CompletionServer):
    """Another origin (another port): it records the Authorization header of whatever reaches it."""

    class Collector(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            return

        def _any(self):
            server.record("collector", self.headers.get("Authorization"))
            self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1 << 24))
            data = b'{"error": {"message": "the collector answers nothing"}}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _any

    return Collector


class _Listener(ThreadingHTTPServer):
    """The HTTP server: a listen backlog for a benchmark's 16+ clients connecting at once (the standard
    library's 5 made the kernel reset connections)."""

    request_queue_size = 128


def make_server(
    port: int = 0, *, tls_cert: str | None = None, tls_key: str | None = None, **options
) -> tuple[ThreadingHTTPServer, CompletionServer]:
    """An HTTP(S) server on 127.0.0.1:``port`` (0: a free port) and the model behind it (not yet serving).

    A second origin, the collector of :mod:`specverify.endpoint.hostile`, serves on another port
    from a daemon thread.
    """
    model = CompletionServer(**options)
    httpd = _Listener(("127.0.0.1", port), _handler(model))
    httpd.daemon_threads = True
    if tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_cert, tls_key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    collector = ThreadingHTTPServer(("127.0.0.1", 0), _collector(model))
    collector.daemon_threads = True
    model.collector_url = f"http://127.0.0.1:{collector.server_address[1]}"
    threading.Thread(target=collector.serve_forever, name="collector", daemon=True).start()
    threading.Thread(target=gzip_bomb, name="bomb", daemon=True).start()  # ready before anyone asks for it
    return httpd, model


#: The example of ``--help``: a mutant audited with the options that make its fault visible.
EXAMPLE = """example: a planted fault, and the audit that can see it (its fault needs a temperature other than 1)
  python -m specverify.endpoint.localserver --port 8000 --max-logprobs -1 --mutant target_unprocessed &
  specverify audit --endpoint http://127.0.0.1:8000 --model tiny-reference --temperature 0.7 --num-samples 1000

Each mutant's fault and the options that show it:
""" + "\n".join(
    f"  {name}: {v.when}" + (f" ({' '.join(v.audit_with)})" if v.audit_with else "") for name, v in VISIBILITY.items()
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specverify.endpoint.localserver",
        description=__doc__.split("\n\n")[0],
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    parser.add_argument("--model-name", default="tiny-reference")
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="the models' weights")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--no-speculation", action="store_true")
    parser.add_argument("--mutant", help="a decoder mutant of specverify.mutants (e.g. target_unprocessed)")
    parser.add_argument("--max-logprobs", type=int, default=20, help="-1: the whole vocabulary (as vLLM's flag)")
    parser.add_argument("--flaky", type=int, default=0, metavar="N", help="answer every N-th completion with 503")
    parser.add_argument(
        "--misbehave",
        choices=sorted(MISBEHAVIOURS),
        metavar="KIND",
        help="answer completions as a hostile server (specverify.endpoint.hostile): " + ", ".join(MISBEHAVIOURS),
    )
    parser.add_argument("--misbehave-after", type=int, default=0, metavar="N", help="good replies before it starts")
    parser.add_argument("--logprob-fault", choices=LOGPROB_FAULTS,
                        help="a planted fault in the logprobs it reports (specverify.endpoint.served_logprobs)")  # fmt: skip
    parser.add_argument("--tls-cert", metavar="FILE", help="serve https with this certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--batch-dependent",
        action="store_true",
        help="a planted fault: a request handled while another is in flight is sampled at temperature 1",
    )
    parser.add_argument("--pace-pass", type=float, default=0.0, metavar="SECONDS",
                        help="simulated cost of a target pass (specverify.endpoint.localpace; 0: none)")  # fmt: skip
    parser.add_argument("--pace-draft", type=float, default=0.0, metavar="SECONDS",
                        help="simulated cost of a drafter pass (one draft token)")  # fmt: skip
    parser.add_argument("--perfect-drafter", action="store_true",
                        help="the target drafts for itself (every draft accepted: a benchmark's known answer)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        pace = Pace(args.pace_pass, args.pace_draft)
    except SpecVerifyError as error:
        parser.error(str(error))
    torch.set_num_threads(1)
    httpd, model = make_server(
        args.port,
        model_name=args.model_name,
        vocab_size=args.vocab_size,
        seed=args.seed,
        k=args.k,
        speculation=not args.no_speculation,
        mutant=args.mutant,
        max_logprobs=args.max_logprobs,
        flaky=args.flaky,
        batch_dependent=args.batch_dependent,
        misbehave=args.misbehave,
        misbehave_after=args.misbehave_after,
        logprob_fault=args.logprob_fault,
        pace=pace,
        perfect_drafter=args.perfect_drafter,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
    scheme = "https" if args.tls_cert else "http"
    print(f"serving {scheme}://{host}:{port}/v1 model {args.model_name}: {model.describe()}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    from specverify.core.allocator import reuse_large_blocks

    reuse_large_blocks()  # the server's own process: its (rows, V) blocks reused (specverify.core.allocator)
    sys.exit(main())

"""Misbehaviours a server under audit may play on its client: the catalogue and how the local server plays each.

``python -m specverify.endpoint.localserver --misbehave KIND`` answers completion requests with
one misbehaviour of :data:`MISBEHAVIOURS` (after ``--misbehave-after N`` good replies); a path
``/hostile/KIND/N/RUN/v1`` selects one per request instead (``RUN`` names an independent count,
so that tests share one server process).  Each entry says which class of the threat model it
belongs to (docs/endpoint.md), which requests it spoils, what the server does, and what the client
must do: refuse in one line (exit 2), recover (retry and finish), or ignore it (nothing the audit
uses is touched).  ``phrase`` is a part of the client's one line.

Every loop here is bounded in bytes and in time, and ends when the client hangs up: the server
never outlives a test.  ``redirect`` points at a second origin (another port, the "collector")
that records the ``Authorization`` header of anything it receives; ``GET /hostile/log`` returns
what the origin and the collector saw, and ``POST /hostile/heal/RUN`` ends the misbehaviour of
``RUN`` (the same audit, run again, then resumes from its store against a well-behaved server).
"""

from __future__ import annotations

import functools
import gzip
import json
import select
import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["Misbehaviour", "MISBEHAVIOURS", "CLASSES", "play", "targets", "gzip_bomb"]

#: The threat model's classes (docs/endpoint.md), in its order.
CLASSES = ("credentials", "size", "time", "content", "transient")

#: Bounds of every stream the server writes: bytes and seconds.
STREAM_BYTES = 1 << 31
STREAM_SECONDS = 120.0


@dataclass(frozen=True)
class Misbehaviour:
    """One way a server misbehaves (see the module docstring)."""

    name: str
    klass: str
    spoils: str  # "sampling" (requests for continuations), "logprobs" (teacher forcing) or "any"
    what: str
    expect: str  # "refused", "recovers" or "ignored"
    phrase: str


_ALL = (
    Misbehaviour("redirect", "credentials", "any", "HTTP 302 to another origin (the collector), the model list included", "refused", "redirects are not followed"),
    Misbehaviour("echo-key", "credentials", "any", "HTTP 400 whose message repeats the request's Authorization header", "refused", "HTTP 400"),
    Misbehaviour("echo-key-in-reply", "credentials", "any", "a good reply whose id, model and text fields hold the Authorization header", "ignored", ""),
    Misbehaviour("huge-declared", "size", "any", "Content-Length of 1 TiB, then zeros", "refused", "declares"),
    Misbehaviour("endless-chunked", "size", "any", "a chunked body that never ends", "refused", "more than"),
    Misbehaviour("endless-unframed", "size", "any", "a body without length that never ends", "refused", "more than"),
    Misbehaviour("many-headers", "size", "any", "100,000 header lines", "refused", "not a valid HTTP reply"),
    Misbehaviour("long-header", "size", "any", "one header line of 1 MiB", "refused", "not a valid HTTP reply"),
    Misbehaviour("compressed", "size", "any", "a gzip body (a 64 MiB bomb) though identity was asked", "refused", "encoded"),
    Misbehaviour("silent", "time", "any", "reads the request and never answers", "refused", "sent nothing"),
    Misbehaviour("drip", "time", "any", "a good reply, one byte every 50 ms", "refused", "no complete reply within"),
    Misbehaviour("stall", "time", "any", "the headers and half the body, then silence", "refused", "sent nothing"),
    Misbehaviour("flaky", "transient", "any", "a third of the requests first answered HTTP 503 with Retry-After: 1", "recovers", ""),
    Misbehaviour("reset", "transient", "any", "a third of the requests first answered by resetting the connection", "recovers", ""),
    Misbehaviour("cut", "transient", "any", "a third of the requests first answered with half the body, then the connection closed", "recovers", ""),
    Misbehaviour("not-json", "content", "any", "an HTML page with status 200", "refused", "not valid JSON"),
    Misbehaviour("invalid-utf8", "content", "any", "a body with bytes that are not UTF-8", "refused", "not UTF-8"),
    Misbehaviour("nan-logprob", "content", "logprobs", "NaN for one log-probability", "refused", "not a JSON number"),
    Misbehaviour("inf-logprob", "content", "logprobs", "1e999 for one log-probability", "refused", "overflows"),
    Misbehaviour("positive-logprob", "content", "logprobs", "0.5 for one log-probability", "refused", "at most 0"),
    Misbehaviour("duplicate-token", "content", "logprobs", "one token id twice in a logprob map", "refused", "appears twice"),
    Misbehaviour("capped", "content", "logprobs", "only the 20 most likely tokens of each law", "refused", "capped"),
    Misbehaviour("out-of-range-token", "content", "sampling", "a sampled token id equal to the vocabulary size", "refused", "outside the vocabulary"),
    Misbehaviour("float-token", "content", "sampling", "a sampled token id of 3.5", "refused", "not an integer token id"),
    Misbehaviour("short-continuation", "content", "sampling", "one token fewer than asked", "refused", "were asked"),
    Misbehaviour("wrong-count", "content", "sampling", "one choice more than asked", "refused", "choices"),
    Misbehaviour("missing-choices", "content", "any", "a JSON object without choices", "refused", "no choices"),
    Misbehaviour("extra-fields", "content", "any", "unknown fields in the reply and in every choice", "ignored", ""),
    Misbehaviour("enormous-number", "content", "sampling", "a token id of 5,000 digits", "refused", "not valid JSON"),
    Misbehaviour("deep-nesting", "content", "any", "choices nested 100,000 arrays deep", "refused", "nested too deeply"),
    Misbehaviour("control-chars", "content", "any", "HTTP 400 whose message holds terminal escapes, bidi overrides and lone surrogates", "refused", "HTTP 400"),
)  # fmt: skip
MISBEHAVIOURS = {m.name: m for m in _ALL}


def targets(misbehaviour: Misbehaviour, body: dict) -> bool:
    """Whether ``misbehaviour`` spoils the completion request ``body``."""
    logprobs = body.get("prompt_logprobs") is not None
    return misbehaviour.spoils == "any" or (misbehaviour.spoils == "logprobs") == logprobs


def play(
    handler, misbehaviour: Misbehaviour, reply: dict, *, count: int, collector: str, authorization: str, vocab_size: int
) -> None:
    """Answer the request of ``handler`` (a BaseHTTPRequestHandler) with ``misbehaviour``.

    ``reply`` is the good reply; ``count`` how many times this request was spoiled before (the
    transient kinds spoil a request once: its retry is answered); ``collector`` the other origin's base
    URL; ``authorization`` the request's header (or ""); ``vocab_size`` the model's.
    """
    handler.close_connection = True
    name = misbehaviour.name
    good = json.dumps(reply).encode()
    if name in ("flaky", "reset", "cut") and count > 0:
        _send(handler, 200, good)
    elif name == "flaky":
        _send(handler, 503, b'{"error": {"message": "busy"}}', [("Retry-After", "1")])
    elif name == "reset":
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.connection.close()
    elif name == "cut":
        _raw(handler, _head(200, len(good)) + good[: len(good) // 2])
    elif name == "redirect":
        _raw(handler, _head(302, 0, [("Location", collector + "/v1/completions")]))
    elif name == "echo-key":
        _send(handler, 400, json.dumps({"error": {"message": f"bad key: you sent {authorization}"}}).encode())
    elif name == "control-chars":
        message = "bad \x1b[2J\x1b]0;owned\x07 request \u202egnp.exe\u202c \ud800 end\r\nX-Injected: 1"
        _send(handler, 400, json.dumps({"error": {"message": message}}).encode())
    elif name == "echo-key-in-reply":
        spoiled = dict(reply, id=authorization, model=authorization, system_fingerprint=authorization)
        spoiled["choices"] = [dict(c, text=authorization) for c in reply["choices"]]
        _send(handler, 200, json.dumps(spoiled).encode())
    elif name in ("huge-declared", "endless-chunked", "endless-unframed", "many-headers", "long-header", "compressed"):
        _play_size(handler, name)
    elif name in ("silent", "drip", "stall"):
        _play_time(handler, name, good)
    else:
        _send(handler, 200, _spoil_content(name, reply, vocab_size))


def redirect_listing(handler, collector: str) -> None:
    """``GET /v1/models`` of the ``redirect`` misbehaviour: HTTP 302 to the collector."""
    handler.close_connection = True
    _raw(handler, _head(302, 0, [("Location", collector + "/v1/models")]))


def _play_size(handler, name: str) -> None:
    if name == "huge-declared":
        _raw(handler, _head(200, 1 << 40))
        _stream(handler, lambda: b"0" * (1 << 16))
    elif name == "endless-chunked":
        _raw(handler, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b" " * (1 << 16)
        _stream(handler, lambda: b"%x\r\n%s\r\n" % (len(chunk), chunk))
    elif name == "endless-unframed":
        _raw(handler, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n[")
        _stream(handler, lambda: b"1," * (1 << 15))
    elif name == "many-headers":
        _raw(handler, b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: 1\r\n" % i for i in range(100_000)) + b"\r\n")
    elif name == "long-header":
        _raw(handler, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n")
    else:  # compressed
        bomb = gzip_bomb()
        _raw(handler, _head(200, len(bomb), [("Content-Encoding", "gzip")]) + bomb)


@functools.cache
def gzip_bomb() -> bytes:
    """64 MiB of spaces, gzipped to about 64 KiB (made once: half a second of CPU)."""
    return gzip.compress(b" " * (64 << 20), compresslevel=9)


def _play_time(handler, name: str, good: bytes) -> None:
    if name == "silent":
        _wait_for_hangup(handler, STREAM_SECONDS)
    elif name == "drip":
        data = _head(200, len(good)) + good
        started = time.monotonic()
        for i in range(len(data)):
            if time.monotonic() - started > STREAM_SECONDS or not _raw(handler, data[i : i + 1]):
                return
            time.sleep(0.05)
    else:  # stall
        _raw(handler, _head(200, len(good)) + good[: len(good) // 2])
        _wait_for_hangup(handler, STREAM_SECONDS)


def _spoil_content(name: str, reply: dict, vocab_size: int) -> bytes:
    """The body of a content misbehaviour: ``reply`` spoiled as ``name`` says."""
    choices = reply["choices"]
    if name == "not-json":
        return b"<html><body>502 Bad Gateway</body></html>"
    if name == "invalid-utf8":
        return b'{"choices": [{"text": "\xff\xfe\xfd"}]}'
    if name == "missing-choices":
        return json.dumps({"object": "text_completion", "model": reply.get("model")}).encode()
    if name == "deep-nesting":
        return b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if name == "extra-fields":
        spoiled = dict(reply, unknown={"nested": [1, 2, {"x": None}]}, warnings=["extra"])
        spoiled["choices"] = [dict(c, stop_reason=None, unknown_field=[1.5, "x"]) for c in choices]
        return json.dumps(spoiled).encode()
    if name in ("nan-logprob", "inf-logprob", "positive-logprob", "duplicate-token", "capped"):
        return _spoil_logprobs(name, reply)
    first = choices[0]
    ids = list(first["token_ids"])
    if name == "out-of-range-token":
        ids[0] = vocab_size
    elif name == "float-token":
        ids[0] = 3.5
    elif name == "short-continuation":
        ids = ids[:-1]
    elif name == "enormous-number":
        return (
            json.dumps(dict(reply, choices=[dict(first, token_ids=[0])] + choices[1:]))
            .encode()
            .replace(b'"token_ids": [0]', b'"token_ids": [' + b"9" * 5000 + b"]", 1)
        )
    elif name == "wrong-count":
        return json.dumps(dict(reply, choices=choices + [dict(first, index=len(choices))])).encode()
    return json.dumps(dict(reply, choices=[dict(first, token_ids=ids)] + choices[1:])).encode()


def _spoil_logprobs(name: str, reply: dict) -> bytes:
    first = reply["choices"][0]
    laws = list(first["prompt_logprobs"])
    row = dict(laws[1])
    token = next(iter(row))
    if name == "capped":
        laws = [laws[0]] + [dict(sorted(law.items(), key=lambda kv: -kv[1]["logprob"])[:20]) for law in laws[1:]]
    else:
        row[token] = dict(row[token], logprob=f"@{name}@")
        laws[1] = row
    text = json.dumps(dict(reply, choices=[dict(first, prompt_logprobs=laws)] + reply["choices"][1:]))
    if name == "nan-logprob":
        text = text.replace('"@nan-logprob@"', "NaN")
    elif name == "inf-logprob":
        text = text.replace('"@inf-logprob@"', "1e999")
    elif name == "positive-logprob":
        text = text.replace('"@positive-logprob@"', "0.5")
    elif name == "duplicate-token":
        entry = json.dumps({token: row[token]})[1:-1].replace('"@duplicate-token@"', "-1.0")
        text = text.replace(
            f'"{token}": {{"logprob": "@duplicate-token@"', entry + f', "{token}": {{"logprob": -1.0', 1
        )
    return text.encode()


def _head(status: int, length: int, headers=()) -> bytes:
    reason = {200: "OK", 302: "Found", 400: "Bad Request", 503: "Service Unavailable"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {length}"]
    lines += [f"{k}: {v}" for k, v in headers] + ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _send(handler, status: int, body: bytes, headers=()) -> None:
    _raw(handler, _head(status, len(body), headers) + body)


def _raw(handler, data: bytes) -> bool:
    """Write ``data``; False once the client has hung up."""
    try:
        handler.wfile.write(data)
        handler.wfile.flush()
        return True
    except OSError:
        return False


def _stream(handler, chunk) -> None:
    """Write ``chunk()`` again and again until the client hangs up, or STREAM_BYTES / STREAM_SECONDS pass."""
    started, sent = time.monotonic(), 0
    while sent < STREAM_BYTES and time.monotonic() - started < STREAM_SECONDS:
        data = chunk()
        if not _raw(handler, data):
            return
        sent += len(data)


def _wait_for_hangup(handler, seconds: float) -> None:
    """Say nothing until the client closes the connection (or ``seconds`` pass)."""
    connection = handler.connection
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        readable, _, _ = select.select([connection], [], [], 0.2)
        if readable:
            try:
                if not connection.recv(1 << 16):
                    return
            except OSError:
                return

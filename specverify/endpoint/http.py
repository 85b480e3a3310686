"""JSON over HTTP with an untrusted server: the key kept to its origin, bounded replies, strict JSON, retries.

:class:`HttpClient` posts and gets JSON through :func:`specverify.endpoint.transport.exchange`
(one bounded exchange: time, size and encoding limits; no redirect, proxy or decompression),
one call per request, safe to share between threads.  Transient failures -- HTTP 408, 429 and
5xx, timeouts, dropped connections -- are retried with exponential backoff (``Retry-After``
honoured up to ``Limits.max_backoff``); anything else, and a transient failure that outlasts
the retries, is an :class:`EndpointError` of one line that says what the server did.

**The API key** is read from an environment variable at every request and sent only in the
``Authorization`` header, only to the origin (scheme, host, port) the client was made for, and
only over verified TLS or to a loopback host (``send_key_over_http=True`` allows plain HTTP to
another host).  It is never stored on the client, written to the sample store, or recorded in a
report or command, and every text a server sends back (an error message, a model name) is
cleaned of it before it is shown: control characters are dropped, the text is cut short, and
each occurrence of the key reads ``[redacted]``.

**Replies** are decoded strictly (:func:`decode_json`): UTF-8 only, no ``NaN``/``Infinity``, no
number that overflows a float, no duplicate key in an object, no nesting deeper than Python's
recursion limit.  See docs/endpoint.md, "Threat model".
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import math
import os
import ssl
import time
import urllib.parse
from typing import Any

from specverify.core.errors import InvalidArgument, SpecVerifyError
from specverify.endpoint.transport import Cancelled, Limits, SocketGuard, TransportError, exchange

__all__ = [
    "EndpointError",
    "HttpClient",
    "Limits",
    "RETRY_STATUS",
    "DEFAULT_KEY_ENV",
    "decode_json",
    "server_text",
    "is_loopback",
    "key_variable",
    "MODELS_REPLY_BYTES",
]

#: HTTP statuses retried with backoff: request timeout, rate limit, server errors.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: The environment variable an API key is read from unless another is named.
DEFAULT_KEY_ENV = "SPECVERIFY_API_KEY"
#: Bytes a ``GET /v1/models`` reply may hold.
MODELS_REPLY_BYTES = 4 << 20


class EndpointError(SpecVerifyError):
    """A server could not be audited: unreachable, refused the request, or answered what the audit cannot use.

    ``status`` is the HTTP status when there was one; ``body`` the server's message (cleaned).
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body


def server_text(text: Any, *, limit: int = 300, secrets: tuple[str, ...] = ()) -> str:
    """A text a server sent, fit to print: secrets redacted, control and format characters dropped, cut to ``limit``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = str(text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = "".join(c if c.isprintable() and not ("\ud800" <= c <= "\udfff") else " " for c in text[: 4 * limit + 64])
    text = " ".join(text.split())
    for secret in secrets:  # a secret that only appears once the text is cleaned
        if secret:
            text = text.replace(secret, "[redacted]")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} overflows a float")
    return value


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {server_text(duplicate, limit=40)!r} appears twice in one object")
    return out


def decode_json(raw: bytes, what: str = "the reply") -> Any:
    """The JSON value of ``raw``, decoded strictly (see the module docstring); :class:`EndpointError` otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EndpointError(f"{what} is not UTF-8 text (byte {error.start})") from None
    try:
        return json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except RecursionError:
        raise EndpointError(f"{what} is nested too deeply to be read") from None
    except ValueError as error:
        snippet = server_text(text, limit=60)
        if "integer string conversion" in str(error):
            raise EndpointError(f"{what} is not valid JSON for this client (an integer of over 4,300 digits)") from None
        raise EndpointError(f"{what} is not valid JSON ({server_text(error, limit=120)}): {snippet!r}") from None


def server_message(raw: bytes, secrets: tuple[str, ...] = ()) -> str:
    """The error text of a server's reply: ``error.message`` / ``message`` / ``detail`` of JSON, else the text."""
    try:
        data = decode_json(raw)
    except EndpointError:
        return server_text(raw, secrets=secrets)
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str):
                    return server_text(error[key], limit=500, secrets=secrets)
        if isinstance(error, str):
            return server_text(error, limit=500, secrets=secrets)
        if isinstance(data.get("detail"), str):
            return server_text(data["detail"], limit=500, secrets=secrets)
    return server_text(raw, secrets=secrets)


def key_variable(named: str | None) -> str:
    """The environment variable the API key is read from.

    None (nothing named): :data:`DEFAULT_KEY_ENV`, which may be unset (no key is sent).  A named
    variable is one the user means to send: unset or empty, it is an :class:`InvalidArgument`
    before any request.
    """
    if named is None:
        return DEFAULT_KEY_ENV
    if not isinstance(named, str) or not named:
        raise InvalidArgument(f"key_env must be the name of an environment variable, got {named!r}")
    if not os.environ.get(named):
        state = "empty" if named in os.environ else "not set"
        raise InvalidArgument(
            f"--api-key-env names ${named}, which is {state}: set it to the key, or leave the option out to send none"
        )
    return named


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HttpClient:
    """A JSON client of one server (one origin).

    Parameters
    ----------
    base_url : str
        ``http(s)://host[:port][/prefix]``, with or without the ``/v1`` suffix (paths are joined
        to it).  No user name or password (put the key in ``key_env``), query or fragment.
    key_env : str or None
        Environment variable holding the API key (sent as ``Authorization: Bearer``); unset or
        None: no header.
    limits : Limits
        Timeouts, retries and backoff (:class:`~specverify.endpoint.transport.Limits`).
    verify_tls : bool
        Verify the server's certificate (default True; ``SSL_CERT_FILE`` names another trust store).
    send_key_over_http : bool
        Allow the key to travel over plain HTTP to a host that is not loopback (default False:
        refused, since anyone on the path reads it).
    """

    def __init__(
        self,
        base_url: str,
        *,
        key_env: str | None = DEFAULT_KEY_ENV,
        limits: Limits | None = None,
        verify_tls: bool = True,
        send_key_over_http: bool = False,
        sleep=None,
    ):
        if not isinstance(base_url, str):
            raise InvalidArgument(f"url must be a string, got {type(base_url).__name__}")
        try:
            parsed = urllib.parse.urlsplit(base_url.strip())
            port = parsed.port
        except ValueError as error:
            raise EndpointError(f"endpoint {base_url!r} is not a valid URL ({error})") from None
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EndpointError(f"endpoint must be an http(s)://host[:port] URL, got {base_url!r}")
        if parsed.username is not None or parsed.password is not None:
            raise EndpointError(
                "endpoint URL holds a user name or password: it would be recorded in the report; "
                "put the key in an environment variable (--api-key-env) instead"
            )
        if parsed.query or parsed.fragment:
            raise EndpointError(f"endpoint URL must not have a query or fragment, got {base_url!r}")
        self.scheme, self.host = parsed.scheme, parsed.hostname
        self.port = port or (443 if parsed.scheme == "https" else 80)
        prefix = parsed.path.rstrip("/")
        self.prefix = prefix if prefix.endswith("/v1") else prefix + "/v1"
        self.netloc = parsed.netloc
        self.base_url = f"{self.scheme}://{self.netloc}{self.prefix}"
        self.origin = (self.scheme, self.host, self.port)
        self.key_env = key_env
        self.limits = limits if limits is not None else Limits()
        if not isinstance(self.limits, Limits):
            raise InvalidArgument(f"limits must be a Limits, got {limits!r}")
        self.verify_tls = bool(verify_tls)
        self.send_key_over_http = bool(send_key_over_http)
        self.context = None
        if self.scheme == "https":
            self.context = ssl.create_default_context()
            self.context.minimum_version = ssl.TLSVersion.TLSv1_2
            if not self.verify_tls:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE
        self.guard = SocketGuard()
        self._sleep = sleep
        self.retried = 0  # transient failures retried so far (all threads)
        self._key()  # a key that may not travel to this origin is refused before any request

    def url(self, path: str) -> str:
        """``path`` under the base URL (``.../v1/models``), or from the server's root when it starts with ``/``
        (the base URL's prefix without its ``/v1``: llama-server's native ``/completion``)."""
        return f"{self.scheme}://{self.netloc}{self._target(path)}"

    def _target(self, path: str) -> str:
        """The request target of ``path`` (see :meth:`url`)."""
        return f"{self.prefix.removesuffix('/v1')}{path}" if path.startswith("/") else f"{self.prefix}/{path}"

    def post(self, path: str, body: dict, *, max_bytes: int = 64 << 20) -> Any:
        """POST ``body`` as JSON to ``path``; the decoded JSON reply (at most ``max_bytes`` of it)."""
        return self._request("POST", path, json.dumps(body).encode(), max_bytes=max_bytes)

    def stream(self, path: str, body: dict, on_data, *, max_bytes: int) -> None:
        """POST ``body`` as JSON to ``path``; the reply's body goes to ``on_data`` piece by piece as it arrives.

        Never retried: a benchmark times the one exchange it sent.  Errors as :meth:`post`'s.
        """
        self._request("POST", path, json.dumps(body).encode(), max_bytes=max_bytes, retries=0, on_data=on_data)

    def get(self, path: str, *, retries: int | None = None, max_bytes: int = MODELS_REPLY_BYTES) -> Any:
        """GET ``path``; ``retries`` overrides the client's (a first contact should fail fast)."""
        return self._request("GET", path, None, max_bytes=max_bytes, retries=retries)

    def get_text(self, path: str, *, max_bytes: int = MODELS_REPLY_BYTES) -> str:
        """GET ``path`` once (no retry); its body as text (a Prometheus ``/metrics`` page), at most ``max_bytes``."""
        parts: list[bytes] = []
        self._request("GET", path, None, max_bytes=max_bytes, retries=0, on_data=parts.append)
        return b"".join(parts).decode("utf-8", "replace")

    def abort(self) -> None:
        """Abandon every request in flight and refuse new ones (the audit is stopping)."""
        self.guard.abort()

    def secrets(self) -> tuple[str, ...]:
        key = os.environ.get(self.key_env) if self.key_env else None
        return (key,) if key else ()

    def _key(self) -> str | None:
        key = os.environ.get(self.key_env) if self.key_env else None
        if not key:
            return None
        if any(not 0x21 <= ord(c) <= 0x7E for c in key):
            raise EndpointError(
                f"the API key in ${self.key_env} holds a space, control or non-ASCII character: "
                "it cannot be sent in a header"
            )
        secure = self.scheme == "https" and self.verify_tls
        if not secure and not is_loopback(self.host) and not self.send_key_over_http:
            why = "over plain http" if self.scheme == "http" else "over TLS without certificate verification"
            raise EndpointError(
                f"refusing to send the API key in ${self.key_env} {why} to {self.host} (anyone on the path could "
                "read it): use https, a tunnel to localhost, or --send-key-over-http to accept the risk"
            )
        return key

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "specverify"}
        key = self._key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _request(
        self, method: str, path: str, data: bytes | None, *, max_bytes: int, retries: int | None = None, on_data=None
    ):
        url = self.url(path)
        target = self._target(path)
        retries = self.limits.retries if retries is None else retries
        delay = 0.5
        for attempt in range(retries + 1):
            try:
                reply = exchange(scheme=self.scheme, host=self.host, port=self.port, method=method, target=target,
                                 headers=self._headers(), body=data, limits=self.limits, max_bytes=max_bytes,
                                 guard=self.guard, context=self.context, on_data=on_data)  # fmt: skip
            except Cancelled:
                raise EndpointError(f"{method} {url}: abandoned (the audit is stopping)") from None
            except TransportError as error:
                if error.transient and attempt < retries:
                    self._wait(delay, None)
                    delay = min(2 * delay, self.limits.max_backoff)
                    continue
                if str(error).startswith(("cannot connect", "no connection")):
                    raise EndpointError(f"{method} {url}: unreachable after {attempt + 1} attempts ({error})") from None
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise EndpointError(f"{method} {url}: {error}{tries}") from None
            status = reply.status
            if 300 <= status < 400:
                location = server_text(reply.headers.get("location", "(none)"), limit=120, secrets=self.secrets())
                raise EndpointError(
                    f"{method} {url}: HTTP {status} redirect to {location}: redirects are not followed (the API "
                    "key must not leave the origin it was given for); give the final URL", status=status
                )  # fmt: skip
            if status >= 400 or status < 200:
                message = server_message(reply.body, self.secrets())
                if status in RETRY_STATUS and attempt < retries:
                    self._wait(delay, reply.headers.get("retry-after"))
                    delay = min(2 * delay, self.limits.max_backoff)
                    continue
                raise EndpointError(f"{method} {url}: HTTP {status}: {message}", status=status, body=message)
            if on_data is not None:
                return None
            try:
                return decode_json(reply.body, f"the reply to {method} {url} (HTTP {status})")
            except EndpointError as error:
                raise EndpointError(server_text(error, limit=400, secrets=self.secrets()), status=status) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, delay: float, retry_after: str | None) -> None:
        self.retried += 1
        wait = delay
        if retry_after:
            text = retry_after.strip()
            if text.isdigit():
                wait = float(text[:12])
            else:
                try:
                    when = email.utils.parsedate_to_datetime(text)
                    wait = when.timestamp() - time.time()
                except (TypeError, ValueError, IndexError, OverflowError):
                    wait = delay
        wait = min(max(wait, 0.0), self.limits.max_backoff)
        if self._sleep is not None:
            self._sleep(wait)
        elif self.guard.aborted.wait(wait):
            raise EndpointError("abandoned (the audit is stopping)")

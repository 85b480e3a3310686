"""One bounded HTTP/1.1 exchange with an untrusted server: time, size and encoding limits, abortable.

:func:`exchange` opens one connection (``Connection: close``), sends one request and reads one
reply with the standard library's :mod:`http.client`, under :class:`Limits`:

* **time**: connecting at most ``connect_timeout`` seconds; the first byte of the reply and every
  later byte at most ``read_timeout`` apart; the whole exchange, from connecting to the last byte,
  at most ``request_timeout`` (a :class:`SocketGuard` shuts the socket down at that deadline, which
  also ends a reply that drips one byte at a time, or headers that never end);
* **size**: a body of more than ``max_bytes`` is refused -- from its ``Content-Length`` before a
  byte of it is read, otherwise as soon as the count passes the limit (chunked or unbounded);
  an error status's body is read up to ``Limits.error_body_bytes`` only; :mod:`http.client`
  refuses a header line over 64 KiB and more than 100 headers;
* **encoding**: ``Accept-Encoding: identity`` is sent and a body in any other
  ``Content-Encoding`` is refused (no decompression, so no decompression bomb).

Nothing is followed or added: no redirect (a 3xx is returned to the caller, who refuses it), no
proxy (the environment's ``http_proxy`` / ``https_proxy`` are not read), no cookies.  Failures are
:class:`TransportError` s that say whether retrying may help (a timeout, a dropped connection) or
not (a body over the limit, a protocol violation).  :meth:`SocketGuard.abort` ends every exchange
in flight within a guard tick (an interrupted audit exits at once).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from specverify.core.errors import InvalidArgument

__all__ = ["Limits", "SocketGuard", "TransportError", "Reply", "exchange", "READ_CHUNK"]

#: Bytes read from the socket at a time.
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Limits:
    """How long and how much one exchange may take (see the module docstring).

    Parameters
    ----------
    connect_timeout : float
        Seconds to open the connection (and finish the TLS handshake).
    read_timeout : float
        Seconds the server may stay silent: before the first byte of its reply and between bytes.
    request_timeout : float
        Seconds for the whole exchange, connect to last byte.
    retries : int
        Transient failures retried this many times per request.
    max_backoff : float
        Longest wait between two attempts (a server's ``Retry-After`` is capped at it).
    error_body_bytes : int
        Bytes of an error reply's body read for its message.
    """

    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    request_timeout: float = 600.0
    retries: int = 6
    max_backoff: float = 30.0
    error_body_bytes: int = 1 << 16

    def __post_init__(self):
        for name in ("connect_timeout", "read_timeout", "request_timeout", "max_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("retries", "error_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{name} must be an integer >= 0, got {value!r}")


class TransportError(Exception):
    """An exchange that did not bring a usable reply; ``transient``: retrying may help."""

    def __init__(self, message: str, *, transient: bool):
        super().__init__(message)
        self.transient = transient


class Cancelled(TransportError):
    """The exchange was abandoned by :meth:`SocketGuard.abort` (the audit is stopping)."""

    def __init__(self):
        super().__init__("abandoned: the audit is stopping", transient=False)


@dataclass(frozen=True)
class Reply:
    """A reply: its status, headers (lower-case names; a repeated header's last value) and body."""

    status: int
    headers: dict
    body: bytes


class SocketGuard:
    """Shuts sockets down at their deadline, or all at once on :meth:`abort` (one daemon thread, 20 ticks a second).

    Shutting a socket down wakes a thread blocked reading it, which then sees its reply end; the
    exchange asks :meth:`expired` / :attr:`aborted` to tell a deadline or an abort from the
    server's own hang-up.
    """

    TICK = 0.05

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[socket.socket, float]] = {}
        self._expired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None
        self.aborted = threading.Event()

    def watch(self, sock: socket.socket, deadline: float) -> int:
        with self._lock:
            if self.aborted.is_set():
                _shutdown(sock)
                raise Cancelled()
            self._next += 1
            self._watched[self._next] = (sock, deadline)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="specverify-socket-guard", daemon=True)
                self._thread.start()
            return self._next

    def release(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)
            self._expired.discard(token)

    def expired(self, token: int) -> bool:
        with self._lock:
            return token in self._expired

    def abort(self) -> None:
        """End every exchange in flight now; later exchanges are cancelled before they connect."""
        with self._lock:
            self.aborted.set()
            for sock, _ in self._watched.values():
                _shutdown(sock)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while not self.aborted.wait(self.TICK):
            now = time.monotonic()
            with self._lock:
                for token, (sock, deadline) in self._watched.items():
                    if now >= deadline and token not in self._expired:
                        self._expired.add(token)
                        _shutdown(sock)
                if self._watched:
                    idle_since = now
                elif now - idle_since > 1.0:  # nothing to watch for a second: stop (watch() restarts it)
                    self._thread = None
                    return


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def exchange(
    *,
    scheme: str,
    host: str,
    port: int,
    method: str,
    target: str,
    headers: dict,
    body: bytes | None,
    limits: Limits,
    max_bytes: int,
    guard: SocketGuard,
    context: ssl.SSLContext | None = None,
    on_data=None,
) -> Reply:
    """One request and its reply under ``limits`` (see the module docstring); :class:`TransportError` otherwise.

    ``on_data(piece)``, if given, receives a successful reply's body as it arrives (each piece as
    soon as the socket yields it, for a streamed reply's timing) instead of the reply holding it;
    ``max_bytes`` still bounds the whole body.
    """
    if guard.aborted.is_set():
        raise Cancelled()
    started = time.monotonic()
    deadline = started + limits.request_timeout
    try:
        raw = socket.create_connection((host, port), timeout=min(limits.connect_timeout, limits.request_timeout))
    except TimeoutError:
        raise TransportError(f"no connection within {limits.connect_timeout:g} s", transient=True) from None
    except OSError as error:
        raise TransportError(f"cannot connect: {_os_reason(error)}", transient=True) from None
    token = guard.watch(raw, deadline)
    sock: socket.socket = raw
    try:
        if scheme == "https":
            assert context is not None
            sock = context.wrap_socket(raw, server_hostname=host)
        sock.settimeout(limits.read_timeout)
        connection = http.client.HTTPConnection(host, port)
        connection.sock = sock
        connection.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Accept-Encoding", "identity")
        connection.putheader("Connection", "close")
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        status = int(response.status)
        reply_headers = {name.lower(): value for name, value in response.getheaders()}
        if status >= 400:
            data = _read_body(response, limits.error_body_bytes, truncate=True)
        elif 300 <= status < 400:
            data = b""  # a redirect's body is never read: the caller refuses the redirect
        else:
            encoding = reply_headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise TransportError(
                    f"the reply is encoded ({_short(encoding)}) though identity was asked: not decoded",
                    transient=False,
                )
            declared = reply_headers.get("content-length")
            if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
                raise TransportError(
                    f"the reply declares {_size(int(declared))} (Content-Length), more than the "
                    f"{_size(max_bytes)} this request's reply may hold",
                    transient=False,
                )
            data = _read_body(response, max_bytes, truncate=False, on_data=on_data)
            if on_data is None and declared is not None and declared.strip().isdigit() and len(data) != int(declared):
                raise http.client.IncompleteRead(data, int(declared) - len(data))
        if guard.expired(token) or guard.aborted.is_set():  # the body ended because the guard shut the socket
            raise OSError("shut down by the guard")
        return Reply(status, reply_headers, data)
    except TransportError:
        raise
    except ssl.SSLCertVerificationError as error:
        raise TransportError(f"TLS certificate not trusted: {error.verify_message}", transient=False) from None
    except ssl.SSLError as error:
        if guard.aborted.is_set():
            raise Cancelled() from None
        raise TransportError(f"TLS failed: {error.reason or error}", transient=False) from None
    except (http.client.LineTooLong, http.client.UnknownProtocol) as error:
        raise TransportError(f"not a valid HTTP reply: {_short(str(error))}", transient=False) from None
    except (TimeoutError, http.client.HTTPException, OSError) as error:
        if guard.aborted.is_set():
            raise Cancelled() from None
        if guard.expired(token) or time.monotonic() >= deadline:
            raise TransportError(
                f"no complete reply within {limits.request_timeout:g} s (the request timeout)", transient=True
            ) from None
        if isinstance(error, TimeoutError):
            raise TransportError(f"the server sent nothing for {limits.read_timeout:g} s", transient=True) from None
        if isinstance(error, http.client.HTTPException) and str(error).startswith("got more than"):  # 100 headers
            raise TransportError(f"not a valid HTTP reply: {_short(str(error))}", transient=False) from None
        reason = _os_reason(error) if isinstance(error, OSError) else type(error).__name__
        raise TransportError(f"the connection failed: {reason}", transient=True) from None
    finally:
        guard.release(token)
        try:
            sock.close()
        except OSError:
            pass


def _read_body(response: http.client.HTTPResponse, limit: int, *, truncate: bool, on_data=None) -> bytes:
    """At most ``limit`` bytes of the body (``truncate``: keep the first ``limit``; else refuse more);
    with ``on_data``, each piece goes to it as soon as it arrives (``read1``) and none is kept."""
    parts: list[bytes] = []
    got = 0
    while True:
        size = min(READ_CHUNK, limit + 1 - got)
        chunk = response.read(size) if on_data is None else response.read1(size)
        if not chunk:
            break
        got += len(chunk)
        if on_data is not None and got <= limit:
            on_data(chunk)
            continue
        parts.append(chunk)
        if got > limit:
            if truncate:
                return b"".join(parts)[:limit]
            raise TransportError(
                f"the reply holds more than the {_size(limit)} this request's reply may hold", transient=False
            )
    return b"".join(parts)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def _short(text: str, limit: int = 80) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _os_reason(error: OSError) -> str:
    return _short(error.strerror or type(error).__name__)

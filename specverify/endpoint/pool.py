"""Sending an audit's requests: concurrent, through the sample store, abandoned at once when the audit stops.

:class:`Fetcher` takes a batch of :class:`Request` s, answers those the store already holds
from the store (after checking that each stored reply has the form its request asks for), sends
the rest on at most ``concurrency`` worker threads (each a blocking
:class:`~specverify.endpoint.http.HttpClient` call; the reply is parsed and stored on the worker
as it arrives), and returns the replies in the batch's order.

When a request fails for good, or the audit is interrupted (``KeyboardInterrupt``), every
request in flight is abandoned: the clients shut their sockets down, the workers (daemon
threads) end within a guard tick, and the error is raised; every reply already stored stays
stored.  The first :class:`~specverify.endpoint.http.EndpointError` is kept (``failure``): every
later :meth:`Fetcher.fetch` raises it again without sending anything, so a battery that catches
it cannot go on talking to a server the audit has given up on.

It also keeps the audit's ledger: requests sent and answered from the store, tokens received,
the wall time spent waiting on the server and the time spent on everything else (the client's
own overhead, reported).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specverify.endpoint.http import EndpointError
from specverify.endpoint.store import SampleStore, request_key

__all__ = ["Request", "Fetcher", "FetchProgress", "Ledger", "TerminalProgress"]


@dataclass(frozen=True)
class Request:
    """One request of an audit: who answers it (``role``), its JSON body, how to read the reply.

    ``occurrence`` tells apart a request repeated on purpose (the same body sent again);
    ``extra`` is what else determines the stored reply (e.g. which logprob rows are kept);
    ``tokens`` is how many tokens the reply brings (for progress); ``max_bytes`` the most its
    reply may hold; ``check(stored)`` whether a reply read back from the store has the form
    ``parse`` gives (None: not checked); ``path`` the route it is posted to.
    """

    role: str
    body: dict
    parse: Callable[[Any], Any] = field(compare=False, repr=False)
    occurrence: int = 0
    extra: dict = field(default_factory=dict)
    tokens: int = 0
    max_bytes: int = 64 << 20
    check: Callable[[Any], bool] | None = field(default=None, compare=False, repr=False)
    path: str = "completions"  # under the client's ``/v1``; a path starting with ``/`` is from the server's root

    @property
    def key(self) -> str:
        payload: dict[str, object] = {"body": self.body, **({"extra": self.extra} if self.extra else {})}
        if self.path != "completions":
            payload["path"] = self.path
        return request_key(self.role, payload, self.occurrence)

    @property
    def record(self) -> dict:
        return {**self.body, **({"_extra": self.extra} if self.extra else {})}


@dataclass
class Ledger:
    """What an audit sent and received, and where its time went."""

    sent: dict = field(default_factory=dict)  # role -> requests sent
    from_store: int = 0
    tokens: int = 0
    retried: int = 0
    wall_seconds: float = 0.0  # inside Fetcher.fetch
    server_seconds: float = 0.0  # wall time with at least one request in flight

    def as_dict(self) -> dict:
        overhead = max(self.wall_seconds - self.server_seconds, 0.0)
        return {
            "requests_sent": dict(self.sent),
            "requests_from_store": self.from_store,
            "tokens_received": self.tokens,
            "retried": self.retried,
            "fetch_seconds": round(self.wall_seconds, 3),
            "waiting_seconds": round(self.server_seconds, 3),
            "client_overhead_seconds": round(overhead, 3),
        }


@dataclass(frozen=True)
class FetchProgress:
    """Where an audit's requests stand, as a reply arrives.

    ``what`` / ``batch_done`` / ``batch_total``: the batch being sent (e.g. "target laws");
    ``done`` / ``planned``: requests answered in the whole run (sent or read from the store) of
    the plan's upper bound (teacher-forcing requests are at most one per sample);
    ``sent`` and ``sending_seconds``: requests sent so far by this process and the wall time
    spent sending them (the rate behind the ETA); ``tokens``: tokens received.
    """

    what: str
    batch_done: int
    batch_total: int
    done: int
    planned: int
    sent: int
    sending_seconds: float
    tokens: int

    @property
    def eta_seconds(self) -> float | None:
        """At most this long for the rest of the plan at the rate so far (None before a rate is known)."""
        if self.sent == 0 or self.sending_seconds <= 0:
            return None
        return max(self.planned - self.done, 0) * self.sending_seconds / self.sent


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class TerminalProgress:
    """Progress on stderr as replies arrive: the batch, and the whole run's requests, tokens, time and ETA.

    On a terminal one line is redrawn (at most every ``redraw`` seconds); otherwise (a CI log)
    a line is written at most every ``interval`` seconds, and at the end of each batch.
    """

    def __init__(self, stream=None, *, redraw: float = 0.2, interval: float = 5.0):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = redraw if self.interactive else interval
        self._last = -float("inf")
        self.open_line = False  # a redrawn line without its newline is on the terminal

    def __call__(self, state: FetchProgress) -> None:
        now = time.monotonic()
        end_of_batch = state.batch_done >= state.batch_total
        if not end_of_batch and now - self._last < self.min_interval:
            return
        self._last = now
        share = min(state.done / max(state.planned, 1), 1.0)
        bar = "#" * int(24 * share)
        line = (
            f"[{bar:-<24}] {state.done:,} of at most {state.planned:,} requests, {state.tokens:,} tokens, "
            f"{_duration(state.sending_seconds)}"
        )
        eta = state.eta_seconds
        if eta is not None and state.done < state.planned:
            line += f", ETA at most {_duration(eta)}"
        line += f" ({state.what} {state.batch_done}/{state.batch_total})"
        if self.interactive:
            self.stream.write("\r" + line + "\033[K")
            self.open_line = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close_line(self) -> None:
        """End a redrawn line, so that what is printed next starts on its own."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()
            self.open_line = False


class Fetcher:
    """Sends requests of an audit through its store (see the module docstring).

    Parameters
    ----------
    clients : dict
        ``role -> HttpClient`` (``"decoder"``, ``"reference"``, ``"target"``).
    store : SampleStore
    concurrency : int
        Requests in flight at most.
    progress : callable, optional
        ``progress(state)`` with a :class:`FetchProgress` as replies arrive.
    planned : int
        The plan's upper bound on the run's requests (for the whole run's progress and ETA).
    """

    def __init__(self, clients: dict, store: SampleStore, *, concurrency: int = 8, progress=None, planned: int = 0):
        self.clients = clients
        self.store = store
        self.concurrency = int(concurrency)
        self.progress = progress
        self.planned = int(planned)
        self.done = 0  # requests answered in this run: sent, or read from the store
        self.sending_seconds = 0.0
        self.ledger = Ledger()
        self.failure: EndpointError | None = None
        self._in_flight = 0
        self._busy_since = 0.0
        self._lock = threading.Lock()

    def fetch(self, requests: list[Request], what: str = "requests", *, concurrency: int | None = None) -> list:
        """The parsed replies of ``requests``, in order (stored ones from the store).

        ``concurrency`` overrides the fetcher's for this batch (1: one request in flight at a time).
        """
        if self.failure is not None:
            raise self.failure
        started = time.perf_counter()
        try:
            pending: dict[str, Request] = {}
            for r in requests:
                key = r.key
                if key in self.store:
                    self._check_stored(r, key)
                elif key not in pending:
                    pending[key] = r
            self.ledger.from_store += len(requests) - len(pending)
            self.done += len(requests) - len(pending)
            if pending:
                self._send(list(pending.values()), what, concurrency or self.concurrency)
            return [self.store.get(r.key) for r in requests]
        except EndpointError as error:
            self.failure = error
            raise
        finally:
            self.ledger.wall_seconds += time.perf_counter() - started
            self.ledger.retried = sum(c.retried for c in set(self.clients.values()))  # a client may serve two roles

    def abort(self) -> None:
        """Abandon every request in flight (each client's sockets are shut down) and refuse new ones."""
        for client in set(self.clients.values()):
            client.abort()

    def _check_stored(self, request: Request, key: str) -> None:
        if self.store.roles.get(key) != request.role:
            raise EndpointError(f"{self.store.path}: the stored reply {key} belongs to another role")
        if request.check is None:
            return
        try:
            good = bool(request.check(self.store.get(key)))
        except Exception:
            good = False
        if not good:
            raise EndpointError(
                f"{self.store.path}: the stored reply {key} is not of the form its request asks for "
                "(the store was edited); use another --out"
            )

    def _send(self, pending: list[Request], what: str, concurrency: int) -> None:
        work: queue.SimpleQueue = queue.SimpleQueue()
        for request in pending:
            work.put(request)
        results: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        workers = [
            threading.Thread(target=self._worker, args=(work, results, stop), name=f"specverify-http-{i}", daemon=True)
            for i in range(min(concurrency, len(pending)))
        ]
        t0 = time.perf_counter()
        done = 0
        finished = False
        for worker in workers:
            worker.start()
        try:
            while done < len(pending):
                try:
                    request, error = results.get(timeout=0.25)
                except queue.Empty:
                    if not any(w.is_alive() for w in workers) and results.empty():
                        raise EndpointError("every worker stopped before its requests were answered") from None
                    continue
                if error is not None:
                    raise error
                done += 1
                self.done += 1
                self.ledger.sent[request.role] = self.ledger.sent.get(request.role, 0) + 1
                self.ledger.tokens += request.tokens
                if self.progress is not None:
                    sent = sum(self.ledger.sent.values())
                    elapsed = self.sending_seconds + time.perf_counter() - t0
                    self.progress(FetchProgress(what, done, len(pending), self.done, max(self.planned, self.done),
                                                sent, elapsed, self.ledger.tokens))  # fmt: skip
            finished = True
        finally:
            self.sending_seconds += time.perf_counter() - t0
            stop.set()
            if not finished:
                self.abort()
            deadline = time.monotonic() + 2.0
            for worker in workers:
                worker.join(timeout=max(deadline - time.monotonic(), 0.0))

    def _worker(self, work: queue.SimpleQueue, results: queue.SimpleQueue, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                request = work.get_nowait()
            except queue.Empty:
                return
            self._enter()
            try:
                client = self.clients[request.role]
                reply = client.post(request.path, request.body, max_bytes=request.max_bytes)
                parsed = request.parse(reply)
                del reply
                self.store.add(request.key, request.role, request.record, parsed)
            except BaseException as error:  # handed to the caller's thread, which raises it
                results.put((request, error))
                return
            finally:
                self._leave()
            results.put((request, None))

    def _enter(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.ledger.server_seconds += time.perf_counter() - self._busy_since

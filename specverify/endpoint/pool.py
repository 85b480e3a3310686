"""Sending an audit's requests: concurrent, through the sample store, with progress.

:class:`Fetcher` takes a batch of :class:`Request` s, answers those the store already holds
from the store, sends the rest concurrently (an ``asyncio`` loop, at most ``concurrency``
requests in flight, each a blocking :class:`~specverify.endpoint.http.HttpClient` call on a
worker thread), parses and stores each reply as it arrives, and returns the replies in the
batch's order.  If a request fails for good, the requests in flight are cancelled and the
error is raised; every reply already stored stays stored.

It also keeps the audit's ledger: requests sent and answered from the store, tokens received,
the wall time spent waiting on the server and the time spent on everything else (the client's
own overhead, reported).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from specverify.endpoint.store import SampleStore, request_key

__all__ = ["Request", "Fetcher", "Ledger", "TerminalProgress"]


@dataclass(frozen=True)
class Request:
    """One request of an audit: who answers it (``role``), its JSON body, how to read the reply.

    ``occurrence`` tells apart a request repeated on purpose (the same body sent again);
    ``extra`` is what else determines the stored reply (e.g. which logprob rows are kept);
    ``tokens`` is how many tokens the reply brings (for progress).
    """

    role: str
    body: dict
    parse: Callable[[Any], Any] = field(compare=False, repr=False)
    occurrence: int = 0
    extra: dict = field(default_factory=dict)
    tokens: int = 0

    @property
    def key(self) -> str:
        payload = {"body": self.body, **({"extra": self.extra} if self.extra else {})}
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


class TerminalProgress:
    """Progress on stderr as replies arrive: requests done of the batch, tokens, elapsed time, ETA.

    On a terminal one line is redrawn (at most every ``redraw`` seconds); otherwise (a CI log)
    a line is written at most every ``interval`` seconds, and the last one.
    """

    def __init__(self, stream=None, *, redraw: float = 0.2, interval: float = 5.0):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = redraw if self.interactive else interval
        self._last = -float("inf")

    def __call__(self, done: int, total: int, tokens: int, elapsed: float, what: str) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self.min_interval:
            return
        self._last = now
        bar = "#" * int(24 * done / max(total, 1))
        line = f"[{bar:-<24}] {what}: {done}/{total} requests, {tokens:,} tokens, {elapsed:.0f} s"
        if 0 < done < total:
            line += f", ETA {elapsed / done * (total - done):.0f} s"
        if self.interactive:
            self.stream.write("\r" + line + ("\n" if done >= total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


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
        ``progress(done, total, tokens, elapsed_seconds, what)`` as replies arrive.
    """

    def __init__(self, clients: dict, store: SampleStore, *, concurrency: int = 8, progress=None):
        self.clients = clients
        self.store = store
        self.concurrency = int(concurrency)
        self.progress = progress
        self.ledger = Ledger()

    def fetch(self, requests: list[Request], what: str = "requests", *, concurrency: int | None = None) -> list:
        """The parsed replies of ``requests``, in order (stored ones from the store).

        ``concurrency`` overrides the fetcher's for this batch (1: one request in flight at a time).
        """
        started = time.perf_counter()
        try:
            pending = {r.key: r for r in requests if r.key not in self.store}
            self.ledger.from_store += len(requests) - len(pending)
            if pending:
                asyncio.run(self._send(list(pending.values()), what, concurrency or self.concurrency))
            return [self.store.get(r.key) for r in requests]
        finally:
            self.ledger.wall_seconds += time.perf_counter() - started
            self.ledger.retried = sum(c.retried for c in set(self.clients.values()))  # a client may serve two roles

    async def _send(self, pending: list[Request], what: str, concurrency: int) -> None:
        loop = asyncio.get_running_loop()
        semaphore = asyncio.Semaphore(concurrency)
        in_flight = 0
        busy_since = 0.0
        done = tokens = 0
        t0 = time.perf_counter()

        async def one(request: Request) -> None:
            nonlocal in_flight, busy_since, done, tokens
            async with semaphore:
                if in_flight == 0:
                    busy_since = time.perf_counter()
                in_flight += 1
                try:
                    client = self.clients[request.role]
                    reply = await loop.run_in_executor(pool, client.post, "completions", request.body)
                finally:
                    in_flight -= 1
                    if in_flight == 0:
                        self.ledger.server_seconds += time.perf_counter() - busy_since
            parsed = request.parse(reply)
            self.store.add(request.key, request.role, request.record, parsed)
            self.ledger.sent[request.role] = self.ledger.sent.get(request.role, 0) + 1
            self.ledger.tokens += request.tokens
            done, tokens = done + 1, tokens + request.tokens
            if self.progress is not None:
                self.progress(done, len(pending), tokens, time.perf_counter() - t0, what)

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="specverify-http") as pool:
            tasks = [asyncio.ensure_future(one(r)) for r in pending]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

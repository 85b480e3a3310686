"""The resumable sample store of an endpoint audit: every request and its parsed reply, one JSON line each.

``OUT/samples.jsonl`` starts with a header line naming the audit (endpoints, model names,
sampling parameters, seed); each following line is ``{"key", "role", "request", "reply"}``.
A key is a hash of what was asked (the role, the request body and, for a request repeated on
purpose -- the determinism check sends the same seed twice -- its occurrence), so an audit
started again with the same options finds every reply it already has, sends only the rest,
and uses each reply once: nothing collected is lost or counted twice.  A last line cut short by
an interruption is ignored (and set apart before new lines are appended).  Each line is written
and closed as its reply arrives, so a killed audit loses at most the requests in flight.  A store made by an
audit with other options is refused rather than mixed in.

No API key is ever written: requests are stored as their JSON bodies, and the key travels only
in a header (:mod:`specverify.endpoint.http`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from specverify.endpoint.http import EndpointError

__all__ = ["SampleStore", "request_key", "STORE_NAME"]

STORE_NAME = "samples.jsonl"
_FORMAT = "specverify-endpoint-store/1"


def request_key(role: str, body: dict, occurrence: int = 0) -> str:
    """A stable key of one request: sha256 of ``role``, the canonical JSON body and the occurrence."""
    canonical = json.dumps({"role": role, "body": body, "occurrence": occurrence}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class SampleStore:
    """Append-only JSON-lines store of replies, keyed by :func:`request_key` (thread-safe appends).

    Parameters
    ----------
    directory : path
        Where ``samples.jsonl`` lives (created if missing).
    header : dict
        What this audit is (JSON-serialisable); must equal the header of an existing store.
    """

    def __init__(self, directory, header: dict):
        self.path = Path(directory) / STORE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.header = {"format": _FORMAT, **header}
        self.replies: dict[str, Any] = {}
        self.loaded = 0  # replies found on opening (a resumed audit)
        self.appended = 0
        self._lock = threading.Lock()
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self._write_line(self.header)

    def _load(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        if not complete:
            raise EndpointError(f"{self.path}: not a sample store (no header line); use another --out")
        try:
            header = json.loads(complete[0])
        except ValueError:
            raise EndpointError(
                f"{self.path}: not a sample store (its first line is not JSON); use another --out"
            ) from None
        if header != self.header:
            differs = sorted(k for k in set(header) | set(self.header) if header.get(k) != self.header.get(k))
            raise EndpointError(
                f"{self.path} holds the samples of another audit (differs in {', '.join(differs)}); "
                "rerun with the same options, or use another --out"
            )
        for line in complete[1:]:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by an interruption
            self.replies.setdefault(record["key"], record["reply"])
        self.loaded = len(self.replies)
        if tail.strip():  # an interrupted write: end it so the next record starts on its own line
            with open(self.path, "ab") as handle:
                handle.write(b"\n")

    def _write_line(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")

    def get(self, key: str):
        return self.replies.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.replies

    def add(self, key: str, role: str, request: dict, reply) -> None:
        """Record ``reply`` for ``key`` (the first reply of a key is kept; later ones are not written)."""
        with self._lock:
            if key in self.replies:
                return
            self._write_line({"key": key, "role": role, "request": request, "reply": reply})
            self.replies[key] = reply
            self.appended += 1

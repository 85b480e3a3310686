"""The resumable sample store of an endpoint audit: every request and its parsed reply, one checksummed JSON line each.

``OUT/samples.jsonl`` starts with a header line naming the audit (endpoints, model names,
sampling parameters, seed); each following line is ``{"key", "role", "request", "reply",
"sum"}``.  A key is a hash of what was asked (the role, the request body and, for a request
repeated on purpose -- the determinism check sends the same seed twice -- its occurrence), so an
audit started again with the same options finds every reply it already has, sends only the
rest, and uses each reply once: nothing collected is lost or counted twice.

**Integrity.**  Every line carries ``sum``, the SHA-256 of the previous line's sum and the
line's own canonical JSON: a chain from the header to the last line.  A line that was modified,
moved, duplicated or removed breaks the chain, and opening the store is refused with the number
of the first wrong line; a store made by an audit with other options, or by an older specverify
(no checksums), is refused too.  Only the end may be cut: a last line without its newline (the
audit was killed while writing it) is dropped and its request sent again; a store cut at a line
boundary reads as an audit interrupted there.  A reply that the store refuses is never used.

**One writer.**  An audit holds an exclusive lock (``samples.jsonl.lock``, holding its process
id) while it writes; a second audit of the same store is refused at once.  The lock goes with
the process, however it ends.  Each line is written and flushed as its reply arrives, so a
killed audit loses at most the requests in flight.

No API key is ever written: requests are stored as their JSON bodies, and the key travels only
in a header (:mod:`specverify.endpoint.http`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specverify.endpoint.http import EndpointError, server_text

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SampleStore",
    "StoreContents",
    "read_store",
    "parse_store",
    "request_key",
    "STORE_NAME",
    "LOCK_SUFFIX",
    "FORMAT",
]

STORE_NAME = "samples.jsonl"
LOCK_SUFFIX = ".lock"
FORMAT = "specverify-endpoint-store/2"
_OLD_FORMATS = ("specverify-endpoint-store/1",)
_RECORD_FIELDS = frozenset({"key", "role", "request", "reply", "sum"})
_HEX = re.compile(r"[0-9a-f]+")


def request_key(role: str, body: dict, occurrence: int = 0) -> str:
    """A stable key of one request: sha256 of ``role``, the canonical JSON body and the occurrence."""
    canonical = json.dumps({"role": role, "body": body, "occurrence": occurrence}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _chained(previous: str, record: dict) -> str:
    """The sum of ``record`` (without its ``sum``) after a line whose sum is ``previous``."""
    return hashlib.sha256((previous + "\n" + _canonical(record)).encode()).hexdigest()


class SampleStore:
    """Append-only, checksummed JSON-lines store of replies, keyed by :func:`request_key` (thread-safe appends).

    Parameters
    ----------
    directory : path
        Where ``samples.jsonl`` lives (created if missing).
    header : dict
        What this audit is (JSON-serialisable); must equal the header of an existing store.

    Raises
    ------
    EndpointError
        The store is another audit's, was written by an older specverify, fails its checksums
        (naming the first wrong line), or is being written by another audit now.

    Use it as a context manager, or call :meth:`close` to release the lock.
    """

    def __init__(self, directory, header: dict):
        self.path = Path(directory) / STORE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.header = {"format": FORMAT, **header}
        self.replies: dict[str, Any] = {}
        self.roles: dict[str, str] = {}
        self.loaded = 0  # replies found on opening (a resumed audit)
        self.appended = 0
        self._lock = threading.Lock()
        self._lockfile = self._acquire()
        try:
            self._handle: Any = open(self.path, "ab")
            if self._handle.tell() == 0:
                self._last = ""
                self._write(dict(self.header))
            else:
                self._load()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the lock
    def _acquire(self):
        lock_path = self.path.with_name(self.path.name + LOCK_SUFFIX)
        handle = open(lock_path, "a+", encoding="utf-8")
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read(40).strip()
                handle.close()
                who = f" (process {holder})" if holder.isdigit() else ""
                raise EndpointError(
                    f"{self.path} is being written by another audit{who}: wait for it to finish, or use another --out"
                ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        return handle

    def close(self) -> None:
        """Release the store (its file and its lock); further :meth:`add` calls are refused."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            handle.close()
        lockfile, self._lockfile = getattr(self, "_lockfile", None), None
        if lockfile is not None:
            lockfile.close()  # closing the descriptor releases the flock

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def _write(self, record: dict) -> None:
        if self._handle is None:
            raise EndpointError(f"{self.path} is closed")
        record.pop("sum", None)
        record["sum"] = _chained(self._last, record)
        self._handle.write(_canonical(record).encode() + b"\n")
        self._handle.flush()
        self._last = record["sum"]

    def get(self, key: str):
        return self.replies.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.replies

    def add(self, key: str, role: str, request: dict, reply) -> None:
        """Record ``reply`` for ``key`` (the first reply of a key is kept; later ones are not written)."""
        with self._lock:
            if key in self.replies:
                return
            self._write({"key": key, "role": role, "request": request, "reply": reply})
            self.replies[key] = reply
            self.roles[key] = role
            self.appended += 1

    # ------------------------------------------------------------------ reading
    def _load(self) -> None:
        raw = self.path.read_bytes()
        if b"\n" not in raw:
            own = dict(self.header, sum=_chained("", self.header))
            if _canonical(own).encode().startswith(raw):  # this audit's header, cut while it was written
                self._handle.truncate(0)
                self._last = ""
                self._write(dict(self.header))
                return
        contents = parse_store(raw, str(self.path))
        if contents.header != self.header:
            header = contents.header
            differs = sorted(k for k in set(header) | set(self.header) if header.get(k) != self.header.get(k))
            raise EndpointError(
                f"{self.path} holds the samples of another audit (differs in {', '.join(differs)[:200]}); "
                "rerun with the same options, or use another --out"
            )
        for key, role, reply in contents.records:
            self.replies[key] = reply
            self.roles[key] = role
        if contents.tail_complete:  # complete but for its newline
            self._handle.write(b"\n")
        elif contents.tail:  # cut short by an interruption (or whitespace): set apart, its request is sent again
            self._handle.truncate(len(raw) - len(contents.tail))
        self._handle.flush()
        self._last = contents.last_sum
        self.loaded = len(self.replies)


@dataclass(frozen=True)
class StoreContents:
    """What :func:`parse_store` read: the header, the records ``(key, role, reply)``, the end of the chain.

    ``tail`` is what followed the last newline; ``tail_complete`` whether it is a whole record
    (written but for its newline, counted among ``records``) rather than a cut one.
    """

    header: dict
    records: tuple
    last_sum: str
    tail: bytes
    tail_complete: bool


def read_store(path) -> StoreContents:
    """Read and check the store at ``path`` (a ``samples.jsonl`` file): :class:`EndpointError` if it is damaged."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise EndpointError(f"{path}: cannot be read ({error.strerror})") from None
    return parse_store(raw, str(path))


def parse_store(raw: bytes, name: str = STORE_NAME) -> StoreContents:
    """Check the bytes of a store (see the module docstring); its contents, or :class:`EndpointError` naming the wrong line."""
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]
    if not complete:
        complete, tail = [tail], b""  # judged as a header (and refused unless it is one)
    header, last = _header(complete[0], name)
    records, seen = [], set()
    for lineno, line in enumerate(complete[1:], start=2):
        record, why = _record(line, last)
        if record is None:
            raise _refused(name, lineno, why)
        if record["key"] in seen:
            raise _refused(name, lineno, f"a second reply for key {record['key']}")
        seen.add(record["key"])
        records.append((record["key"], record["role"], record["reply"]))
        last = record["sum"]
    tail_complete = False
    if tail.strip():
        record, _ = _record(tail, last)
        if record is not None and record["key"] not in seen:
            records.append((record["key"], record["role"], record["reply"]))
            last, tail_complete = record["sum"], True
    return StoreContents(header, tuple(records), last, tail, tail_complete)


def _refused(name: str, lineno: int, why: str) -> EndpointError:
    return EndpointError(
        f"{name}:{lineno}: {why}: the store was modified, reordered or damaged after it was written "
        "(its replies are not used); use another --out, or remove the file to start over"
    )


def _header(line: bytes, name: str) -> tuple[dict, str]:
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or not isinstance(header.get("format"), str):
        raise EndpointError(f"{name} is not a sample store (its first line is not a store header); use another --out")
    if header["format"] in _OLD_FORMATS:
        raise EndpointError(
            f"{name} was written by an earlier specverify ({header['format']}, without checksums): it cannot "
            "be checked, so it is not resumed; use another --out"
        )
    if header["format"] != FORMAT:
        shown = server_text(header["format"], limit=60)
        raise EndpointError(f"{name} is a store of format {shown!r}, not {FORMAT}; use another --out")
    total = header.pop("sum", None)
    try:
        expected = _chained("", header)
    except (TypeError, ValueError):
        expected = None
    if not isinstance(total, str) or total != expected:
        raise _refused(name, 1, "the header's checksum does not match")
    return header, total


def _record(line: bytes, previous: str) -> tuple[dict | None, str]:
    """The record of one line after a line whose sum is ``previous``, or None and why it is wrong."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None, "not a JSON line"
    if not isinstance(record, dict) or set(record) != _RECORD_FIELDS:
        return None, "not a store record"
    total = record.get("sum")
    if not isinstance(total, str) or len(total) != 64 or not _HEX.fullmatch(total):
        return None, "no checksum"
    if not isinstance(record["key"], str) or not isinstance(record["role"], str):
        return None, "not a store record"
    body = {k: v for k, v in record.items() if k != "sum"}
    try:
        expected = _chained(previous, body)
    except (TypeError, ValueError):  # NaN or Infinity in the line: never written by a store
        return None, "not a store record"
    if total != expected:
        return None, "its checksum does not match (the line, or the order of lines, changed)"
    return record, ""

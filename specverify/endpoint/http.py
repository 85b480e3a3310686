"""JSON over HTTP for long audits against a server: TLS verified, retries with backoff, the key from the environment.

:class:`HttpClient` posts and gets JSON with the standard library (``urllib``): one call per
request, safe to share between threads.  Transient failures -- HTTP 408, 429 and 5xx, timeouts,
refused or reset connections -- are retried with exponential backoff (``Retry-After`` honoured);
anything else, and a transient failure that outlasts the retries, is an :class:`EndpointError`
of one line that says what the server did.  The API key is read from an environment variable
at every request and sent only in the ``Authorization`` header: it is never stored on the client,
written to the sample store, or recorded in a report or command.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from specverify.core.errors import SpecVerifyError

__all__ = ["EndpointError", "HttpClient", "RETRY_STATUS", "DEFAULT_KEY_ENV"]

#: HTTP statuses retried with backoff: request timeout, rate limit, server errors.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: The environment variable an API key is read from unless another is named.
DEFAULT_KEY_ENV = "SPECVERIFY_API_KEY"


class EndpointError(SpecVerifyError):
    """A server could not be audited: unreachable, refused the request, or answered what the audit cannot use.

    ``status`` is the HTTP status when there was one; ``body`` the server's message.
    """

    def __init__(self, message: str, *, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body


def server_message(raw: bytes) -> str:
    """The error text of a server's reply: ``error.message`` / ``message`` / ``detail`` of JSON, else the text."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:300]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str):
                    return " ".join(error[key].split())[:500]
        if isinstance(error, str):
            return " ".join(error.split())[:500]
        if isinstance(data.get("detail"), str):
            return " ".join(data["detail"].split())[:500]
    return " ".join(text.split())[:300]


class HttpClient:
    """A JSON client of one server.

    Parameters
    ----------
    base_url : str
        ``http(s)://host:port`` with or without the ``/v1`` suffix (paths are joined to it).
    key_env : str
        Environment variable holding the API key (sent as ``Authorization: Bearer``); unset:
        no header.
    timeout : float
        Seconds for one request (connect and read).
    retries : int
        Transient failures retried this many times (backoff 0.5 s, doubling, at most 30 s).
    verify_tls : bool
        Verify the server's certificate (default True).
    """

    def __init__(
        self,
        base_url: str,
        *,
        key_env: str = DEFAULT_KEY_ENV,
        timeout: float = 120.0,
        retries: int = 6,
        verify_tls: bool = True,
        sleep=time.sleep,
    ):
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise EndpointError(f"endpoint must be an http(s)://host[:port] URL, got {base_url!r}")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.key_env = key_env
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.context = ssl.create_default_context() if verify_tls else ssl._create_unverified_context()
        self._sleep = sleep
        self.retried = 0  # transient failures retried so far (all threads)

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def post(self, path: str, body: dict) -> Any:
        """POST ``body`` as JSON to ``path``; the decoded JSON reply."""
        return self._request("POST", path, json.dumps(body).encode())

    def get(self, path: str, *, retries: int | None = None) -> Any:
        """GET ``path``; ``retries`` overrides the client's (a first contact should fail fast)."""
        return self._request("GET", path, None, retries)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _request(self, method: str, path: str, data: bytes | None, retries: int | None = None) -> Any:
        url = self.url(path)
        retries = self.retries if retries is None else retries
        delay = 0.5
        for attempt in range(retries + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=self._headers())
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as reply:
                    raw = reply.read()
                    status = reply.status
            except urllib.error.HTTPError as error:
                raw, status = error.read(), error.code
                if status in RETRY_STATUS and attempt < retries:
                    self._wait(delay, error.headers.get("Retry-After"))
                    delay = min(2 * delay, 30.0)
                    continue
                raise EndpointError(
                    f"{method} {url}: HTTP {status}: {server_message(raw)}", status=status, body=server_message(raw)
                ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                reason = getattr(error, "reason", error)
                if attempt < retries:
                    self._wait(delay, None)
                    delay = min(2 * delay, 30.0)
                    continue
                raise EndpointError(f"{method} {url}: unreachable after {retries + 1} attempts ({reason})") from None
            try:
                return json.loads(raw)
            except ValueError:
                snippet = " ".join(raw.decode("utf-8", "replace").split())[:80]
                raise EndpointError(
                    f"{method} {url}: HTTP {status} with a reply that is not JSON: {snippet!r}", status=status
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, delay: float, retry_after: str | None) -> None:
        self.retried += 1
        try:
            wait = float(retry_after) if retry_after else delay
        except ValueError:
            wait = delay
        self._sleep(min(max(wait, 0.0), 60.0))

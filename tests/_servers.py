"""Local completions servers as processes (``python -m specverify.endpoint.localserver``), for endpoint tests."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.request

_UNVERIFIED = ssl._create_unverified_context()  # the tests' own look at a server they started (self-signed TLS)


class Server:
    """A local completions server process on 127.0.0.1; ``url`` (``.../v1``) and ``root`` once it serves."""

    def __init__(self, *options: str, env: dict | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "specverify.endpoint.localserver", "--port", "0", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.process.stdout.readline()
        if not line.startswith("serving "):
            self.process.kill()
            raise RuntimeError(f"the local server did not start: {line!r} {self.process.stderr.read()}")
        self.url = line.split()[1]
        self.banner = line.strip()
        self.root = self.url[: -len("/v1")]

    def hostile(self, kind: str, after: int = 0, run: str = "0") -> str:
        """The base URL at which this server plays misbehaviour ``kind`` after ``after`` good replies."""
        return f"{self.root}/hostile/{kind}/{after}/{run}/v1"

    def log(self) -> dict:
        """The Authorization headers the origin and the collector received (``GET /hostile/log``)."""
        with urllib.request.urlopen(self.root + "/hostile/log", timeout=10, context=_UNVERIFIED) as reply:
            return json.loads(reply.read())

    def heal(self, run: str) -> None:
        """End the misbehaviour of ``run``: later requests on its path are answered well."""
        request = urllib.request.Request(self.root + f"/hostile/heal/{run}", data=b"{}", method="POST")
        urllib.request.urlopen(request, timeout=10, context=_UNVERIFIED).read()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

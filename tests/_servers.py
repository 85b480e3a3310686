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


class DirectFetcher:
    """A fetcher that sends each request at once with one client and reads the reply (no store);
    ``replies(body)``, when given, answers instead of a server.  ``bodies`` holds what was sent."""

    def __init__(self, client, replies=None):
        self.client, self.replies, self.bodies = client, replies, []

    def fetch(self, requests, what=""):
        out = []
        for r in requests:
            self.bodies.append(r.body)
            reply = self.replies(r.body) if self.replies else self.client.post(r.path, r.body)
            out.append(r.parse(reply))
        return out


def logprob_entry(values: dict) -> dict:
    """One position of vLLM's ``prompt_logprobs``: token id -> {"logprob", "rank", "decoded_token"}."""
    return {str(t): {"logprob": v, "rank": 0, "decoded_token": str(t)} for t, v in values.items()}


def fixed_law_replies(full):
    """Teacher-forcing replies of a server whose law after every prefix is ``full`` (V,) log-probabilities:
    the top ``prompt_logprobs`` tokens and the prompt token's own (the whole vocabulary for -1)."""

    def replies(body):
        prompt, top = body["prompt"], body["prompt_logprobs"]
        entries: list = [None]
        for i in range(1, len(prompt)):
            listed = range(len(full)) if top == -1 else dict.fromkeys([*range(top), prompt[i]])
            entries.append(logprob_entry({t: float(full[t]) for t in listed}))
        return {"choices": [{"index": 0, "prompt_logprobs": entries}]}

    return replies

"""llama-server reports logprob 0.0 (probability 1) for every token its speculative verification step emits.

Standalone (standard library only; no specverify)::

    python reports/llama-server/repro_speculative_logprobs_zero.py [--binary llama-server] [--model T.gguf --draft D.gguf]

Starts ``llama-server`` twice on the same target, without speculation and with a draft model
(``-md D.gguf --spec-type draft-simple --spec-draft-n-max 3``), sends both the same seeded request on
the native ``/completion`` (token-id prompt, ``n_predict`` 24, T = 1, every cut off, ``n_probs`` 3,
``post_sampling_probs`` false: each token's raw logprob and its 3 most likely tokens') and compares.
Speculation is sample-and-match, so the two continuations are the same tokens; their reported
logprobs should be too.  They are not: with speculation, every token emitted by a verification step
(accepted drafts and the target's own correction alike) is reported at logprob 0.0 with an empty top
list; only tokens sampled outside that step (the first, from the prompt) are right.  Here 22 of 24.
Exit 1 when that happens, 0 when the logprobs agree.

Install: a ``llama-server`` binary (``pip install cmake ninja`` and build llama.cpp's ``llama-server``
target, as ``python -m tools.reports.llamaserver_build`` does) and Python 3.8+; nothing else.

Expected output (the tiny pair, llama.cpp 0c1e570)::

    drafted: 51 accepted: 5
    same tokens: True
     i token  logprob (no speculation)  logprob (speculation)  top entries
     0     9                 -2.304959              -2.304959  3 / 3
     1    20                 -0.438149               0.000000  3 / 0  <- wrong
    ...
    23    10                 -0.766158              -0.766151  3 / 3
    22 of 24 tokens reported otherwise with speculation

Any GGUF target and draft with one vocabulary work; the default paths are the tiny seeded pair the
report generator writes (``python -m tools.reports.llamaserver_served`` in the checkout, into
``build/llamaserver_served/models``).  Seen at llama.cpp commit 0c1e570 (llama-cpp-python 0.3.36's
vendored source); upstream: ggml-org/llama.cpp#27972 (open), PR #27196 (open).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request

MODELS = "build/llamaserver_served/models/llamacpp-tiny-llama-s0-n0.5"
BODY = {"prompt": [28, 31, 8, 31], "n_predict": 24, "seed": 7, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "min_p": 0.0, "n_probs": 3, "post_sampling_probs": False, "ignore_eos": True, "return_tokens": True}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def complete(argv: list[str]) -> dict:
    port = free_port()
    server = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-t", "1", "--no-webui"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(BODY).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        return json.loads(urllib.request.urlopen(request, timeout=60).read())
    finally:
        server.terminate()
        server.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default="llama-server")
    parser.add_argument("--model", default=f"{MODELS}/target.gguf")
    parser.add_argument("--draft", default=f"{MODELS}/draft.gguf")
    args = parser.parse_args()
    plain = complete([args.binary, "-m", args.model])
    spec = complete([args.binary, "-m", args.model, "-md", args.draft, "--spec-type", "draft-simple",
                     "--spec-draft-n-max", "3", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"])  # fmt: skip
    print("drafted:", spec.get("timings", {}).get("draft_n"), "accepted:", spec.get("timings", {}).get("draft_n_accepted"))
    print("same tokens:", plain["tokens"] == spec["tokens"])
    bad = 0
    print(" i token  logprob (no speculation)  logprob (speculation)  top entries")
    for i, (a, b) in enumerate(zip(plain["completion_probabilities"], spec["completion_probabilities"])):
        wrong = abs(a["logprob"] - b["logprob"]) > 1e-3 or len(a["top_logprobs"]) != len(b["top_logprobs"])
        bad += wrong
        print(f"{i:2d} {a['id']:5d}  {a['logprob']:24.6f}  {b['logprob']:21.6f}  {len(a['top_logprobs'])} / "
              f"{len(b['top_logprobs'])}{'  <- wrong' if wrong else ''}")  # fmt: skip
    print(f"{bad} of {len(plain['completion_probabilities'])} tokens reported otherwise with speculation")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""One request for more top logprobs than the vocabulary stops an SGLang server.

Standalone (no specverify; the standard library only).  Start any SGLang server (``pip install
sglang==0.5.23``; on a CPU without AMX as in reports/sglang/README.md), then:

    python repro_top_logprobs_over_vocab.py --url http://127.0.0.1:30000 --vocab-size 32000

It sends ``POST /generate`` with ``top_logprobs_num`` = the vocabulary size (answered), then one with the
vocabulary size + 1, then checks that the server still answers.  Exit 1 when it does not.  Expected output
with SGLang 0.5.23 (the server logs ``RuntimeError: selected index k out of range`` from ``logprobs.topk`` in
``sglang/srt/layers/logprob_processor.py`` and exits; seen on the tiny V = 32 model of reports/sglang):

    top_logprobs_num = V: answered
    top_logprobs_num = V + 1: no answer (RemoteDisconnected('Remote end closed connection without response'))
    FAULT: the server no longer answers (URLError(ConnectionRefusedError(111, 'Connection refused')))
"""

import argparse
import json
import sys
import time
import urllib.request


def generate(url: str, top: int) -> dict:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
            "return_logprob": True, "top_logprobs_num": top, "logprob_start_len": 0}  # fmt: skip
    request = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--vocab-size", type=int, required=True)
    args = parser.parse_args()
    generate(args.url, args.vocab_size)
    print("top_logprobs_num = V: answered")
    try:
        generate(args.url, args.vocab_size + 1)
        print("top_logprobs_num = V + 1: answered")
    except OSError as error:
        print(f"top_logprobs_num = V + 1: no answer ({error!r})")
    time.sleep(5)
    try:
        generate(args.url, 1)
    except OSError as error:
        print(f"FAULT: the server no longer answers ({error!r})")
        return 1
    print("the server still answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

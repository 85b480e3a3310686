"""Acceptance counts of vLLM's EAGLE speculation on the tiny seeded target (the heads of the EAGLE reports).

Builds ``LLM(..., speculative_config={"method": "eagle", ...}, disable_log_stats=False)`` on
:func:`specverify.adapters.fixtures.llama.save_tiny_models`' target with the head of
:func:`specverify.adapters.fixtures.eagle_head.save_tiny_eagle` (``expand_batch_to_tokens`` patched as in
the ``patch_expand`` reports), generates 200 seeded samples of 8 tokens at temperature 1 from the
reports' first prompt, and prints vLLM's own ``vllm:spec_decode_*`` counters.  One engine per
process: ``python reports/vllm/eagle_acceptance.py {greedy|probabilistic} [fc_bias]``.

A measurement of the reports' own models, not a failure repro: it imports specverify to rebuild
them exactly, so it runs in the vLLM virtualenv of ``reports/vllm/README.md`` (whose install line
ends with ``pip install -e .``).  Finding 5's engine-only repro is ``repro_eagle_bias_uninitialized.py``.
"""

import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch
from vllm import LLM, SamplingParams
from vllm.v1.sample import rejection_sampler

from specverify.adapters.fixtures.eagle_head import save_tiny_eagle
from specverify.adapters.fixtures.llama import save_tiny_models
from specverify.adapters.vllm.layout import expand_to_tokens

rejection_sampler.expand_batch_to_tokens = expand_to_tokens  # the patch_expand diagnostic
method = sys.argv[1] if len(sys.argv) > 1 else "greedy"
fc_bias = "fc_bias" in sys.argv[2:]
target_dir, _ = save_tiny_models(seed=0)
spec = dict(method="eagle", model=str(save_tiny_eagle(seed=0, fc_bias=fc_bias)), num_speculative_tokens=3)
llm = LLM(
    model=str(target_dir), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
    gpu_memory_utilization=0.3, max_model_len=128, seed=0, disable_log_stats=False,
    speculative_config=spec | {"draft_sample_method": method},
)  # fmt: skip
params = [SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, seed=i, detokenize=False) for i in range(200)]
with torch.random.fork_rng(devices=[]):
    torch.default_generator.manual_seed(0)  # the probabilistic drafter draws from the global generator
    llm.generate([{"prompt_token_ids": [28, 31, 8, 31]}] * 200, params, use_tqdm=False)
counts = {m.name.split(":")[1]: getattr(m, "value", None) or getattr(m, "values", None) for m in llm.get_metrics()}
drafts, tokens, accepted = (counts[f"spec_decode_num_{k}"] for k in ("drafts", "draft_tokens", "accepted_tokens"))
per_pos = counts["spec_decode_num_accepted_tokens_per_pos"]
print(f"EAGLE draft_sample_method={method} fc_bias={fc_bias}, K=3, T=1: {drafts} drafts, {accepted} of {tokens} "
      f"draft tokens accepted ({accepted / tokens:.1%}); accepted per position {per_pos} "
      f"(first position {per_pos[0] / drafts:.1%})")  # fmt: skip

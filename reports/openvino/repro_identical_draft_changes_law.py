"""OpenVINO GenAI: speculative sampling with a draft identical to the target changes the output law.

With draft_model = the target itself (q = p) the canonical rule accepts every draft, so the output
must follow the target's law exactly.  It does not: over 2000 seeds (rng_seed = 0..1999; do_sample,
temperature 1, num_assistant_tokens=1, 3 new tokens) the 2nd generated token's law is far from
its exact law sum_a p(a | prompt) p(. | prompt, a), computed here in float64 from the same
weights; the same pipeline without draft_model is the control.  Cause (src/cpp/src/sampling/
sampler.cpp, validate_candidate): a draft d is accepted iff U{0,..,100}/100 <= q(d) / p(x), with x
an independent target sample, and after a rejection the emitted token is sampled from the *next*
position's logits (conditioned on the rejected d), not from the residual max(p - q, 0).

Self-contained: a tiny seeded Llama (V = 32) is built from a config and exported by optimum-intel
into a temporary directory (offline, no download); it needs no other project.  About 20 s on 2 CPU cores.

Run, from any directory:
    python -m venv venv && venv/bin/pip install 'openvino-genai==2026.4.*' 'optimum-intel[openvino]==2.2.*' \
        torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_identical_draft_changes_law.py
(Without PyTorch's CPU index pip takes PyPI's CUDA torchvision, which cannot load next to the +cpu
torch and breaks the export: `venv/bin/pip uninstall -y torchvision` first.)

Expected output (openvino-genai 2026.4.1, x86-64 CPU; exit status 1; the exporter's warnings omitted):
    openvino-genai 2026.4.1.0-3408-ab01d1771e4, no draft (control): token 2 over 2000 seeds: TV 0.047 to the exact law, chi2 28.9, p = 0.18
    openvino-genai 2026.4.1.0-3408-ab01d1771e4, draft = target: token 2 over 2000 seeds: TV 0.373 to the exact law, chi2 1.96e+03, p = 0
    expected: both runs follow the exact law (p > 1e-6); observed: the draft run does not -> BUG
"""

import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ovg
import torch
from optimum.exporters.openvino import main_export
from optimum.intel import OVConfig
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

V, PROMPT, N = 32, [1, 2, 3, 4], 2000
config = LlamaConfig(
    vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
    pad_token_id=None, tie_word_embeddings=False,
)  # fmt: skip
torch.manual_seed(0)
target = LlamaForCausalLM(config).eval()
with torch.no_grad():
    target.lm_head.weight.mul_(15.0)  # peaked next-token laws
root = Path(tempfile.mkdtemp())
target.save_pretrained(root / "hf")
# the pipeline needs the converted OpenVINO tokenizer in the model directory, even for token-id prompts
main_export(
    str(root / "hf"), output=root / "ov", task="text-generation-with-past", ov_config=OVConfig(dtype="fp32"),
    stateful=True, convert_tokenizer=True, library_name="transformers",
)  # fmt: skip

with torch.no_grad():  # the exact law of token 2, in float64
    exact64 = copy.deepcopy(target).double()
    p1 = exact64(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)  # (V,)
    p2 = exact64(torch.tensor([PROMPT + [a] for a in range(V)])).logits[:, -1].softmax(-1)  # (V, V)
    exact = (p1[:, None] * p2).sum(0).numpy()  # (V,)

scheduler = ovg.SchedulerConfig()
scheduler.enable_prefix_caching = False
scheduler.cache_size = 1
f32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}  # the CPU plugin's bf16 default changes the law
ids = ov.Tensor(np.array([PROMPT], dtype=np.int64))  # (1, T)
pvalues = {}
for label, draft in (
    ("no draft (control)", {}),
    ("draft = target", {"draft_model": ovg.draft_model(str(root / "ov"), "CPU", **f32)}),
):
    pipe = ovg.LLMPipeline(str(root / "ov"), "CPU", scheduler_config=scheduler, **f32, **draft)
    counts = np.zeros(V)
    for seed in range(N):
        gen = ovg.GenerationConfig(do_sample=True, max_new_tokens=3, ignore_eos=True, rng_seed=seed)
        if draft:
            gen.num_assistant_tokens = 1
        counts[pipe.generate(ids, gen).tokens[0][1]] += 1
    keep = exact * N >= 5  # pool the rare tokens into one cell
    stat, pvalues[label] = chisquare(
        np.append(counts[keep], counts[~keep].sum()), np.append(exact[keep], exact[~keep].sum()) * N
    )
    tv = 0.5 * np.abs(counts / N - exact).sum()
    print(f"openvino-genai {ovg.__version__}, {label}: token 2 over {N} seeds: TV {tv:.3f} to the exact law, "
          f"chi2 {stat:.3g}, p = {pvalues[label]:.2g}")  # fmt: skip
bug = pvalues["draft = target"] < 1e-6 <= pvalues["no draft (control)"]
print("expected: both runs follow the exact law (p > 1e-6); observed: "
      + ("the draft run does not -> BUG" if bug else "no deviation"))  # fmt: skip
sys.exit(1 if bug else 0)

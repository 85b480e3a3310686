"""transformers' speculative sampling raises when a rejected position's float32 residual (p - q)+ is all zero.

On rejection ``_speculative_sampling`` (transformers/generation/utils.py) computes
``p' = clamp(p - q, min=0)`` and divides it by ``p'.sum()`` with no zero check (the
``assistant_ensemble_weight`` path has one, the lossless path does not): an all-zero residual
gives 0/0 = NaN and ``torch.multinomial`` raises RuntimeError, so assisted generation crashes.
In exact arithmetic this cannot happen: a rejection needs p(x) < q(x), and sum p = sum q = 1
then forces p(y) > q(y) somewhere.  In float32 it happens whenever p <= q elementwise while
p(x) < q(x) at the draft:

A. both laws peaked: p(a) and q(a) round to exactly 1.0 while q keeps a tiny tail mass; a tail
   draft x (probability q(x) ~ 1e-9) is rejected with probability 1 - p(x)/q(x).  The exact
   residual, computed here in float64, is a point mass on token a; the kernel raises instead.
B. p and q equal up to float32 rounding (logits l and l + c, or a target used as its own
   assistant): the residual is rounding noise, all zero in a sizeable fraction of rows.

p(x) = q(x) = 0 alone is harmless: the draft was sampled from q, so q(x) > 0 in ``generate``.

Install (a virtualenv without specverify):
    pip install torch==2.13.0 transformers==5.24.0
Run:
    python repro_zero_residual_nan.py
Expected output (transformers 5.24.0; exit status 1):
    transformers 5.24.0, torch 2.13.0+cpu
    A: q = [1.0, 1.0235378100631465e-09], p = [1.0, 1.0261879540562902e-10] (float32); draft = token 1, K = 1
       float32 residual (p - q)+ = [0.0, 0.0]; float64 residual law = [1.0, 0.0]
       expected: token 0 after a rejection (the float64 residual law)
       seeded torch.manual_seed(0): RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
       rand_like -> 0.5: RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
       P(crash | draft = tail token) = 1 - p(x)/q(x) = 0.900; P(draft = tail token) = q(x) = 1.02e-09
    B: 2795/20000 random V=32 rows with p = q mathematically have an all-zero float32 residual; mean crash probability per K=1 verification over all rows = 2.48e-09
    BUG: the kernel raised where the exact law has a residual (exit 1)
Exit status 0 means the kernel emitted the float64 residual's token in case A (the bug is gone).
"""

import contextlib
import sys
from unittest import mock

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
crashed = 0

# ---- A: peaked laws, V = 2, K = 1
draft_logits = torch.tensor([[[0.0, -20.7]]])  # q = [1.0, 1.02e-9] in float32
target_logits = torch.tensor([[[0.0, -23.0], [0.0, 0.0]]])  # p_1 = [1.0, 1.03e-10]; p_2 = bonus row
q, p = draft_logits.softmax(-1)[0, 0], target_logits.softmax(-1)[0, 0]
exact = (target_logits[0, 0].double().softmax(-1) - draft_logits[0, 0].double().softmax(-1)).clamp(min=0)
exact = exact / exact.sum()  # float64: p(1) - q(1) < 0 and p(0) - q(0) = q(1) - p(1) > 0
print(f"A: q = {q.tolist()}, p = {p.tolist()} (float32); draft = token 1, K = 1")
print(f"   float32 residual (p - q)+ = {(p - q).clamp(min=0).tolist()}; float64 residual law = {exact.tolist()}")
print(f"   expected: token {int(exact.argmax())} after a rejection (the float64 residual law)")
candidate_input_ids = torch.tensor([[5, 1]])  # prompt token 5, draft token 1 (the tail token)
half = mock.patch.object(torch, "rand_like", lambda t, **kw: torch.full_like(t, 0.5))  # forces the rejection
for label, uniform in (("seeded torch.manual_seed(0)", contextlib.nullcontext()), ("rand_like -> 0.5", half)):
    torch.manual_seed(0)
    try:
        with uniform:
            tokens, n_matches = _speculative_sampling(candidate_input_ids, draft_logits, 1, target_logits)
        print(f"   {label}: n_matches={int(n_matches)}, emitted {tokens[0].tolist()}")
    except RuntimeError as exc:
        crashed += 1
        print(f"   {label}: RuntimeError: {exc}")
print(
    f"   P(crash | draft = tail token) = 1 - p(x)/q(x) = {1 - float(p[1] / q[1]):.3f}; "
    f"P(draft = tail token) = q(x) = {float(q[1]):.3g}"
)

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
print(
    f"B: {zero_rows}/{rows} random V=32 rows with p = q mathematically have an all-zero float32 residual; "
    f"mean crash probability per K=1 verification over all rows = {crash / rows:.3g}"
)
if crashed:
    print("BUG: the kernel raised where the exact law has a residual (exit 1)")
    sys.exit(1)
print("fixed: the kernel sampled after every rejection")

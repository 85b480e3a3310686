"""Findings of reading transformers' ``_speculative_sampling`` and the scripts that demonstrate them.

Both are far too rare for a statistical battery to observe (probabilities ~1e-8 per draft), so
the HF audit (:mod:`specverify.cli.examples.hf`) writes each script next to its reports, runs it
in-process (:func:`run_repro`) and quotes its output in the generated README.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

import torch

__all__ = ["FINDINGS", "REPRO_SCRIPTS", "run_repro"]

#: (script file name, title, explanation) of every finding, in README order.
FINDINGS = (
    (
        "repro_zero_uniform_support.py",
        "Zero uniform accepts a forbidden draft (support violation, ~2**-24 per draft with p(x) = 0)",
        "`_speculative_sampling` accepts draft token x iff `r <= p(x)/q(x)` with `r = torch.rand_like(...)` in "
        "float32. For a draft the target forbids (p(x) = 0 < q(x), e.g. a token outside the target's top-k / top-p "
        "set that the assistant proposes) the ratio is 0 and the draft is accepted iff r == 0 exactly. A float32 "
        "`torch.rand` on CPU is a multiple of 2**-24 in [0, 1), so this happens with probability 2**-24 ~ 5.96e-8 "
        "per such draft: an emitted token with target probability 0 at a rate of 2**-24 times the assistant's mass "
        "outside the target's support, per drafted position (e.g. one per ~1.7e8 drafted positions when that mass is "
        "0.1). The canonical rule `u * q(x) < p(x)` (strict) never does. Far too rare for a statistical battery to "
        "observe; found by reading the code and demonstrated "
        "deterministically by forcing r = 0:",
    ),
    (
        "repro_zero_residual_nan.py",
        "All-zero float32 residual on rejection: 0/0 = NaN and `torch.multinomial` raises",
        "On rejection the kernel divides `clamp(p - q, min=0)` by its sum without a zero check (the ensemble "
        "path has one, the lossless path does not). In exact arithmetic a rejection needs p(x) < q(x), which forces "
        "p(y) > q(y) for some y, so the residual has positive mass; in float32 the residual is all zero whenever "
        "p <= q elementwise at the rejected position. Two ways this happens: (A) both laws so peaked that p(a) and "
        "q(a) round to exactly 1.0 while q keeps a tiny tail, and the assistant drafts a tail token x with "
        "p(x) < q(x) (probability ~q(x) per position, then rejected with probability 1 - p(x)/q(x)); the exact "
        "answer is token a, the kernel raises `RuntimeError` and `generate` crashes; (B) p and q equal up to float32 "
        "rounding (e.g. the same logits up to an additive constant, as in the demonstration). p(x) = q(x) = 0 alone "
        "cannot trigger it in `generate` (the draft is sampled from q, so q(x) > 0). Probabilities are ~1e-9 per "
        "verification, so not observable statistically; demonstrated deterministically:",
    ),
)

REPRO_SCRIPTS = {
    "repro_zero_uniform_support.py": r'''"""transformers' _speculative_sampling accepts a draft token that has target probability 0 when its uniform is 0.

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
''',
    "repro_zero_residual_nan.py": r'''"""transformers' _speculative_sampling raises when a rejected position's float32 residual (p - q)+ is all zero.

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
''',
}


def run_repro(path: Path) -> str:
    """Run a reproducer script in-process (global RNG, threads and argv restored); return its output."""
    buffer = io.StringIO()
    argv, threads = sys.argv, torch.get_num_threads()
    try:
        sys.argv = [str(path)]
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(buffer):
            runpy.run_path(str(path), run_name="__main__")
    except Exception as exc:  # a reproducer that stops reproducing is reported, not fatal
        buffer.write(f"[the script raised {type(exc).__name__}: {exc}]\n")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
    return buffer.getvalue()

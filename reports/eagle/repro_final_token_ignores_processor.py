"""EAGLE (eagle-llm 1.2.1) draws the bonus token from the raw target logits: temperature, top-k and top-p ignored.

When every depth of the draft tree is accepted (or the accepted node is a leaf),
``eagle.model.utils.evaluate_posterior`` returns ``softmax(logits[best_candidate, accept_length - 1])``
-- the raw logits, without ``logits_processor`` -- and ``update_inference_inputs`` samples the
bonus token from it, while every accept / residual step uses the processed law.  Smallest
configuration: one draft node, always accepted (its draft law is a point mass on the token).
The script computes the processed law of the bonus position in float64 (what the target
samples without speculation) and compares it with the law EAGLE returns, for ``top_k=1``
(only the argmax allowed) and for ``temperature=0.7``; then draws 2000 bonus tokens under
``top_k=1``.  No model is needed: the inputs are the tensors ``evaluate_posterior`` takes.

Install (a virtualenv without specverify; eagle-llm's own pins are old and not needed by
``eagle.model.utils``, which imports only torch and transformers):
    pip install torch==2.13.0 transformers==5.24.0 && pip install --no-deps eagle-llm==1.2.1
Run:
    python repro_final_token_ignores_processor.py
Expected output (eagle-llm 1.2.1; exit status 1):
    eagle-llm 1.2.1, transformers 5.24.0, torch 2.13.0+cpu
    top_k=1: expected bonus law (float64) [1.0, 0.0, 0.0]
             observed sample_p            [0.665, 0.245, 0.09]  TV 0.335 -> BUG
    temperature=0.7: expected bonus law (float64) [0.771, 0.185, 0.044]
             observed sample_p            [0.665, 0.245, 0.09]  TV 0.106 -> BUG
    top_k=1, 2000 bonus draws: {0: 1313, 1: 492, 2: 195}; expected {0: 2000} (tokens 1, 2 are cut by top_k)
    BUG: the bonus token ignores the logits processor (exit 1)
Exit status 0 means the bonus law equals the processed law (fixed on EAGLE's main branch in 2025;
no PyPI release after 1.2.1 has it).
"""

import random
import sys
from collections import Counter
from importlib.metadata import version

import torch
import transformers
from eagle.model.utils import evaluate_posterior, prepare_logits_processor

print(f"eagle-llm {version('eagle-llm')}, transformers {transformers.__version__}, torch {torch.__version__}")
random.seed(0)
torch.manual_seed(0)
logits = torch.tensor([[[5.0, 0.0, 0.0], [2.0, 1.0, 0.0]]])  # (paths 1, depth+1 2, V 3): root row, then the bonus row
candidates = torch.tensor([[9, 0]])  # root token (unread), draft token 0 = the root's argmax
cart_prob = torch.tensor([[1.0, 1.0]])  # the draft law was a point mass on token 0: accepted with probability 1
op = [torch.tensor([[1.0, 0.0, 0.0]])]


def posterior(processor):
    best, accept_length, sample_p = evaluate_posterior(
        logits, candidates, processor, cart_prob, op, [[-1, 0]], candidates[:, :1], [[[], []]]
    )
    assert accept_length == 1, "the draft should have been accepted"
    return sample_p


def exact_bonus_law(temperature: float, top_k: int) -> torch.Tensor:
    """The target's processed law at the bonus position, in float64: softmax(top-k(logits) / T)."""
    row = logits[0, 1].double() / temperature
    if top_k:
        row = torch.where(row >= row.topk(top_k).values[-1], row, float("-inf"))
    return row.softmax(-1)


bug = False
for label, temperature, top_k in (("top_k=1", 1.0, 1), ("temperature=0.7", 0.7, 0)):
    expected = exact_bonus_law(temperature, top_k)
    observed = posterior(prepare_logits_processor(temperature=temperature, top_k=top_k)).double()
    tv = 0.5 * float((observed - expected).abs().sum())
    bug |= tv > 1e-6
    print(f"{label}: expected bonus law (float64) {[round(x, 3) for x in expected.tolist()]}")
    print(f"{' ' * len(label)}  observed sample_p            {[round(x, 3) for x in observed.tolist()]}  TV {tv:.3f}"
          f" -> {'BUG' if tv > 1e-6 else 'ok'}")

processor = prepare_logits_processor(temperature=1.0, top_k=1)
counts = Counter(int(torch.multinomial(posterior(processor), 1)) for _ in range(2000))  # update_inference_inputs' draw
print(f"top_k=1, 2000 bonus draws: {dict(sorted(counts.items()))}; expected {{0: 2000}} (tokens 1, 2 are cut by top_k)")
if bug or set(counts) != {0}:
    print("BUG: the bonus token ignores the logits processor (exit 1)")
    sys.exit(1)
print("fixed: the bonus token follows the processed law")

"""EAGLE 1.2.1 (eagle-llm) draws the bonus token from the raw target logits: top-k/top-p/temperature ignored.

Smallest configuration: one draft node, always accepted; top_k=1 (the target must emit its argmax).
``evaluate_posterior`` returns ``softmax(logits[best_candidate, accept_length - 1])`` -- raw logits,
no ``logits_processor`` -- and ``update_inference_inputs`` samples the bonus token from it.
Needs: pip install --no-deps eagle-llm==1.2.1 (and torch, transformers).  Deterministic (seeded).
"""

import random
from collections import Counter

import torch
from eagle.model.utils import evaluate_posterior, prepare_logits_processor

random.seed(0)
torch.manual_seed(0)
processor = prepare_logits_processor(temperature=1.0, top_k=1)  # keep only the argmax
logits = torch.tensor([[[5.0, 0.0, 0.0], [2.0, 1.0, 0.0]]])  # (paths 1, depth+1 2, V 3): root, then after node
candidates = torch.tensor([[9, 0]])  # root token (unread), draft token 0 = argmax at the root
cart_prob = torch.tensor([[1.0, 1.0]])  # the draft law was a point mass on 0: accepted with probability 1
op = [torch.tensor([[1.0, 0.0, 0.0]])]
counts = Counter()
for _ in range(2000):
    best, accept_length, sample_p = evaluate_posterior(
        logits, candidates, processor, cart_prob, op, [[-1, 0]], candidates[:, :1], [[[], []]]
    )
    assert accept_length == 1  # the draft was accepted
    counts[int(torch.multinomial(sample_p, 1))] += 1  # update_inference_inputs' draw
print("bonus tokens:", dict(sorted(counts.items())))  # top_k=1 allows only token 0
print("sample_p:", sample_p.tolist(), "expected [1, 0, 0]")
assert set(counts) != {0}, "fixed: the bonus token respects top_k"
print("BUG: tokens removed by top_k=1 were emitted")

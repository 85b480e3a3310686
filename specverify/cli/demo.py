"""Demo: the canonical rule keeps the target's law even with an adversarial drafter.

Runs ``reference.rules.verify`` on one block (K=4) per row for 1,000,000 rows
with a drafter that puts 90% of its mass on the target's least likely token,
and prints, per in-block position, the empirical law of the emitted token next
to the target law, with the acceptance rate against its exact value
sum_x min(p, q).
"""

from __future__ import annotations

import time

import torch

from specverify.core.sampling import sample
from specverify_reference.rules import verify


def adversarial_draft_probs(target_probs: torch.Tensor, mass: float = 0.9) -> torch.Tensor:
    """q putting ``mass`` on each row's least likely target token, the rest uniform."""
    V = target_probs.shape[-1]
    draft_probs = torch.full_like(target_probs, (1.0 - mass) / V)
    draft_probs.scatter_add_(-1, target_probs.argmin(-1, keepdim=True), torch.full_like(target_probs[..., :1], mass))
    return draft_probs


def main(num_rows: int = 1_000_000, K: int = 4, V: int = 8, seed: int = 0) -> int:
    generator = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(K + 1, V, generator=generator, dtype=torch.float64)
    target_table = torch.softmax(logits, -1)  # (K+1, V): a different target law per position
    draft_table = adversarial_draft_probs(target_table[:K])  # (K, V)

    target_probs = target_table.expand(num_rows, K + 1, V)  # (B, K+1, V)
    draft_probs = draft_table.expand(num_rows, K, V)  # (B, K, V)
    start = time.perf_counter()
    draft_tokens = sample(draft_probs, generator=generator)  # (B, K)
    tokens, num_emitted = verify(target_probs, draft_probs, draft_tokens, generator=generator)
    seconds = time.perf_counter() - start

    print("canonical rule, adversarial drafter (90% of q on the target's least likely token)")
    print(f"B={num_rows:,} rows, K={K}, V={V}, seed={seed}; {seconds:.2f}s for drafting + verification\n")
    for i in range(K + 1):
        emitted = num_emitted > i  # (B,) rows whose block reached position i+1
        n = int(emitted.sum())
        if n == 0:
            continue
        observed = torch.bincount(tokens[emitted, i], minlength=V).double() / n  # (V,)
        tv = 0.5 * (observed - target_table[i]).abs().sum().item()
        print(
            f"in-block position {i + 1}: N={n:,}  TV(emitted, target)={tv:.4f}  (sampling noise ~{(V / n) ** 0.5 / 2:.4f})"
        )
        print("  token   " + " ".join(f"{t:>7d}" for t in range(V)))
        print("  target  " + " ".join(f"{x:7.4f}" for x in target_table[i].tolist()))
        print("  emitted " + " ".join(f"{x:7.4f}" for x in observed.tolist()))
        if i < K:
            exact = torch.minimum(target_table[i], draft_table[i]).sum().item()
            accepted = (num_emitted > i + 1).sum().item() / n
            print(f"  acceptance rate {accepted:.4f} vs exact sum min(p, q) = {exact:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

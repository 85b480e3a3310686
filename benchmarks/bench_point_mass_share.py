"""What share of alpha the single-position point-mass alternative needs, and what the budget gives it.

The alternative: a point mass ``eps`` mixed in on one rarer token at one position of one
scenario, ``(1 - eps) p + eps 1[x]`` (the issue-30 check).  At one position the sparse test (``stats.sparse_test``) is essentially the
likelihood-ratio test's equal; in a battery it runs at the share of alpha its position gets
from the run's weighted Holm (the first step of Holm is weighted Bonferroni: a test rejects
first only if ``p <= w alpha``).  For each law and move this prints

* ``LR``: the Neyman-Pearson (likelihood-ratio) test that knows the alternative, at the run's
  alpha (1e-3), samples for power 0.9 and 0.5 (exact: the randomized binomial test on the
  count of the token, :func:`lr_power`);
* the sparse test's samples at power 0.9 and 0.5 (simulated: 400 seeded multinomial draws per
  N, bisection to 3%) alone at alpha (``@alpha``: what the test itself costs, not knowing the
  token) and at the share its position gets in the reference chain smoke run today
  (``@today``: the median share of the ``sparse`` tests), with ``ratio`` = @today / LR;
* ``a*``: the share at which the sparse test comes within 1.5x of LR at power 0.9 (within
  2x at power 0.5), by bisection on log(share); and ``1/a*``: the most tests a budget of
  alpha can give that share (sum of shares <= 1).

Run: python benchmarks/bench_point_mass_share.py [--quick]
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from scipy import stats as sps

sys.path.insert(0, "tests/stats")
from svstats_helpers import flat, zipf

from specverify.stats.sparse import sparse_test

ALPHA = 1e-3
REPS = 400


def lr_power(n, p_x, q_x, alpha=ALPHA):
    """Exact power of the randomized Neyman-Pearson test of the point-mass alternative at n samples.

    The log-likelihood ratio of ``(1 - eps) p + eps 1[x]`` against ``p`` is increasing in the count
    of x alone, so the NP test is the one-sided binomial test on that count, randomized at the
    boundary to level exactly ``alpha``.
    """
    k = int(sps.binom.isf(alpha, n, p_x))  # smallest k with P0(C > k) <= alpha
    while sps.binom.sf(k, n, p_x) > alpha:
        k += 1
    while k > 0 and sps.binom.sf(k - 1, n, p_x) <= alpha:
        k -= 1
    gamma = (alpha - sps.binom.sf(k, n, p_x)) / sps.binom.pmf(k, n, p_x)
    return float(sps.binom.sf(k, n, q_x) + gamma * sps.binom.pmf(k, n, q_x))


def lr_samples(p_x, q_x, power):
    """Smallest n at which the exact NP test (:func:`lr_power`) reaches ``power``."""
    lo, hi = 1, 2
    while lr_power(hi, p_x, q_x) < power:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lr_power(mid, p_x, q_x) < power else (lo, mid)
    return hi


def sparse_samples(p, q, share, power):
    """Smallest N (to 3%) at which the sparse test at level ``share`` rejects in ``power`` of REPS draws."""

    def hit_rate(n):
        rng = np.random.default_rng(7)
        return sum(sparse_test(rng.multinomial(n, q), p).pvalue <= share for _ in range(REPS)) / REPS

    lo, hi = 10, 20
    while hit_rate(hi) < power:
        lo, hi = hi, hi * 2
    while hi / lo > 1.03:
        mid = int(math.sqrt(lo * hi))
        lo, hi = (mid, hi) if hit_rate(mid) < power else (lo, mid)
    return hi


def needed_share(p, q, power, ratio, lr):
    """Largest share-divisor d (share = ALPHA/d) with sparse samples <= ratio * LR, to a factor 1.25."""
    lo, hi = 1.0, 1e5  # divisors
    if sparse_samples(p, q, ALPHA / lo, power) > ratio * lr:
        return None
    while hi / lo > 1.25:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if sparse_samples(p, q, ALPHA / mid, power) <= ratio * lr else (lo, mid)
    return lo


def shares_today():
    """Median share of the sparse tests, and the share at abs=0, in the reference chain smoke run (seed 0)."""
    import torch

    import specverify as sv
    from specverify.core.conformance import is_conformance
    from specverify_reference.rules import verify

    torch.set_num_threads(1)
    report = sv.check_verifier(verify, tier="smoke", seed=0, alpha=ALPHA)
    graded = [r for r in report.results if not is_conformance(r)]
    sparse = [r.alpha for r in graded if r.name == "sparse"]
    first = [r.alpha for r in graded if r.name == "sparse" and r.position == "abs=0"]
    return float(np.median(sparse)), float(np.median(first)), len(graded)


def move_onto(p, eps, rank):
    """The point-mass alternative (1 - eps) p + eps 1[token of the given rank] (rank 0 = most likely)."""
    order = np.argsort(-p, kind="stable")
    q = (1.0 - eps) * p
    q[order[rank]] += eps
    return q


def main():
    t0 = time.time()
    quick = "--quick" in sys.argv[1:]
    median_share, first_share, n_tests = shares_today()
    print(
        f"reference chain smoke run (seed 0): {n_tests} law tests; sparse test share: median alpha/"
        f"{ALPHA / median_share:.0f}, at abs=0 alpha/{ALPHA / first_share:.0f}"
    )
    cases = [
        ("zipf V=1000", zipf(1000), 0.01, 10),
        ("zipf V=1000", zipf(1000), 0.003, 100),
        ("flat V=64", flat(64), 0.02, 5),
    ]
    if not quick:
        cases += [("zipf V=1000", zipf(1000), 0.001, 500), ("zipf V=32000", zipf(32000), 0.002, 1000)]
    head = (
        f"{'law':13s} {'eps':>6s} {'rank':>5s} {'p_x':>8s} | {'LR 0.9':>7s} {'@alpha':>7s} {'@today':>7s} {'ratio':>6s} "
        f"{'a* (1.5x)':>11s} | {'LR 0.5':>7s} {'@alpha':>7s} {'@today':>7s} {'ratio':>6s} {'a* (2x)':>11s}"
    )
    print(head)
    for name, p, eps, rank in cases:
        q = move_onto(p, eps, rank)
        x = int(np.argsort(-p, kind="stable")[rank])
        cells = []
        for power, target in ((0.9, 1.5), (0.5, 2.0)):
            lr = lr_samples(float(p[x]), float(q[x]), power)
            alone = sparse_samples(p, q, ALPHA, power)
            today = sparse_samples(p, q, median_share, power)
            d = needed_share(p, q, power, target, lr)
            star = "unreachable" if d is None else f"alpha/{d:.0f}"
            cells.append(f"{lr:7d} {alone:7d} {today:7d} {today / lr:6.2f} {star:>11s}")
        print(f"{name:13s} {eps:6.3f} {rank:5d} {p[x]:8.2e} | " + " | ".join(cells), flush=True)
    print(f"[bench_point_mass_share done in {time.time() - t0:.0f}s]")


if __name__ == "__main__":
    main()

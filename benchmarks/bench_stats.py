"""Samples each statistics-core test needs to detect planted deviations (alpha 1e-3, power 0.9).

For the binned tests the count comes from the noncentral chi-square with the deviation's own
binned chi-square divergence on the bins made for that N (iterated, since bins depend on N);
`mde` is the least-favourable count samples_needed(TV). Two-sample uses m = 4n reference draws.
Directed z-tests use the normal approximation with null and alternative variances; the PIT/KS
line uses the reported detectable Kolmogorov distance. `LR limit` is the Neyman-Pearson test that
knows the alternative: N = ((z_a s_p + z_b s_q) / (KL(q||p) + KL(p||q)))^2 (one-sided).

`--sparse` adds the point-mass table: samples for power 0.9 (simulated, 200 seeded runs per N,
bisection to 4%) of the chi-square alone at alpha and of the chi-square + sparse pair the
batteries run (``stats.gof_pair``: alpha/2 each), with the sparse test's frequent-token weights
equal (tilt 0, before) and proportional to p (tilt 1, now), against the likelihood-ratio limit.

Run: python benchmarks/bench_stats.py [--sparse]
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from scipy import stats as sps

sys.path.insert(0, "tests/stats")
from svstats_helpers import flat, mixture, move_mass, temperature, topk, zipf

from specverify import stats
from specverify.stats.sparse import sparse_test

ALPHA, POWER = 1e-3, 0.9
ZA1, ZA2, ZB = sps.norm.isf(ALPHA), sps.norm.isf(ALPHA / 2), sps.norm.isf(1 - POWER)


def binned(bins, w):
    return np.bincount(
        bins.token_to_bin[bins.token_to_bin >= 0], weights=w[bins.token_to_bin >= 0], minlength=bins.num_bins
    )


def gof_needed(p, q, two_sample=False):
    """Smallest N (n for two-sample, m = 4n) with ncx2 power >= POWER on its own bins."""

    def power(n):
        bins = stats.make_bins(p, n)
        pb, qb = bins.bin_probs, binned(bins, q)
        chi2div = float(np.sum((qb - pb) ** 2 / pb))
        n_eff = n * 4 / 5 if two_sample else n
        df = bins.num_bins - 1
        if df < 1:
            return 0.0
        return sps.ncx2.sf(sps.chi2.isf(ALPHA, df), df, n_eff * chi2div)

    lo, hi = 10, 10
    while power(hi) < POWER:
        lo, hi = hi, hi * 2
        if hi > 1e10:
            return math.inf
    while hi - lo > max(1, lo // 200):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if power(mid) < POWER else (lo, mid)
    return hi


def score_needed(p, q, per_token):
    mu0 = float(p @ per_token)
    var0 = float(p @ per_token**2) - mu0**2
    mu1 = float(q @ per_token)
    var1 = float(q @ per_token**2) - mu1**2
    delta = abs(mu1 - mu0)
    return math.inf if delta == 0 else math.ceil(((ZA2 * math.sqrt(var0) + ZB * math.sqrt(var1)) / delta) ** 2)


def lr_limit(p, q):
    s = (p > 0) & (q > 0)
    if np.any((q > 0) & (p == 0)):
        return 1  # a support failure is seen at once
    llr = np.log(q[s] / p[s])
    kl_qp = float(q[s] @ llr)
    kl_pq = float(-(p[s] @ llr))
    sp = math.sqrt(max(float(p[s] @ llr**2) - kl_pq**2, 0))
    sq = math.sqrt(max(float(q[s] @ llr**2) - kl_qp**2, 0))
    return math.ceil(((ZA1 * sp + ZB * sq) / (kl_qp + kl_pq)) ** 2)


def ks_needed(p, q, order):
    d = float(np.max(np.abs(np.cumsum(q[order]) - np.cumsum(p[order]))))
    n = 10
    while True:  # smallest N whose reported detectable Kolmogorov distance is <= d
        mde = sps.kstwo.isf(ALPHA, n) + ZB / (2 * math.sqrt(n))
        if mde <= d:
            return n
        n = int(n * 1.1) + 1


def _rejects(p, counts, tilt):
    """Does the test (tilt None: chi-square alone at ALPHA; else chi-square + sparse at ALPHA/2 each) reject?"""
    chi2 = stats.gof_test(counts, p).pvalue
    if tilt is None:
        return chi2 <= ALPHA
    return chi2 <= ALPHA / 2 or sparse_test(counts, p, tilt=tilt).pvalue <= ALPHA / 2


def simulated_needed(p, q, tilt, reps=200):
    """Smallest N (to 4%) whose simulated power reaches POWER; the same seed at every N."""

    def power(n):
        rng = np.random.default_rng(1)
        return sum(_rejects(p, rng.multinomial(n, q), tilt) for _ in range(reps)) / reps

    lo, hi = 50, 100
    while power(hi) < POWER:
        lo, hi = hi, hi * 2
    while hi / lo > 1.04:
        mid = int(math.sqrt(lo * hi))
        lo, hi = (mid, hi) if power(mid) < POWER else (lo, mid)
    return hi


def sparse_table():
    laws = {"zipf V=1000": zipf(1000), "flat V=64": flat(64), "zipf V=32000": zipf(32000)}
    devs = {
        "move 0.01 top->4th": lambda p: move_mass(p, 0.01),
        "move 0.003 top->4th": lambda p: move_mass(p, 0.003),
        "mixture 0.9p+0.1ramp": lambda p: mixture(p, 0.1),
    }
    print("\nsamples for power 0.9 (simulated); in brackets: x the likelihood-ratio limit")
    print(
        f"{'law':14s} {'deviation':22s} {'LR limit':>9s} {'chi-square':>16s} {'+sparse tilt 0':>16s} {'+sparse tilt 1':>16s}"
    )
    for lname, p in laws.items():
        for dname, make in devs.items():
            q = make(p)
            lr = lr_limit(p, q)
            cells = [simulated_needed(p, q, tilt) for tilt in (None, 0.0, 1.0)]
            print(f"{lname:14s} {dname:22s} {lr:9d} " + " ".join(f"{n:8d} ({n / lr:4.2f}x)" for n in cells), flush=True)


def main():
    t0 = time.time()
    laws = {"zipf V=1000": zipf(1000), "flat V=64": flat(64), "zipf V=32000": zipf(32000)}
    devs = {
        "mixture 0.9p+0.1ramp": lambda p: mixture(p, 0.1),
        "temperature 0.9": lambda p: temperature(p, 0.1),
        "top-k (k=V/4)": lambda p: topk(p, 1.0),
        "move 0.01 top->4th": lambda p: move_mass(p, 0.01),
    }
    print(
        f"samples needed at alpha={ALPHA:g}, power={POWER} (gof/two-sample: ncx2 on own bins; "
        "two-sample n with m=4n; LR = likelihood-ratio limit)"
    )
    head = (
        f"{'law':14s} {'deviation':22s} {'TV':>7s} {'gof':>9s} {'mde(TV)':>9s} {'2-sample n':>10s} "
        f"{'pit_p KS':>9s} {'entropy z':>9s} {'LR limit':>9s} {'gof/LR':>7s}"
    )
    print(head)
    for lname, p in laws.items():
        order = stats.p_order(p)
        logp = np.log(np.where(p > 0, p, 1))
        ent_score = logp + float(-(p @ logp))
        for dname, make in devs.items():
            q = make(p)
            tv = 0.5 * float(np.abs(q - p).sum())
            if tv < 1e-12 or (dname.startswith("top-k") and False):
                print(f"{lname:14s} {dname:22s} {tv:7.4f}  (no deviation on this law)")
                continue
            if np.any((q > 0) & (p == 0)):
                print(f"{lname:14s} {dname:22s} {tv:7.4f}  support failure: detected by support_test at N=1 draw of it")
                continue
            g = gof_needed(p, q)
            bins = stats.make_bins(p, g)
            mde_n = stats.samples_needed(
                0.5 * float(np.abs(binned(bins, q) - bins.bin_probs).sum()), max(bins.num_bins - 1, 1), ALPHA
            )
            ts = gof_needed(p, q, two_sample=True)
            ks = ks_needed(p, q, order)
            sc = score_needed(p, q, ent_score)
            lr = lr_limit(p, q)
            print(
                f"{lname:14s} {dname:22s} {tv:7.4f} {g:9d} {mde_n:9d} {ts:10d} {ks:9d} "
                f"{sc if sc != math.inf else -1:9d} {lr:9d} {g / lr:7.2f}"
            )
    # acceptance: shift of the acceptance rate by 0.01 around 0.6
    m = 0
    while True:
        m = int(m * 1.1) + 100
        probs = np.full(m, 0.6)
        if stats.acceptance_test(int(0.6 * m), probs).details["mde_rate"] <= 0.01:
            break
    print(f"acceptance: a 0.01 shift of a 0.6 acceptance rate needs ~{m} trials")
    # e-process vs fixed-N gof on one deviation (simulated, 20 runs)
    rng = np.random.default_rng(0)
    p = zipf(1000)
    q = mixture(p, 0.1)
    stops = []
    for _ in range(20):
        r = stats.sequential_gof((rng.multinomial(500, q) for _ in range(10000)), p, alpha=ALPHA)
        stops.append(r.details["stopped_at"])
    print(
        f"e-process (zipf V=1000, mixture 0.9p+0.1ramp): median stop {int(np.median(stops))} samples "
        f"(gof fixed-N needs {gof_needed(p, q)}; LR limit {lr_limit(p, q)})"
    )
    if "--sparse" in sys.argv[1:]:
        sparse_table()
    print(f"[bench_stats done in {time.time() - t0:.1f}s]")


if __name__ == "__main__":
    main()

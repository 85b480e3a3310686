"""Two-sample homogeneity of token counts (black-box targets).

Bins come from the pooled counts ``a + b``: under H0 (both samples from one law)
the pooled counts are label-free, i.e. sufficient for the unknown common law, and
conditioning on them leaves the null distribution of the 2 x B table intact, so
bins made from them are "fixed before looking" at the labels.  Tokens are sorted
by pooled count (descending, ties by id) and pooled with :func:`make_bins` so the
smaller sample has expected count >= e_min in every bin; the Cressie-Read
lambda = 2/3 statistic of the 2 x B table is referred to chi-square(B - 1).

References: T. R. C. Read and N. Cressie (1988), ch. 3 (product-multinomial
homogeneity); E. L. Lehmann and J. P. Romano, *Testing Statistical Hypotheses*,
sec. 4.4 (conditioning on sufficient statistics).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_counts, check_alpha, cressie_read, result_options
from .binning import bin_counts, make_bins
from .gof import binned_details
from .power import min_detectable_tv

__all__ = ["two_sample_test"]


def two_sample_test(
    counts_a,
    counts_b,
    *,
    e_min: float = 20.0,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "two_sample",
    family: str = "two_sample",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Cressie-Read homogeneity test of two count vectors over the same vocabulary.

    Parameters
    ----------
    counts_a, counts_b : array (V,)
        Token counts of the two samples (sizes n and m).  Draw m >= 4 n reference
        samples when one side is the reference: the detectable TV is governed by
        ``n_eff = n m / (n + m)``.
    e_min : float, default 20
        Minimum expected count per bin in the smaller sample.
    alpha, power : float
        Level and power at which ``mde_tv`` is reported.

    Returns
    -------
    TestResult
        ``statistic`` Cressie-Read on the 2 x B table, ``pvalue`` from chi-square(B - 1),
        ``details["n_eff"]``, observed counts per bin of both samples and the expected
        count of sample a; ``mde_tv`` is the binned TV between the two laws detectable
        with power 0.9 given ``n_eff``.

    Notes
    -----
    Valid (asymptotically) when the two samples are independent multinomials of fixed
    sizes.  With one bin (too few samples, or a one-token pooled support) the
    statistic is 0 and the p-value 1 (no power).
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    a = as_counts("counts_a", counts_a)
    b = as_counts("counts_b", counts_b)
    if a.shape != b.shape:
        raise InvalidArgument(f"counts_a and counts_b must have the same shape (V,), got {a.shape} and {b.shape}")
    n, m = int(a.sum()), int(b.sum())
    n_eff = n * m / (n + m) if n and m else 0.0
    pooled = a + b
    if n == 0 or m == 0:
        return TestResult(
            statistic=0.0,
            pvalue=1.0,
            family=family,
            n=n + m,
            df=0,
            bins=0,
            mde_tv=math.inf,
            method="Cressie-Read two-sample homogeneity: an empty sample; statistic 0, p-value 1, no power",
            details={"n_a": n, "n_b": m, "n_eff": n_eff, "mde_n": n_eff},
            **opts,
        )
    bins = make_bins(pooled, min(n, m), e_min=e_min)
    nb = bins.num_bins
    obs_a = bin_counts(bins, a)
    obs_b = bin_counts(bins, b)
    share = bins.bin_probs  # pooled proportions per bin
    exp_a, exp_b = n * share, m * share
    common = dict(opts, family=family, n=n + m, bins=nb, multi_token_mass=bins.multi_token_mass)
    details = binned_details(bins, obs_a, exp_a)
    details.update(
        observed_b=obs_b.tolist(),
        expected_b=exp_b.tolist(),
        n_a=n,
        n_b=m,
        n_eff=n_eff,
        mde_n=n_eff,
        e_min=bins.e_min,
        power=power,
    )
    details["observed_a"] = details.pop("observed")
    details["expected_a"] = details.pop("expected")
    if nb < 2:
        return TestResult(
            statistic=0.0,
            pvalue=1.0,
            df=0,
            mde_tv=math.inf,
            details=details,
            method="Cressie-Read two-sample homogeneity: a single pooled bin; statistic 0, p-value 1, no power",
            **common,
        )
    stat = cressie_read(np.concatenate([obs_a, obs_b]), np.concatenate([exp_a, exp_b]))
    df = nb - 1
    return TestResult(
        statistic=stat,
        pvalue=float(_st.chi2.sf(stat, df)),
        method=(
            f"Cressie-Read lambda=2/3 on the 2 x {nb} table, bins from pooled (label-free) counts; "
            f"chi-square({df}) reference; n_eff = n m/(n+m) = {n_eff:.1f}"
        ),
        df=df,
        mde_tv=min_detectable_tv(n_eff, df, alpha, power),
        details=details,
        **common,
    )

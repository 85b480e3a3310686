"""Bins fixed before looking: pooling of a categorical law by expected count.

Bins depend only on the expected probabilities and the sample size N, never on
observed counts, so the chi-square reference of a binned statistic is exact in
the limit.  Tokens are sorted by probability (descending, ties by token id); a
token with expected count ``N p_i >= e_min`` gets a singleton bin; the remaining
tail is grouped in that order into consecutive bins of expected count >= e_min
(many tail bins rather than one "other" bin, so tail deviations stay visible);
a leftover tail chunk below e_min joins the previous bin.  Tokens with p = 0 get
no bin (``token_to_bin == -1``): emitting one is a support failure, tested apart.

References: W. G. Cochran (1954), "Some methods for strengthening the common
chi-square tests", Biometrics 10 (the expected-count rule of thumb); docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specverify.core.errors import InvalidArgument

from ._common import as_probs, check_e_min

__all__ = ["Bins", "make_bins", "bin_counts", "p_order"]


@dataclass(frozen=True)
class Bins:
    """A pooling of the vocabulary into bins.

    Attributes
    ----------
    token_to_bin : ndarray (V,) int64
        Bin index of each token; -1 for zero-probability tokens.  Bins are numbered
        in p-order (bin 0 holds the most probable token).
    bin_probs : ndarray (nb,) float64
        Probability of each bin (sums to 1).
    tokens_per_bin : ndarray (nb,) int64
        Number of tokens in each bin.
    multi_token_mass : float
        Probability mass in bins holding more than one token: a deviation that moves
        mass within such a bin is invisible to a binned test.
    n : float
        The sample size the bins were made for.
    e_min : float
        The minimum expected count per bin.
    """

    token_to_bin: np.ndarray
    bin_probs: np.ndarray
    tokens_per_bin: np.ndarray
    multi_token_mass: float
    n: float = 0.0
    e_min: float = 20.0

    @property
    def num_bins(self) -> int:
        return int(self.bin_probs.shape[0])

    def tokens(self, b: int) -> np.ndarray:
        """Token ids of bin ``b`` in p-order."""
        ids = np.flatnonzero(self.token_to_bin == b)
        return ids


def p_order(probs: np.ndarray) -> np.ndarray:
    """Token ids sorted by probability, descending, ties broken by increasing token id."""
    probs = np.asarray(probs, dtype=np.float64)
    return np.lexsort((np.arange(probs.shape[0]), -probs))


def make_bins(expected_probs, n, *, e_min: float = 20.0) -> Bins:
    """Pool tokens into bins of expected count >= ``e_min`` for a sample of size ``n``.

    Parameters
    ----------
    expected_probs : array (V,)
        Non-negative weights (renormalised in float64); zero entries get no bin.
    n : float
        Sample size (> = 0).  With ``n * p_max < e_min`` everything is one bin.
    e_min : float, default 20
        Minimum expected count of a bin.

    Returns
    -------
    Bins
    """
    probs = as_probs("expected_probs", expected_probs)
    try:
        n = float(n)
    except (TypeError, ValueError):
        raise InvalidArgument(f"n must be a non-negative number, got {n!r}") from None
    if not (np.isfinite(n) and n >= 0):
        raise InvalidArgument(f"n must be a non-negative finite number, got {n!r}")
    e_min = check_e_min(e_min)
    V = probs.shape[0]
    order = p_order(probs)
    order = order[probs[order] > 0]  # support, in p-order
    sorted_p = probs[order]
    expected = n * sorted_p
    num_single = int(np.count_nonzero(expected >= e_min))  # a prefix, p is sorted
    starts = list(range(num_single))
    # Tail: greedy consecutive groups with expected count >= e_min.
    tail = expected[num_single:]
    cum = np.concatenate([[0.0], np.cumsum(tail)])  # cum[j] = expected mass of tail[:j]
    s = 0
    tail_starts = []
    m = tail.shape[0]
    while s < m:
        tail_starts.append(s)
        # smallest end e > s with cum[e] - cum[s] >= e_min
        e = int(np.searchsorted(cum, cum[s] + e_min * (1 - 1e-12), side="left"))
        if e > m:  # leftover below e_min
            break
        s = max(e, s + 1)
    if tail_starts:
        last = tail_starts[-1]
        if cum[m] - cum[last] < e_min * (1 - 1e-12) and (len(tail_starts) > 1 or num_single > 0):
            tail_starts.pop()  # merge the leftover chunk into the previous bin
    starts += [num_single + t for t in tail_starts]
    if not starts and order.size:
        starts = [0]
    starts_arr = np.asarray(starts, dtype=np.int64)
    nb = starts_arr.size
    bin_of_sorted = np.zeros(order.size, dtype=np.int64)
    if nb:
        bin_of_sorted[starts_arr[1:]] = 1
        bin_of_sorted = np.cumsum(bin_of_sorted)
    token_to_bin = np.full(V, -1, dtype=np.int64)
    token_to_bin[order] = bin_of_sorted
    tokens_per_bin = np.bincount(bin_of_sorted, minlength=nb).astype(np.int64)
    bin_probs = np.bincount(bin_of_sorted, weights=sorted_p, minlength=nb)
    multi = float(bin_probs[tokens_per_bin > 1].sum())
    return Bins(token_to_bin, bin_probs, tokens_per_bin, multi, n, e_min)


def bin_counts(bins: Bins, counts: np.ndarray) -> np.ndarray:
    """Observed counts per bin (counts on tokens without a bin are dropped)."""
    counts = np.asarray(counts)
    keep = bins.token_to_bin >= 0
    return np.bincount(bins.token_to_bin[keep], weights=counts[keep], minlength=bins.num_bins)

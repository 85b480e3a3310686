"""Anytime-valid goodness of fit: a Dirichlet-mixture e-process for a categorical law.

For i.i.d. tokens with counts n_i (total n) the Dirichlet(c p) mixture of
multinomial likelihoods divided by the null likelihood is, in closed form,

    log E_c = lgamma(c) - lgamma(c + n) + sum_i [lgamma(c p_i + n_i) - lgamma(c p_i)]
              - sum_i n_i log p_i                       (tokens with p_i > 0),

the product of the Dirichlet-multinomial predictive probabilities over p(x_t).
Each E_c, and their uniform mixture over log10 c in {1, ..., 7}, is a nonnegative
martingale with mean 1 under H0 (a likelihood ratio of a mixture alternative),
so by Ville's inequality P(sup_t E_t >= 1/alpha) <= alpha: the run may stop at the
first batch where E >= 1/alpha, or continue while ambiguous, with the false-alarm
rate intact.  Concentration c interpolates between alternatives far from p
(small c) and close to p (large c, detectable TV ~ 1/sqrt(c)).  An observed token
with p_i = 0 makes E infinite (certain rejection).

References: J. Ville, *Etude critique de la notion de collectif* (1939);
A. Ramdas, P. Grunwald, V. Vovk, G. Shafer, "Game-theoretic statistics and
safe anytime-valid inference", Statist. Sci. 38 (2023); H. Robbins (1970)
"Statistical methods related to the law of the iterated logarithm" (mixtures).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.special import gammaln, logsumexp

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult

from ._common import as_counts, as_probs, check_alpha, result_options

__all__ = ["CategoricalEProcess", "sequential_gof", "DEFAULT_LOG10_C"]

#: Grid of log10 concentrations mixed uniformly.
DEFAULT_LOG10_C = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0)


class CategoricalEProcess:
    """Dirichlet(c p) mixture e-process against the exact categorical law ``probs``.

    Parameters
    ----------
    probs : array (V,)
        The null law (non-negative weights, renormalised in float64).
    log10_c : sequence of float, default (1, ..., 7)
        Concentrations mixed with equal weights.

    Attributes
    ----------
    log_e : float
        log E after the last update (``inf`` after a zero-probability token).
    max_log_e : float
        The running maximum of ``log_e`` over updates (p-value ``min(1, exp(-max_log_e))``
        is anytime valid).
    n : int
        Tokens seen so far.

    Notes
    -----
    Valid (type-I error <= alpha at any data-dependent stopping time) when the
    tokens are i.i.d. from ``probs``; batches may have any sizes, chosen adaptively.
    """

    def __init__(self, probs, *, log10_c: Iterable[float] = DEFAULT_LOG10_C):
        self._p = as_probs("probs", probs)
        grid = np.asarray(list(log10_c), dtype=np.float64)
        if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)):
            raise InvalidArgument(f"log10_c must be a non-empty sequence of finite numbers, got {log10_c!r}")
        self._c = 10.0**grid
        self._support = self._p > 0
        self._logp = np.log(np.where(self._support, self._p, 1.0))
        self._counts = np.zeros(self._p.shape[0], dtype=np.int64)
        self.n = 0
        self.log_e = 0.0
        self.max_log_e = 0.0
        self.history: list[tuple[int, float]] = []

    @property
    def counts(self) -> np.ndarray:
        return self._counts.copy()

    def log_e_per_c(self) -> np.ndarray:
        """log E_c for each concentration of the grid (current counts)."""
        if np.any(self._counts[~self._support] > 0):
            return np.full(self._c.size, math.inf)
        k = self._counts[self._support].astype(np.float64)
        p = self._p[self._support]
        n = float(k.sum())
        if n == 0:
            return np.zeros(self._c.size)
        nz = k > 0  # terms with k_i = 0 vanish
        cp = self._c[:, None] * p[nz][None, :]  # (C, support)
        out = gammaln(self._c) - gammaln(self._c + n) + (gammaln(cp + k[nz]) - gammaln(cp)).sum(axis=1)
        return out - float(np.dot(k[nz], self._logp[self._support][nz]))

    def update(self, counts) -> float:
        """Add a batch of token counts (V,); return log E after it."""
        batch = as_counts("counts", counts)
        if batch.shape != self._counts.shape:
            raise InvalidArgument(f"counts must have shape {self._counts.shape}, got {batch.shape}")
        self._counts += batch
        self.n += int(batch.sum())
        per_c = self.log_e_per_c()
        self.log_e = math.inf if np.isinf(per_c).any() else float(logsumexp(per_c) - math.log(per_c.size))
        self.max_log_e = max(self.max_log_e, self.log_e)
        self.history.append((self.n, self.log_e))
        return self.log_e

    def rejects(self, alpha) -> bool:
        """True iff E reached 1/alpha at some update (Ville: probability <= alpha under H0)."""
        alpha = check_alpha("alpha", alpha)
        return self.max_log_e >= -math.log(alpha)

    @property
    def pvalue(self) -> float:
        """Anytime-valid p-value min(1, 1 / max_t E_t)."""
        return float(min(1.0, math.exp(-self.max_log_e))) if self.max_log_e < math.inf else 0.0


def sequential_gof(
    batches: Iterable,
    probs,
    *,
    alpha: float = 1e-3,
    max_samples: int | None = None,
    log10_c: Iterable[float] = DEFAULT_LOG10_C,
    name: str = "eprocess",
    family: str = "gof",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Consume batches of token counts until E >= 1/alpha or the budget is spent.

    Parameters
    ----------
    batches : iterable of array (V,)
        Token counts of successive batches (e.g. ``np.bincount(tokens, minlength=V)``);
        may be a generator that samples lazily: it is not advanced past the stopping batch.
    probs : array (V,)
        The exact null law.
    alpha : float, default 1e-3
        Stop (and reject) as soon as E >= 1/alpha.
    max_samples : int, optional
        Stop once this many tokens have been seen (default: when ``batches`` ends).

    Returns
    -------
    TestResult
        ``statistic`` log E at the stop, ``pvalue`` the anytime-valid ``min(1, 1/max E)``,
        ``details["stopped_at"]`` the number of samples at the stop, ``"rejected"``,
        ``"batches"``, ``"log_e_path"`` (samples, log E) per batch (the first 1000).

    Notes
    -----
    Valid at any stopping rule for i.i.d. tokens from ``probs`` (Ville's inequality).
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    if max_samples is not None:
        if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
            raise InvalidArgument(f"max_samples must be a positive integer or None, got {max_samples!r}")
    proc = CategoricalEProcess(probs, log10_c=log10_c)
    threshold = -math.log(alpha)
    n_batches = 0
    for batch in batches:
        proc.update(batch)
        n_batches += 1
        if proc.log_e >= threshold or (max_samples is not None and proc.n >= max_samples):
            break
    rejected = proc.rejects(alpha)
    return TestResult(
        statistic=float(proc.log_e),
        pvalue=proc.pvalue,
        method=(
            "anytime-valid e-process: Dirichlet(c p) mixture likelihood ratio, uniform over log10 c in "
            f"{[float(x) for x in np.log10(proc._c)]}; stops when E >= 1/alpha = {1 / alpha:g}; p = min(1, 1/max E)"
        ),
        family=family,
        n=proc.n,
        details={
            "stopped_at": proc.n,
            "rejected": rejected,
            "batches": n_batches,
            "alpha": alpha,
            "max_log_e": proc.max_log_e,
            "log_e_path": proc.history[:1000],
        },
        **opts,
    )

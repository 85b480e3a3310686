"""Directed per-token tests that use every sample, whatever its context.

* Randomised PIT: with the vocabulary in a fixed order (by p, or by the ratio q/p),
  ``F(x-) + U p(x)`` is exactly U(0,1) when x ~ p, and independent across samples
  given their contexts (each is U(0,1) conditionally on the past, hence i.i.d.).
  Tested with Kolmogorov-Smirnov (exact for n <= 10000).
* Mean-zero scores ``log p(x) + H(p)`` and ``q(x)/p(x) - sum_{p>0} q``: a martingale
  difference sequence under H0 with exactly known conditional variances, tested with
  the martingale CLT z = sum s / sqrt(sum var).
* Counts of events with exact per-trial probabilities (accepted drafts, tokens in a set chosen
  from the laws) live in :mod:`specverify.stats.counts`.

References: C. Czado, T. Gneiting, L. Held, "Predictive model assessment for count
data", Biometrics 65 (2009) (randomised PIT); P. Hall and C. C. Heyde, *Martingale
Limit Theory* (1980), thm 3.2.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult
from specverify.core.validation import check_generator

from ._common import as_float_array, as_probs, check_alpha, packed_support, result_options

__all__ = ["randomised_pit", "pit_test", "entropy_scores", "ratio_scores", "score_test"]

_CHUNK = 1 << 22  # elements per (rows, V) block
#: Largest share of a standard deviation of z one score may move before :func:`score_test` stops trusting the normal tail.
LINDEBERG_SHARE = 0.5


def _rows_and_tokens(probs_name, probs, tokens, *, size=None):
    probs = as_probs(probs_name, probs, ndim=2, size=size)
    tok = as_float_array("tokens", tokens, ndim=1)
    if tok.shape[0] != probs.shape[0]:
        raise InvalidArgument(f"tokens must have shape ({probs.shape[0]},) to match {probs_name}, got {tok.shape}")
    if np.any(tok != np.floor(tok)) or np.any((tok < 0) | (tok >= probs.shape[1])):
        i = int(np.flatnonzero((tok != np.floor(tok)) | (tok < 0) | (tok >= probs.shape[1]))[0])
        raise InvalidArgument(f"tokens[{i}] is {tok[i]}, not a token id in [0, {probs.shape[1]})")
    return probs, tok.astype(np.int64)


def randomised_pit(probs, tokens, *, generator: torch.Generator, order: str = "p", draft_probs=None) -> np.ndarray:
    """Randomised probability integral transform of each token under its row's law.

    Parameters
    ----------
    probs : array (N, V)
        Target law of each sample (rows renormalised in float64).
    tokens : array (N,)
        The emitted tokens.
    generator : torch.Generator
        Source of the N uniforms (float64).
    order : {"p", "ratio"}
        Vocabulary order: ``"p"`` by target probability (descending, ties by id);
        ``"ratio"`` by q/p ascending (ties by id; needs ``draft_probs``), so
        over-emitted high-q/p tokens push PIT values towards 1.
    draft_probs : array (N, V), optional
        Draft law q for ``order="ratio"``.

    Returns
    -------
    ndarray (N,) float64
        ``F(x-) + U p(x)`` with F the CDF in the chosen order; i.i.d. U(0,1) under H0.

    Notes
    -----
    Exact for any N: valid whenever each token was drawn from its row's law given
    the past.  A token with p = 0 gets ``F(x-)`` (a support failure, tested apart).
    """
    check_generator("generator", generator)
    if order not in ("p", "ratio"):
        raise InvalidArgument(f"order must be 'p' or 'ratio', got {order!r}")
    target, tok = _rows_and_tokens("probs", probs, tokens)
    N, V = target.shape
    if order == "ratio":
        if draft_probs is None:
            raise InvalidArgument("draft_probs is required with order='ratio', got None")
        draft = as_probs("draft_probs", draft_probs, ndim=2, size=V)
        if draft.shape[0] != N:
            raise InvalidArgument(f"draft_probs must have shape ({N}, {V}), got {draft.shape}")
    u = torch.rand((N,), generator=generator, dtype=torch.float64).numpy()
    out = np.empty(N, dtype=np.float64)
    ids = np.arange(V)
    step = max(1, _CHUNK // max(V, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        for s in range(0, N, step):
            dense = target[s : s + step]  # (n, V)
            x = tok[s : s + step]
            rows = np.arange(dense.shape[0])
            px = dense[rows, x]  # (n,)
            # F(x-) sums p over tokens before x: only the support carries mass, so packed rows
            # (values 0 on padding) give the same terms as the whole vocabulary.
            packed = packed_support(dense)
            p, at = packed if packed is not None else (dense, np.broadcast_to(ids, dense.shape))  # (n, m)
            if order == "p":
                key, kx = -p, -px  # ascending key = descending p
            else:
                q = draft[s : s + step]
                q_at = q if packed is None else q[rows[:, None], np.minimum(at, V - 1)]  # (n, m)
                # q/p by one correctly rounded division (not log q - log p, whose last bits
                # depend on the CPU's vector code): the order is the same on every machine
                key = np.where(p > 0, q_at / np.where(p > 0, p, 1.0), np.inf)  # 0 where q = 0, +inf where p = 0
                kx = np.where(px > 0, q[rows, x] / np.where(px > 0, px, 1.0), np.inf)  # (n,)
            kx = kx[:, None]  # (n, 1)
            before = (key < kx) | ((key == kx) & (at < x[:, None]))  # (n, m)
            out[s : s + step] = np.minimum((p * before).sum(axis=1) + u[s : s + step] * px, 1.0)
    return out


def pit_test(
    pit_values,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "pit",
    family: str = "directed",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Kolmogorov-Smirnov test that PIT values are U(0,1).

    Parameters
    ----------
    pit_values : array (N,)
        Output of :func:`randomised_pit`.
    alpha, power : float
        Level and power at which the detectable Kolmogorov distance is reported.

    Returns
    -------
    TestResult
        ``statistic`` the KS distance D, ``pvalue`` two-sided (exact for N <= 10000,
        asymptotic beyond).  ``details["mde_kolmogorov"]``: a deviation whose CDF in
        the test's token order is off by at least this much somewhere is detected
        with probability >= ``power`` (Dvoretzky-Kiefer-Wolfowitz-free bound:
        critical value + z_power / (2 sqrt N)).  TV >= Kolmogorov distance, so this is
        not a TV guarantee; ``mde_tv`` is None.

    Notes
    -----
    Valid for any N when the PIT values are i.i.d. U(0,1) under H0, which the
    randomised PIT guarantees.  KS rather than a binned chi-square: the deviations
    the orderings target (mass shifted towards likely / high-q/p tokens, truncated
    tails, temperature) move the ordered CDF monotonically over long stretches,
    where KS has more power than 20-100 equal-width bins spreading the same
    signal over many degrees of freedom; KS also needs no binning choice.
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    check_alpha("power", power)
    x = as_float_array("pit_values", pit_values, ndim=1)
    if np.any((x < 0) | (x > 1)):
        i = int(np.flatnonzero((x < 0) | (x > 1))[0])
        raise InvalidArgument(f"pit_values[{i}] is {x[i]} (must be in [0, 1])")
    n = int(x.size)
    if n == 0:
        return TestResult(
            statistic=0.0,
            pvalue=1.0,
            family=family,
            n=0,
            method="KS uniformity of PIT: no samples",
            details={"mde_kolmogorov": math.inf},
            **opts,
        )
    res = _st.kstest(x, "uniform", method="auto")
    crit = float(_st.kstwo.isf(alpha, n))
    mde = crit + float(_st.norm.isf(1 - power)) / (2.0 * math.sqrt(n)) if n else math.inf
    return TestResult(
        statistic=float(res.statistic),
        pvalue=float(res.pvalue),
        method="Kolmogorov-Smirnov uniformity of randomised PIT values (exact for N <= 10000)",
        family=family,
        n=n,
        details={"mde_kolmogorov": mde, "ks_critical": crit, "mean": float(x.mean())},
        **opts,
    )


def entropy_scores(probs, tokens):
    """Scores ``log p(x) + H(p)`` (mean 0 under H0) and their exact conditional variances.

    Parameters
    ----------
    probs : array (N, V)
        Target law of each sample.
    tokens : array (N,)
        The emitted tokens.

    Returns
    -------
    scores, variances : ndarray (N,), ndarray (N,)
        ``variances = sum p (log p)^2 - H^2``.  A token with p = 0 scores ``-inf``.
    bound : float
        The largest ``|log p(v) + H(p)|`` over every row's support, from the laws (not the
        draws): the bound on a single score that :func:`score_test` uses to check that no
        score can dominate.  ``score_test(*entropy_scores(probs, tokens))`` passes it.
    """
    p_all, x_all = _rows_and_tokens("probs", probs, tokens)
    scores = np.empty(x_all.size)
    variances = np.empty(x_all.size)
    bound = 0.0
    step = max(1, _CHUNK // max(p_all.shape[1], 1))
    for s in range(0, x_all.size, step):
        dense, x = p_all[s : s + step], x_all[s : s + step]  # (n, V), (n,)
        px = dense[np.arange(x.size), x]  # (n,)
        packed = packed_support(dense)
        p = dense if packed is None else packed[0]  # (n, V) or (n, m): the support carries every term
        logp = np.log(np.where(p > 0, p, 1.0))  # 0 where p = 0
        ent = -(p * logp).sum(axis=1)
        second = (p * logp * logp).sum(axis=1)
        scores[s : s + step] = np.where(px > 0, np.log(np.where(px > 0, px, 1.0)), -np.inf) + ent
        variances[s : s + step] = np.maximum(second - ent * ent, 0.0)
        if x.size:
            bound = max(bound, float(np.abs(np.where(p > 0, logp + ent[:, None], 0.0)).max()))
    return scores, variances, bound


def ratio_scores(target_probs, draft_probs, tokens, *, clip: float | None = 10.0):
    """Scores ``r(x) - sum_{p>0} p r`` with ``r = min(q/p, clip)`` (mean 0 under H0) and exact variances.

    With the ratio below ``clip`` everywhere this is ``q(x)/p(x) - sum_{p>0} q``.

    Parameters
    ----------
    target_probs, draft_probs : array (N, V)
        Target law p and draft law q of each sample.
    tokens : array (N,)
        The emitted tokens (drawn from p under H0).
    clip : float or None, default 10
        Cap on the likelihood ratio q/p.  ``None`` gives the raw score
        ``q(x)/p(x) - sum_{p>0} q`` whose variance ``sum q^2/p - (sum q)^2`` explodes
        when q puts mass where p is tiny: the z-test is then invalid in both directions
        (one hit of a p = 1e-6, q = 0.5 token gives |z| ~ 30 with probability N p).
        Clipping keeps the score bounded (|s| <= clip), so the martingale CLT applies,
        and loses little power (over-emitted high-q/p tokens still raise the mean).

    Returns
    -------
    scores, variances : ndarray (N,), ndarray (N,)
        ``variances = sum_{p>0} p r^2 - (sum_{p>0} p r)^2``; a token with p = 0 scores ``inf``.
    bound : float
        The largest ``|r(v) - sum p r|`` over every row's support (see :func:`entropy_scores`).
    """
    p, x = _rows_and_tokens("target_probs", target_probs, tokens)
    q = as_probs("draft_probs", draft_probs, ndim=2, size=p.shape[1])
    if q.shape != p.shape:
        raise InvalidArgument(f"draft_probs must have shape {p.shape}, got {q.shape}")
    if clip is not None:
        try:
            clip = float(clip)
        except (TypeError, ValueError):
            raise InvalidArgument(f"clip must be a positive number or None, got {clip!r}") from None
        if not clip > 0 or np.isnan(clip):
            raise InvalidArgument(f"clip must be a positive number or None, got {clip!r}")
    scores = np.empty(x.size)
    variances = np.empty(x.size)
    bound = 0.0
    step = max(1, _CHUNK // max(p.shape[1], 1))
    for s in range(0, x.size, step):
        pp, qq, xx = p[s : s + step], q[s : s + step], x[s : s + step]  # (n, V), (n, V), (n,)
        pos = pp > 0
        with np.errstate(over="ignore"):  # q/p beyond float range is inf, then clipped
            ratio = np.where(pos, qq / np.where(pos, pp, 1.0), 0.0)  # (n, V)
        if clip is not None:
            ratio = np.minimum(ratio, clip)
        mean = (pp * ratio).sum(axis=1)
        second = (pp * ratio * ratio).sum(axis=1)
        rows = np.arange(xx.size)
        px = pp[rows, xx]
        scores[s : s + step] = np.where(px > 0, ratio[rows, xx], np.inf) - mean
        variances[s : s + step] = np.maximum(second - mean * mean, 0.0)
        if xx.size:
            bound = max(bound, float(np.abs(np.where(pos, ratio - mean[:, None], 0.0)).max()))
    return scores, variances, bound


def score_test(
    scores,
    variances,
    bound: float | None = None,
    *,
    alpha: float = 1e-3,
    power: float = 0.9,
    name: str = "score",
    family: str = "directed",
    scenario: str = "",
    position: str = "",
) -> TestResult:
    """Martingale CLT z-test that mean-zero scores have mean zero (two-sided).

    Parameters
    ----------
    scores : array (N,)
        Scores with conditional mean 0 under H0 (e.g. :func:`entropy_scores`).
    variances : array (N,)
        Their exact conditional variances.
    bound : float, optional
        The largest ``|score|`` any sample could have had, from the laws (not the draws;
        the third value the score functions return, so ``score_test(*entropy_scores(...))``
        passes it).  When one such score moves z by more
        than ``LINDEBERG_SHARE`` standard deviations, the normal tail is not trusted (one
        rare token would dominate the sum) and the p-value is the larger of the normal one
        and Bernstein's (Freedman's) bound ``2 exp(-t^2 / (2 (W + bound t / 3)))``, t = |sum|,
        W = sum var.

    Returns
    -------
    TestResult
        ``statistic`` z = sum s / sqrt(sum var), ``pvalue`` 2 * Phi(-|z|);
        ``details["mde_mean_shift"]`` the mean score shift per sample detectable with
        probability ``power`` at ``alpha``.  A non-finite score (a zero-probability
        token) or a non-zero score with zero total variance gives p-value 0.

    Notes
    -----
    Valid (asymptotically) when the scores form a martingale difference sequence
    with the given conditional variances and no single score dominates the sum
    (Lindeberg): sum var >> max var.  Without ``bound`` that is assumed; with it, it is
    checked, and where it fails the bounded-increment inequality (D. A. Freedman, "On tail
    probabilities for martingales", Ann. Probab. 3 (1975)) keeps the test conservative.
    """
    opts = result_options(name, scenario, position)
    alpha = check_alpha("alpha", alpha)
    s = np.asarray(scores.detach().cpu().numpy() if hasattr(scores, "detach") else scores, dtype=np.float64)
    v = as_float_array("variances", variances, ndim=1, nonneg=True)
    if s.ndim != 1 or s.shape != v.shape:
        raise InvalidArgument(f"scores must have shape {v.shape} like variances, got {s.shape}")
    if np.any(np.isnan(s)):
        raise InvalidArgument(f"scores[{int(np.flatnonzero(np.isnan(s))[0])}] is nan")
    n = int(s.size)
    total_var = float(v.sum())
    base = dict(opts, family=family, n=n)
    if not np.all(np.isfinite(s)):
        bad = np.flatnonzero(~np.isfinite(s))
        return TestResult(
            statistic=float(np.sign(s[bad[0]]) * math.inf),
            pvalue=0.0,
            method="score z-test: infinite score (token of probability 0): certain failure",
            details={"rows": bad[:100].tolist()},
            **base,
        )
    total = float(s.sum())
    if total_var <= 0:
        ok = bool(np.all(np.abs(s) <= 1e-9))
        return TestResult(
            statistic=0.0 if ok else math.copysign(math.inf, total),
            pvalue=1.0 if ok else 0.0,
            method="score z-test: zero variance (deterministic scores); "
            + ("all scores 0" if ok else "non-zero score: certain failure"),
            details={"sum": total, "variance": 0.0},
            **base,
        )
    z = total / math.sqrt(total_var)
    shift = (float(_st.norm.isf(alpha / 2)) + float(_st.norm.isf(1 - power))) * math.sqrt(total_var) / n
    pvalue = float(min(1.0, 2.0 * _st.norm.sf(abs(z))))
    method = "martingale CLT z-test: z = sum s / sqrt(sum exact conditional variances), two-sided normal"
    details = {"sum": total, "variance": total_var, "mean": total / n, "mde_mean_shift": shift}
    if bound is not None and float(bound) > LINDEBERG_SHARE * math.sqrt(total_var):
        t = abs(total)
        bernstein = min(1.0, 2.0 * math.exp(-t * t / (2.0 * (total_var + float(bound) * t / 3.0))))
        pvalue = max(pvalue, bernstein)
        method += (
            f"; one score can move z by {float(bound) / math.sqrt(total_var):.3g} > {LINDEBERG_SHARE} sd (a rare "
            "token dominates): p is the larger of the normal and Bernstein-Freedman tails"
        )
        details.update(score_bound=float(bound), bernstein_pvalue=bernstein)
    return TestResult(statistic=z, pvalue=pvalue, method=method, family=family, n=n, details=details, **opts)

"""How far is an implementation's output law from the exact target law: TV and KL with error bars.

Samples ``x_1..x_n`` with contexts ``c_1..c_n`` are compared with exact rows
``P_c = probs[c]`` (float64).  Given the contexts the tokens must be independent,
``x_j ~ Q_{c_j}`` (one token per independent row, e.g. one position of many
sequences; :mod:`specverify.measure.chain` selects them so).  The estimand is the
context-weighted total variation ``T = sum_c (n_c / n) TV(Q_c, P_c)`` with the observed
context counts ``n_c`` (plain ``TV(Q, P)`` with one context).

* **Plug-in and bias.**  ``T^ = sum_c (n_c/n) TV(Q^_c, P_c)``.  Its exact expectation when
  ``Q = P`` is ``sum_c 1/(2n) sum_x E|X - n_c p|`` with ``X ~ Bin(n_c, p = P_c(x))``, by
  linearity over the binomial margins of the multinomial; the binomial mean absolute
  deviation has De Moivre's closed form ``2 nu C(m, nu) p^nu (1-p)^(m-nu+1)``,
  ``nu = floor(m p) + 1`` (Diaconis & Zabell 1991).  ``tv = T^ - E_0[T^]`` is centred on 0
  under exact sampling; under alternatives it is biased downward by at most ``E_0[T^]`` (Jensen:
  ``E T^ >= T``), and upward by at most ``E TV(Q^, Q) - E_0[T^]``.
* **Lower bound, any V** (sample splitting).  A random split drawn from the caller's
  ``torch.Generator``, stratified by context (each context's samples in a random order, the
  first ``floor(n_c/2)`` -- plus one with probability 1/2 when ``n_c`` is odd -- to the
  second half): on the first half choose ``A_c = {x : Q^_c(x) > P_c(x)}``; on the second
  half count ``S = #{j : x_j in A_{c_j}}``.  ``T >= Q(A) - P(A)``, so a one-sided
  Clopper-Pearson lower bound for the mean success probability of ``S`` minus the exact
  ``P(A)`` is a lower confidence bound.  Exact with one context; with several the count is
  Poisson-binomial and Clopper-Pearson is conservative (Hoeffding 1956, Thm 4) whenever the
  mean exceeds 1, and inflates the level to at most ``-log(1 - alpha)`` otherwise.  The
  split must not depend on the order of the samples: a fixed (even / odd index) split
  under an order correlated with the contexts weights the second half's contexts unlike
  the estimand's ``n_c / n`` (with a parity-correlated order the bound exceeded T in 91% of
  runs); the stratified random split gives the second half the weights ``n_c / n`` up to
  the odd leftovers, whatever the order.
* **Upper bound** ``T <= T^ + sum_c (n_c/n) TV(Q^_c, Q_c)``, the last term bounded with
  probability ``1 - alpha`` by the smaller (chosen from n_c, V and alpha only, never the
  data) of McDiarmid's ``sum_c (n_c/n) sqrt((V-1)/(4 n_c)) + sqrt(log(1/alpha)/(2n))``
  (bounded differences 1/n; ``E TV(Q^, Q) <= sqrt((V-1)/(4m))``) and Weissman et al.'s
  L1 inequality ``P(||Q^ - Q||_1 >= e) <= (2^V - 2) exp(-m e^2 / 2)`` (HP Labs
  HPL-2003-97), union-bounded over contexts.  Informative only when V << n; for large V
  the same interval is computed on a **coarsening** (per context the top-m tokens of
  ``P_c`` plus one "rest" cell): the coarsened TV is at most the full TV (data
  processing), so its lower bound is a valid lower bound on ``T``.  When the coarse
  interval is computed, ``tv_lower`` is the larger of the full and the coarse split
  bounds, each at half the lower side's alpha (Bonferroni).
* **KL** ``sum_c (n_c/n) KL(Q^_c || P_c)`` minus the Miller-Madow bias
  ``(m_c - 1) / (2 n_c)`` (``m_c`` distinct tokens observed); infinite, with a support
  failure, when a token of probability exactly 0 was emitted.
* The tokens most over- and under-emitted (observed minus expected frequency, with z).

* **The reported point estimate** ``tv`` is the bias-corrected ``T^ - E_0[T^]`` *clipped
  to the interval* ``[tv_lower, tv_upper]`` (its projection onto the interval), with
  ``tv_clipped`` saying so and why, and the unclipped value in ``tv_bias_corrected``.  The
  interval is not built around the bias-corrected value (the bounds come from sample
  splitting and concentration), so that value can fall outside it: below 0 (it is centred
  on 0 when T = 0) or below the lower bound (under a lossy law the correction subtracts up
  to ``E_0[T^]`` too much).  It never exceeds the upper bound (``upper >= T^ >= tv``).  The
  projection is the honest choice: T lies in the interval with probability ``>= level``,
  and on that event moving an estimate to the nearest point of an interval that contains
  T never increases its distance from T; outside the interval it would claim a value the
  data already exclude at that level.

The two-sided interval ``[tv_lower, tv_upper]`` has level ``level`` (each side
``(1 - level)/2``).  Estimation needs ~V/log V samples (Valiant & Valiant 2011; Jiao,
Han & Weissman, arXiv 1705.00807), testing only ~sqrt(V)/eps^2: use the GOF tests to
decide, these numbers to quantify.

Shapes: n samples, C contexts, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import special as _sp
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_generator, check_int

from ._common import as_float_array, check_alpha

__all__ = [
    "TokenDeviation",
    "CoarseTV",
    "DivergenceEstimate",
    "divergence",
    "binomial_mad",
    "null_expected_tv",
    "clopper_pearson_lower",
    "clip_to_interval",
    "stratified_split",
]


@dataclass(frozen=True)
class TokenDeviation:
    """One token's observed vs expected count (pooled over contexts)."""

    token: int
    observed: int
    expected: float
    #: observed minus expected frequency, ``(observed - expected) / n``
    difference: float
    #: ``(observed - expected) / sqrt(expected)`` (inf when expected is 0)
    z: float


@dataclass(frozen=True)
class CoarseTV:
    """TV on the coarsening {top-m tokens of each P_c, rest}; a lower bound on the full TV.

    ``tv`` is ``tv_bias_corrected`` clipped to ``[tv_lower, tv_upper]``, as in :class:`DivergenceEstimate`.
    """

    tv: float
    tv_lower: float
    tv_upper: float
    tv_plugin: float
    tv_null_bias: float
    top: int
    upper_method: str
    tv_bias_corrected: float
    tv_clipped: str | None


@dataclass(frozen=True)
class DivergenceEstimate:
    """Distance of the sampled law from the exact law; see the module docstring for validity.

    Attributes
    ----------
    tv : float
        The point estimate: ``tv_bias_corrected`` clipped to ``[tv_lower, tv_upper]``
        (see the module docstring); always inside the interval.
    tv_lower, tv_upper : float
        Two-sided confidence interval of level ``level`` for the context-weighted TV.
    tv_plugin, tv_null_bias : float
        Plug-in TV and its exact expectation under exact sampling.
    tv_bias_corrected : float
        ``tv_plugin - tv_null_bias``, unclipped (centred on 0 under exact sampling; may be
        negative or below ``tv_lower``).
    tv_clipped : str or None
        None when ``tv == tv_bias_corrected``; otherwise what was clipped and why
        (:func:`clip_to_interval`).
    upper_method : str
        Which upper-bound width was used (McDiarmid or Weissman) and its value.
    coarse : CoarseTV or None
        The interval on the top-m + rest coarsening (None when V <= top + 1).
    kl, kl_plugin : float
        Miller-Madow corrected and plug-in KL(Q || P) in nats; inf on a support failure.
    support_failure : bool
    zero_prob_tokens : tuple of int
        Emitted tokens of probability exactly 0 (first 100).
    over_emitted, under_emitted : tuple of TokenDeviation
        The tokens with the largest positive / negative frequency difference.
    n, vocab_size, num_contexts : int
    level : float
    """

    tv: float
    tv_lower: float
    tv_upper: float
    tv_plugin: float
    tv_null_bias: float
    tv_bias_corrected: float
    tv_clipped: str | None
    upper_method: str
    coarse: CoarseTV | None
    kl: float
    kl_plugin: float
    support_failure: bool
    zero_prob_tokens: tuple[int, ...]
    over_emitted: tuple[TokenDeviation, ...]
    under_emitted: tuple[TokenDeviation, ...]
    n: int
    vocab_size: int
    num_contexts: int
    level: float


# --------------------------------------------------------------------------- exact pieces


def binomial_mad(m, p) -> np.ndarray:
    """Exact ``E|X - m p|`` for ``X ~ Bin(m, p)`` (De Moivre), elementwise, float64.

    ``2 nu C(m, nu) p^nu (1-p)^(m - nu + 1)`` with ``nu = floor(m p) + 1``; 0 where
    ``p`` is 0 or 1 or ``m`` is 0.  Evaluated in log space (accurate for any m).
    """
    m = np.asarray(m, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    m, p = np.broadcast_arrays(m, p)
    out = np.zeros(m.shape, dtype=np.float64)
    ok = (p > 0) & (p < 1) & (m > 0)
    mm, pp = m[ok], p[ok]
    nu = np.floor(mm * pp) + 1.0
    nu = np.minimum(nu, mm)  # m p < m, so nu <= m; guards the rounding of m p
    log = (
        math.log(2.0)
        + np.log(nu)
        + _sp.gammaln(mm + 1)
        - _sp.gammaln(nu + 1)
        - _sp.gammaln(mm - nu + 1)
        + nu * np.log(pp)
        + (mm - nu + 1) * np.log1p(-pp)
    )
    out[ok] = np.exp(log)
    return out


def null_expected_tv(probs, counts) -> float:
    """Exact ``E[T^]`` under exact sampling: ``sum_c 1/(2n) sum_x E|Bin(n_c, P_c(x)) - n_c P_c(x)|``.

    Parameters
    ----------
    probs : array (C, V)
        Exact rows (renormalised).
    counts : array (C,)
        Samples per context, ``n = sum counts``.
    """
    probs = np.atleast_2d(as_float_array("probs", probs, nonneg=True))
    probs = probs / probs.sum(-1, keepdims=True)
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    n = counts.sum()
    if n <= 0:
        return 0.0
    return float(binomial_mad(counts[:, None], probs).sum() / (2.0 * n))


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower confidence bound (level 1 - alpha) for a binomial proportion."""
    if successes <= 0 or trials <= 0:
        return 0.0
    return float(_st.beta.ppf(alpha, successes, trials - successes + 1))


def clip_to_interval(estimate: float, lower: float, upper: float) -> tuple[float, str | None]:
    """The point estimate reported with an interval: ``estimate`` projected onto ``[lower, upper]``.

    Parameters
    ----------
    estimate : float
        An unclipped point estimate (e.g. the bias-corrected TV).
    lower, upper : float
        Its confidence interval, ``lower <= upper``.

    Returns
    -------
    (float, str or None)
        The clipped value and None when nothing was clipped, else why it was.

    Notes
    -----
    When the interval contains the true value (probability >= its level), the projection is
    never farther from it than ``estimate``; outside the interval an estimate claims a value
    the data exclude at that level.  See the module docstring for why the bias-corrected TV
    can fall below its lower bound.
    """
    if not lower <= upper:
        raise InvalidArgument(f"lower must be <= upper, got lower={lower!r}, upper={upper!r}")
    if estimate < lower:
        return float(lower), (
            f"raised to the lower bound: the bias-corrected value {estimate:.4g} is below it (the correction "
            "subtracts the plug-in's whole expectation under exact sampling: centred on 0 when the TV is 0, "
            "too much under a lossy law)"
        )
    if estimate > upper:
        return float(upper), f"lowered to the upper bound: the unclipped value {estimate:.4g} is above it"
    return float(estimate), None


def stratified_split(contexts, generator: torch.Generator) -> np.ndarray:
    """A random split of samples into (choose, estimate) halves, stratified by context.

    Parameters
    ----------
    contexts : array (n,) int
        Context of each sample.
    generator : torch.Generator
        Draws the split (a random order within each context and a fair coin per odd ``n_c``).

    Returns
    -------
    array (n,) bool
        True for the second ("estimate") half: ``floor(n_c / 2)`` samples of each context,
        plus one with probability 1/2 when ``n_c`` is odd, chosen uniformly at random among
        them.  The split is independent of the samples' values and of their order, and the
        second half's context counts are ``n_c / 2`` in expectation (exactly, up to the odd
        leftovers).
    """
    check_generator("generator", generator)
    ctx = np.asarray(contexts, dtype=np.int64).reshape(-1)  # (n,)
    n = ctx.size
    shuffled = torch.randperm(n, generator=generator).numpy()  # (n,) a random order
    order = shuffled[np.argsort(ctx[shuffled], kind="stable")]  # (n,) by context, random within each
    sorted_ctx = ctx[order]
    _, starts, n_c = np.unique(sorted_ctx, return_index=True, return_counts=True)  # (C',) each
    coins = torch.randint(0, 2, (n_c.size,), generator=generator).numpy()  # (C',)
    take = n_c // 2 + np.where(n_c % 2 == 1, coins, 0)  # (C',) second-half size per context
    group = np.repeat(np.arange(n_c.size), n_c)  # (n,) context group of each sorted sample
    rank = np.arange(n) - starts[group]  # (n,) rank within its context
    second = np.zeros(n, dtype=bool)
    second[order] = rank < take[group]
    return second


# --------------------------------------------------------------------------- helpers


def _inputs(tokens, probs, contexts):
    probs = as_float_array("probs", probs, nonneg=True)
    if probs.ndim == 1:
        probs = probs[None]
    if probs.ndim != 2 or probs.shape[1] < 1:
        raise InvalidArgument(f"probs must have shape (V,) or (C, V), got {probs.shape}")
    sums = probs.sum(-1, keepdims=True)
    if np.any(sums <= 0):
        raise InvalidArgument(f"probs[{int(np.flatnonzero(sums[:, 0] <= 0)[0])}] sums to 0")
    probs = probs / sums  # (C, V)
    tok = as_float_array("tokens", tokens, ndim=1)
    if np.any(tok != np.floor(tok)) or np.any(tok < 0) or np.any(tok >= probs.shape[1]):
        bad = tok[(tok != np.floor(tok)) | (tok < 0) | (tok >= probs.shape[1])][0]
        raise InvalidArgument(f"tokens must be integer ids in [0, {probs.shape[1]}), got {bad}")
    if contexts is None:
        ctx = np.zeros(tok.shape, dtype=np.int64)
    else:
        ctx_f = as_float_array("contexts", contexts, ndim=1)
        if ctx_f.shape != tok.shape:
            raise InvalidArgument(f"contexts must have the shape of tokens {tok.shape}, got {ctx_f.shape}")
        if np.any(ctx_f != np.floor(ctx_f)) or np.any(ctx_f < 0) or np.any(ctx_f >= probs.shape[0]):
            raise InvalidArgument(f"contexts must be integer row ids in [0, {probs.shape[0]}), got {contexts!r:.80}")
        ctx = ctx_f.astype(np.int64)
    if tok.size < 2:
        raise InvalidArgument(f"tokens must hold at least 2 samples, got {tok.size}")
    used, inverse = np.unique(ctx, return_inverse=True)
    return tok.astype(np.int64), inverse.reshape(-1), probs[used]  # (n,), (n,), (C', V)


def _counts(ctx, tok, C, V) -> np.ndarray:
    return np.bincount(ctx * V + tok, minlength=C * V).reshape(C, V).astype(np.float64)  # (C, V)


def _split_lower(tok, ctx, probs, alpha, second_half) -> float:
    """Lower bound on T: A_c = {Q^_c > P_c} from the first half, Clopper-Pearson on the second.

    ``second_half`` (n,) bool is :func:`stratified_split`'s split.
    """
    C, V = probs.shape
    first, second = np.flatnonzero(~second_half), np.flatnonzero(second_half)
    if second.size == 0:
        return 0.0
    c1 = _counts(ctx[first], tok[first], C, V)  # (C, V)
    n1 = c1.sum(-1, keepdims=True)  # (C, 1)
    event = c1 > probs * n1  # (C, V): Q^_1 > P (empty for contexts unseen in the first half)
    hits = int(event[ctx[second], tok[second]].sum())
    p_event = float((event * probs).sum(-1)[ctx[second]].mean())  # exact mean P_{c_j}(A)
    return max(0.0, clopper_pearson_lower(hits, second.size, alpha) - p_event)


def _interval(tok, ctx, probs, alpha_side, second_half):
    """Plug-in, null bias, split lower bound and upper bound on data (n,), (n,), rows (C, V)."""
    C, V = probs.shape
    n = tok.size
    counts = _counts(ctx, tok, C, V)  # (C, V)
    n_c = counts.sum(-1)  # (C,)
    live = n_c > 0
    emp = np.where(live[:, None], counts / np.maximum(n_c, 1)[:, None], probs)  # (C, V)
    plugin = float((n_c * 0.5 * np.abs(emp - probs).sum(-1)).sum() / n)
    bias = null_expected_tv(probs, n_c)
    lower = _split_lower(tok, ctx, probs, alpha_side, second_half)
    # upper bound: widths depend on n_c, V, alpha only
    mc = n_c[live]
    mcdiarmid = float((mc * np.sqrt((V - 1) / (4.0 * mc))).sum() / n + math.sqrt(math.log(1 / alpha_side) / (2 * n)))
    log_sets = V * math.log(2.0) if V > 60 else math.log(max(2.0**V - 2.0, 1.0))
    weissman = float((mc * np.sqrt((log_sets + math.log(mc.size / alpha_side)) / (2.0 * mc))).sum() / n)
    if weissman < mcdiarmid:
        width, how = (
            weissman,
            f"Weissman et al. 2003 L1 inequality (union over {mc.size} contexts), width {weissman:.4g}",
        )
    else:
        width, how = mcdiarmid, f"McDiarmid, E TV(Q^,Q) <= sqrt((V-1)/4n) + sqrt(log(1/a)/2n), width {mcdiarmid:.4g}"
    upper = min(1.0, plugin + width)
    return plugin, bias, lower, max(upper, lower), how, counts


def _coarsen(tok, ctx, probs, top):
    """Map tokens to {0..top-1: rank among P_c's top tokens, top: rest}; rows (C, top+1)."""
    order = np.argsort(-probs, axis=-1, kind="stable")  # (C, V)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(probs.shape[1])[None].repeat(probs.shape[0], 0), axis=-1)
    coarse_tok = np.minimum(rank[ctx, tok], top)  # (n,)
    head = np.take_along_axis(probs, order[:, :top], -1)  # (C, top)
    rest = np.clip(1.0 - head.sum(-1, keepdims=True), 0.0, None)  # (C, 1)
    return coarse_tok, np.concatenate([head, rest], -1)  # (n,), (C, top+1)


def _deviations(counts, probs, n_c, n, k):
    observed = counts.sum(0)  # (V,)
    expected = n_c @ probs  # (V,)
    diff = (observed - expected) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(expected > 0, (observed - expected) / np.sqrt(expected), np.inf)

    def pick(idx):
        return tuple(
            TokenDeviation(int(i), int(observed[i]), float(expected[i]), float(diff[i]), float(z[i])) for i in idx
        )

    order = np.argsort(-diff, kind="stable")
    over = [i for i in order[:k] if diff[i] > 0]
    under = [i for i in order[::-1][:k] if diff[i] < 0]
    return pick(over), pick(under)


# --------------------------------------------------------------------------- public


def divergence(
    tokens,
    probs,
    *,
    generator: torch.Generator,
    contexts=None,
    level: float = 0.95,
    coarse_top: int = 32,
    num_tokens: int = 5,
) -> DivergenceEstimate:
    """TV and KL of sampled tokens from exact laws, with a confidence interval for TV.

    Parameters
    ----------
    tokens : array (n,) int
        The samples, in any order.
    probs : array (V,) or (C, V)
        Exact rows (non-negative, renormalised in float64).
    generator : torch.Generator
        Draws the lower bound's sample split (:func:`stratified_split`); the estimate is a
        function of the samples and this generator.
    contexts : array (n,) int, optional
        Row of ``probs`` each sample was drawn against (default: row 0 for all).
    level : float, default 0.95
        Level of the two-sided interval ``[tv_lower, tv_upper]`` (and the coarse one).
    coarse_top : int, default 32
        m of the top-m + rest coarsening; computed when V > m + 1.
    num_tokens : int, default 5
        How many most over- / under-emitted tokens to report.

    Returns
    -------
    DivergenceEstimate
        ``tv`` inside ``[tv_lower, tv_upper]`` always (clipped, flagged in ``tv_clipped``).

    Notes
    -----
    Valid when, given the contexts, the tokens are independent with laws ``Q_{c_j}``
    (one token per independent sequence; not several dependent tokens of one
    sequence).  The interval targets the context-weighted TV with the observed context
    counts.  The lower bound is valid for any V; the upper bound is informative only
    when roughly ``V < n / 4`` per context, the coarse interval for any V.  The KL
    correction is first-order (accurate when every ``n_c P_c(x)`` of the observed
    tokens is >~ 5).
    """
    level = check_alpha("level", level)
    coarse_top = check_int("coarse_top", coarse_top, minimum=1)
    num_tokens = check_int("num_tokens", num_tokens, minimum=0)
    check_generator("generator", generator)
    tok, ctx, rows = _inputs(tokens, probs, contexts)  # (n,), (n,), (C, V)
    n = tok.size
    C, V = rows.shape
    alpha_side = (1.0 - level) / 2.0
    second = stratified_split(ctx, generator)  # (n,) one split for the full and the coarse bounds
    plugin, bias, lower, upper, how, counts = _interval(tok, ctx, rows, alpha_side, second)
    coarse = None
    if V > coarse_top + 1:
        ctok, crows = _coarsen(tok, ctx, rows, coarse_top)
        cp, cb, cl, cu, chow, _ = _interval(ctok, ctx, crows, alpha_side, second)
        coarse_tv, coarse_clipped = clip_to_interval(cp - cb, cl, cu)
        coarse = CoarseTV(coarse_tv, cl, cu, cp, cb, coarse_top, chow, cp - cb, coarse_clipped)
        # both are lower bounds on T (data processing); Bonferroni over the two keeps the level
        lower = max(
            _split_lower(tok, ctx, rows, alpha_side / 2, second), _split_lower(ctok, ctx, crows, alpha_side / 2, second)
        )
    upper = max(upper, lower)
    tv, clipped = clip_to_interval(plugin - bias, lower, upper)
    n_c = counts.sum(-1)  # (C,)
    zero = (rows <= 0) & (counts > 0)  # (C, V)
    zero_tokens = tuple(int(t) for t in np.unique(np.nonzero(zero)[1])[:100])
    if zero_tokens:
        kl_plugin = kl = math.inf
    else:
        emp = counts / np.maximum(n_c, 1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(counts > 0, emp * np.log(emp / np.where(rows > 0, rows, 1.0)), 0.0)
        per_ctx = terms.sum(-1)  # (C,)
        distinct = (counts > 0).sum(-1)  # (C,)
        kl_plugin = float((n_c * per_ctx).sum() / n)
        kl = float((n_c * (per_ctx - (distinct - 1) / (2.0 * np.maximum(n_c, 1)))).sum() / n)
    over, under = _deviations(counts, rows, n_c, n, num_tokens)
    return DivergenceEstimate(
        tv=tv,
        tv_lower=lower,
        tv_upper=upper,
        tv_plugin=plugin,
        tv_null_bias=bias,
        tv_bias_corrected=plugin - bias,
        tv_clipped=clipped,
        upper_method=how,
        coarse=coarse,
        kl=kl,
        kl_plugin=kl_plugin,
        support_failure=bool(zero_tokens),
        zero_prob_tokens=zero_tokens,
        over_emitted=over,
        under_emitted=under,
        n=n,
        vocab_size=V,
        num_contexts=C,
        level=level,
    )

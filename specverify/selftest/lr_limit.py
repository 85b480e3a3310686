"""The likelihood-ratio limit: how many samples would a test that KNOWS the mutant's law need?

The selftest measures how many emitted tokens the battery needs to kill a mutant.  The
benchmark for that number is the Neyman-Pearson optimum: the likelihood-ratio (LR) test
of the simple null "tokens follow the target law p" against the simple alternative
"tokens follow the mutant's law m", which no test can beat at the same level and power
(Neyman & Pearson 1933).  ``docs/design.md`` aims for the battery to be within 2x of it.

Derivation (normal approximation).  With n i.i.d. observations x_i and
``l(x) = log m(x) / p(x)``, the LR test rejects when ``S_n = sum_i l(x_i) > c``.  By the
CLT ``S_n ~ N(n mu0, n sigma0^2)`` under p and ``N(n mu1, n sigma1^2)`` under m, with

    mu0 = E_p[l] = -KL(p || m),        sigma0^2 = Var_p[l],
    mu1 = E_m[l] =  KL(m || p),        sigma1^2 = Var_m[l].

Level alpha fixes ``c = n mu0 + z_{1-alpha} sigma0 sqrt(n)``; power ``1 - beta`` needs
``c <= n mu1 - z_{1-beta} sigma1 sqrt(n)``.  Equating and solving for sqrt(n):

    n_LR = ((z_{1-alpha} sigma0 + z_{1-beta} sigma1) / (mu1 - mu0))^2.

Stratified data (tokens of different contexts / in-block positions): an observation is a
pair (stratum s, token x) and ``l = log m_s(x) / p_s(x)``; the stratum frequencies w_s
are taken as known and the same under both hypotheses (the LR test conditional on the
strata), so the moments are the w-mixtures of the per-stratum moments.

Edge cases: tokens with ``p_s(x) = 0 < m_s(x)`` are a support violation: one such
observation refutes the null exactly, so ``n_support = ceil(log(1 - power) / log(1 - mass))``
with ``mass = sum_s w_s sum_{p_s = 0} m_s``, and ``n_LR`` is the smaller of the two;
in the normal part those tokens, and tokens with ``m_s(x) = 0 < p_s(x)``, get l := 0
(the statistic ignores them: a valid, slightly suboptimal test, so n_LR is conservative).

:func:`estimate_law_limit` estimates m by a large Monte Carlo run of the mutant through
the battery's harness for the token set a killing test used (an absolute position, an
in-block position stratified by context, a context node, all tokens, or the acceptance
trials of one in-block position), with a 1/2 pseudo-count on the support of p, and also
for all emitted tokens stratified by (in-block position, context); the smaller of the
two (in emitted tokens) is the benchmark, since the battery may kill with other tokens
than its final killing test used.  The limit covers the law of the emitted tokens given
their strata; information in the block structure itself (acceptance counts) is not in
it, so a battery that kills through an acceptance test can beat it (ratio < 1).  The
plug-in divergence of an estimated law is biased upwards by about ``(k - 1) / n_s`` per
stratum (k tokens, n_s draws); ``mc_floor`` reports that bias and ``mc_limited`` flags
limits where it exceeds 10% of the signal ``mu1 - mu0``.

References: J. Neyman and E. S. Pearson, "On the problem of the most efficient tests of
statistical hypotheses", Phil. Trans. R. Soc. A 231 (1933); ``docs/design.md`` ("The suite
tests itself": statistical efficiency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_alpha, check_int

__all__ = [
    "LRLimit",
    "lr_samples_needed",
    "bernoulli_lr_samples_needed",
    "estimate_law_limit",
    "PSEUDO_COUNT",
    "SMALL_N",
    "MC_MAX_ENTRIES",
    "mc_rows",
]

#: Below this many observations the normal approximation of the LR sum is rough (flagged ``small_n``).
SMALL_N = 30
#: Pseudo-count added per token of p's support when a law is estimated from counts.
PSEUDO_COUNT = 0.5
#: Law entries (rows x length x V) one Monte Carlo run may read: at a real vocabulary the rows
#: asked for are cut to fit (V = 151,936, length 3: 4,711 of 65,536 rows, about 40 s instead of 9
#: minutes on 2 cores), and ``mc_limited`` flags a limit the fewer draws leave imprecise.
MC_MAX_ENTRIES = 1 << 31


@dataclass(frozen=True)
class LRLimit:
    """Samples the likelihood-ratio test needs (at ``alpha``, with ``power``).

    Attributes
    ----------
    n : float
        ``min(n_normal, n_support)`` observations (``inf`` when the laws agree).
    n_normal, n_support : float
        The normal-approximation and the support-violation sample sizes.
    mu0, mu1, sigma0, sigma1 : float
        Moments of the log-likelihood ratio under the null and the alternative.
    support_mass : float
        Probability under the alternative of a token the null forbids.
    alpha, power : float
    """

    n: float
    n_normal: float
    n_support: float
    mu0: float
    mu1: float
    sigma0: float
    sigma1: float
    support_mass: float
    alpha: float
    power: float

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


def _as_rows(name: str, value) -> np.ndarray:
    arr = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise InvalidArgument(f"{name} must have shape (V,) or (S, V), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InvalidArgument(f"{name} must be finite and non-negative, got min {np.nanmin(arr)!r}")
    sums = arr.sum(-1, keepdims=True)
    if np.any(sums <= 0):
        raise InvalidArgument(f"{name} has a row with zero total mass")
    return arr / sums


def lr_samples_needed(null_probs, alt_probs, *, weights=None, alpha: float = 1e-3, power: float = 0.9) -> LRLimit:
    """Samples the Neyman-Pearson likelihood-ratio test of ``null`` vs ``alt`` needs.

    Parameters
    ----------
    null_probs, alt_probs : array (V,) or (S, V)
        The null law p and the alternative m, per stratum (rows renormalised, float64).
    weights : array (S,), optional
        Stratum frequencies (renormalised); default equal.
    alpha : float
        Level of the test (one-sided: the LR test rejects for large LR).
    power : float
        Required power, default 0.9.

    Returns
    -------
    LRLimit
        ``n`` is in observations (stratum draws).  Valid as the normal approximation of
        the sum of i.i.d. log-likelihood ratios: accurate once n is large enough that the
        sum is near normal (n >~ 30 and sigma's finite), i.e. for moderate deviations.
    """
    alpha = check_alpha("alpha", alpha)
    power = check_alpha("power", power)
    p = _as_rows("null_probs", null_probs)
    m = _as_rows("alt_probs", alt_probs)
    if p.shape != m.shape:
        raise InvalidArgument(f"null_probs and alt_probs must have the same shape, got {p.shape} and {m.shape}")
    S = p.shape[0]
    w = np.full(S, 1.0 / S) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape != (S,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise InvalidArgument(f"weights must be {S} finite non-negative numbers with a positive sum, got {weights!r}")
    w = w / w.sum()
    both = (p > 0) & (m > 0)
    llr = np.zeros_like(p)
    llr[both] = np.log(m[both]) - np.log(p[both])  # (S, V); 0 where either law is 0
    mu0 = float(np.sum(w[:, None] * p * llr))
    mu1 = float(np.sum(w[:, None] * m * llr))
    var0 = max(float(np.sum(w[:, None] * p * llr**2)) - mu0**2, 0.0)
    var1 = max(float(np.sum(w[:, None] * m * llr**2)) - mu1**2, 0.0)
    z_a, z_b = _st.norm.isf(alpha), _st.norm.isf(1.0 - power)
    gap = mu1 - mu0
    n_normal = ((z_a * math.sqrt(var0) + z_b * math.sqrt(var1)) / gap) ** 2 if gap > 0 else math.inf
    mass = float(np.sum(w[:, None] * np.where(p <= 0, m, 0.0)))
    n_support = math.log(1.0 - power) / math.log1p(-mass) if 0 < mass < 1 else (1.0 if mass >= 1 else math.inf)
    return LRLimit(
        n=min(n_normal, n_support),
        n_normal=n_normal,
        n_support=n_support,
        mu0=mu0,
        mu1=mu1,
        sigma0=math.sqrt(var0),
        sigma1=math.sqrt(var1),
        support_mass=mass,
        alpha=alpha,
        power=power,
    )


def bernoulli_lr_samples_needed(p0: float, p1: float, *, alpha: float = 1e-3, power: float = 0.9) -> LRLimit:
    """:func:`lr_samples_needed` for Bernoulli(p0) against Bernoulli(p1)."""
    for name, v in (("p0", p0), ("p1", p1)):
        if not (isinstance(v, (int, float, np.floating)) and 0.0 <= float(v) <= 1.0):
            raise InvalidArgument(f"{name} must be a probability in [0, 1], got {v!r}")
    return lr_samples_needed([1.0 - p0, p0], [1.0 - p1, p1], alpha=alpha, power=power)


# ---------------------------------------------------------------- Monte Carlo estimate of the mutant's law


def _smoothed(counts: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Counts (S, V) -> laws with a pseudo-count on ``support`` (p's support and observed tokens)."""
    c = counts + PSEUDO_COUNT * support
    return c / np.maximum(c.sum(-1, keepdims=True), 1e-300)


def _strata(keys: np.ndarray, tokens: np.ndarray, null_rows: np.ndarray, V: int):
    """Group observations by stratum key; return (null (S,V), counts (S,V), weights (S,))."""
    uniq, inv = np.unique(keys, return_inverse=True)
    counts = np.zeros((uniq.size, V))
    np.add.at(counts, (inv, tokens), 1.0)
    return null_rows(uniq), counts, counts.sum(-1)


def mc_rows(rows: int, *, length: int, vocab_size: int, batch_size: int) -> int:
    """Monte Carlo rows within :data:`MC_MAX_ENTRIES`: ``rows``, cut to whole batches that fit, at least one batch."""
    rows = check_int("rows", rows, minimum=1)
    fit = MC_MAX_ENTRIES // (check_int("length", length, minimum=1) * check_int("vocab_size", vocab_size, minimum=1))
    batch_size = check_int("batch_size", batch_size, minimum=1)
    return max(min(rows, batch_size), min(rows, fit // batch_size * batch_size))


def estimate_law_limit(
    verify,
    scenario,
    position: str,
    family: str,
    *,
    rows: int,
    seed: int,
    alpha: float,
    power: float = 0.9,
    details: dict | None = None,
) -> dict:
    """LR limit for the tokens one battery test used, with the mutant's law estimated by Monte Carlo.

    Parameters
    ----------
    verify : callable
        The verifier (mutant) under study.
    scenario : specverify.verifier.scenarios.Scenario
        The scenario of the killing test.
    position, family : str
        The killing test's ``position`` label and ``family`` (``gof`` "abs=t" / "block=j" /
        "node=..."; ``directed`` (all tokens); ``acceptance`` "block=j"; ``support``).
    rows : int
        Monte Carlo rows asked for (each of ``scenario.length`` tokens); cut by :func:`mc_rows`
        so that the run reads at most :data:`MC_MAX_ENTRIES` law entries (``mc_rows_asked``
        in the result records the request).
    seed : int
    alpha, power : float
        Level and power of the LR test.
    details : dict, optional
        The killing test's details (``context`` for node tests).

    Returns
    -------
    dict
        ``n_lr`` (observations of the stratum), ``fraction`` (stratum observations per
        emitted token), ``n_lr_tokens`` (= n_lr / fraction, emitted tokens), ``stratum``,
        ``mc_rows``, ``mc_floor``, ``mc_limited`` and the :class:`LRLimit` fields; or
        ``{"n_lr_tokens": None, "note": ...}`` when the test has no token law (protocol,
        independence, ...).
    """
    from specverify.core.seeds import scenario_seed
    from specverify.verifier.harness import run_harness

    rows = check_int("rows", rows, minimum=1)
    if family not in ("gof", "directed", "acceptance", "support"):
        return {"n_lr_tokens": None, "note": f"no LR limit for the {family} family (not a law of emitted tokens)"}
    target, drafter = scenario.build()
    asked = rows
    rows = mc_rows(rows, length=scenario.length, vocab_size=target.vocab_size, batch_size=scenario.batch_size)
    B = min(scenario.batch_size, rows)
    gen = torch.Generator().manual_seed(scenario_seed(seed, "lr-limit/" + scenario.name))
    run = run_harness(
        verify,
        target,
        drafter,
        k=scenario.k,
        batch_size=B,
        length=scenario.length,
        generator=gen,
        num_groups=max(1, math.ceil(rows / B)),
    )
    table = target.table.numpy().astype(np.float64)  # (C, V)
    V = target.vocab_size
    tok, ctx, bpos = run.tokens.numpy(), run.target_contexts.numpy(), run.block_positions.numpy()
    total = tok.size
    out: dict = {"mc_rows": int(tok.shape[0]), "mc_rows_asked": asked, "mc_tokens": int(total)}

    if family == "acceptance":
        j = int(position.split("=")[1]) if position.startswith("block=") else None
        sel = run.trial_positions.numpy() == j if j is not None else np.ones(run.trial_positions.numel(), bool)
        a = run.trial_accept_probs.numpy()[sel]
        acc = run.trial_accepted.numpy()[sel].astype(np.int64)
        key = np.round(a, 12)
        uniq, inv = np.unique(key, return_inverse=True)
        counts = np.zeros((uniq.size, 2))
        np.add.at(counts, (inv, acc), 1.0)
        null = np.stack([1.0 - uniq, uniq], -1)  # (S, 2)
        strat = f"acceptance trials at in-block position {j}, stratified by exact accept probability"
        fraction = sel.sum() / total
    else:
        flat_t, flat_c, flat_b = tok.reshape(-1), ctx.reshape(-1), bpos.reshape(-1)
        if family == "support" or family == "directed" or position in ("all",) or position.startswith("rows<"):
            keys, toks, strat = flat_b * table.shape[0] + flat_c, flat_t, "all tokens, by (in-block position, context)"

            def null_rows(u):
                return table[u % table.shape[0]]
        elif position.startswith("abs="):
            t = int(position.split("=")[1])
            keys, toks, strat = ctx[:, t], tok[:, t], f"tokens at absolute position {t}, by context"

            def null_rows(u):
                return table[u]
        elif position.startswith("block="):
            j = int(position.split("=")[1])
            sel = flat_b == j
            keys, toks, strat = flat_c[sel], flat_t[sel], f"tokens at in-block position {j}, by context"

            def null_rows(u):
                return table[u]
        elif position.startswith("node=") and details and "context" in details:
            c = int(details["context"])
            sel = flat_c == c
            keys, toks, strat = flat_c[sel], flat_t[sel], f"tokens at context node {position[5:]}"

            def null_rows(u):
                return table[u]
        else:
            return {"n_lr_tokens": None, "note": f"no LR stratum for position {position!r}"}
        null, counts, _ = _strata(keys, toks, null_rows, V)
        fraction = toks.size / total
    if counts.sum() == 0:
        return {**out, "n_lr_tokens": None, "note": "the stratum was never observed in the Monte Carlo run"}
    out.update(_limit(null, counts, fraction, strat, alpha=alpha, power=power))
    # the benchmark is the stronger of the killing test's tokens and all tokens by (in-block position, context)
    flat_t, flat_c, flat_b = tok.reshape(-1), ctx.reshape(-1), bpos.reshape(-1)
    C = table.shape[0]
    null_all, counts_all, _ = _strata(flat_b * C + flat_c, flat_t, lambda u: table[u % C], V)
    every = _limit(null_all, counts_all, 1.0, "all tokens, by (in-block position, context)", alpha=alpha, power=power)
    out["all_tokens"] = {k: every[k] for k in ("n_lr", "n_lr_tokens", "signal", "mc_limited", "small_n")}
    if every["n_lr_tokens"] is not None and (out["n_lr_tokens"] is None or every["n_lr_tokens"] < out["n_lr_tokens"]):
        out["killing_stratum"] = {k: out[k] for k in ("stratum", "n_lr", "n_lr_tokens", "signal")}
        out.update(every)
    return out


def _limit(null, counts, fraction, strat, *, alpha, power) -> dict:
    support = (null > 0) | (counts > 0)
    alt = _smoothed(counts, support)
    weights = counts.sum(-1)
    lim = lr_samples_needed(null, alt, weights=weights, alpha=alpha, power=power)
    k_s = support.sum(-1)
    floor = float(np.sum(weights / weights.sum() * (k_s - 1) / np.maximum(weights, 1)))
    signal = lim.mu1 - lim.mu0
    n_tok = lim.n / fraction if fraction > 0 else math.inf
    out = lim.to_dict()
    out.update(
        stratum=strat,
        fraction=float(fraction),
        n_lr=None if not math.isfinite(lim.n) else lim.n,
        n_lr_tokens=None if not math.isfinite(n_tok) else n_tok,
        mc_floor=floor,
        signal=signal,
        mc_limited=bool(lim.support_mass == 0 and signal < 10 * floor),
        small_n=bool(lim.n < SMALL_N),
    )
    return out

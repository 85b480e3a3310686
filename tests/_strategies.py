"""Hypothesis strategies for probability rows and (target, draft) pairs, plus the pooled
chi-square helper of every test that checks counts against a law (reference rules,
samplers, exact laws, trees, adapters).

Strategies draw small vectors element by element (so hypothesis can shrink towards
0, 1e-30, point masses) and large ones from a seed drawn inside the example (so a
failure replays).  Every row returned is a float64 tensor normalised to sum 1.
"""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch
from hypothesis import strategies as st

__all__ = [
    "vocab_sizes",
    "weight_rows",
    "prob_rows",
    "pq_pairs",
    "markov_tables",
    "pooled_chisquare",
    "normalise",
]

#: Values that stress ratios, residual masses and cumulative sums.
SPECIAL = [0.0, 0.0, 1e-30, 5e-324, 1e-300, 1e-12, 1e-6, 0.5, 1.0, 1.0 - 1e-16]


def normalise(weights) -> torch.Tensor:
    """Float64 row normalised to 1; an all-zero row becomes a point mass on token 0."""
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64))
    total = w.sum()
    if not total > 0:
        w = torch.zeros_like(w)
        w[0] = 1.0
        total = w.sum()
    return w / total


def vocab_sizes(min_V: int = 1, max_V: int = 4096):
    """Mostly small vocabularies, sometimes large ones (up to ``max_V``)."""
    small = st.integers(min_V, min(max_V, 8))
    large = [v for v in (100, 1000, 4096) if min_V <= v <= max_V]
    options = [small, st.integers(min_V, max(min_V, min(max_V, 64)))]
    if large:
        options.append(st.sampled_from(large))
    return st.one_of(*options)


def _seeded_row(kind: str, V: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "dirichlet":
        return rng.dirichlet(np.full(V, rng.choice([0.01, 0.1, 1.0, 10.0])))
    if kind == "zipf":
        w = 1.0 / np.arange(1, V + 1) ** rng.uniform(0.5, 2.0)
        return w[rng.permutation(V)]
    if kind == "sparse":
        w = rng.random(V) * (rng.random(V) < rng.uniform(0.05, 0.9))
        w[rng.integers(V)] += rng.random()  # at least one positive entry
        return w
    if kind == "uniform":
        return np.ones(V)
    if kind == "point_mass":
        w = np.zeros(V)
        w[rng.integers(V)] = 1.0
        return w
    if kind == "near_degenerate":
        w = np.full(V, 1e-30) * (rng.random(V) < 0.5)
        w[rng.integers(V)] = 1.0
        return w
    raise ValueError(kind)


SEEDED_KINDS = ["dirichlet", "zipf", "sparse", "uniform", "point_mass", "near_degenerate"]


@st.composite
def weight_rows(draw, V: int):
    """Non-negative float64 weights of length V (not normalised; positive sum not guaranteed)."""
    if V <= 16 and draw(st.booleans()):
        element = st.one_of(st.sampled_from(SPECIAL), st.floats(0.0, 1.0))
        return np.array(draw(st.lists(element, min_size=V, max_size=V)), dtype=np.float64)
    kind = draw(st.sampled_from(SEEDED_KINDS))
    seed = draw(st.integers(0, 2**32 - 1))
    return _seeded_row(kind, V, seed)


@st.composite
def prob_rows(draw, V=None, *, min_V: int = 1, max_V: int = 4096):
    """A normalised float64 probability row (V drawn when not given)."""
    if V is None:
        V = draw(vocab_sizes(min_V, max_V))
    return normalise(draw(weight_rows(V)))


RELATIONS = [
    "independent",
    "equal",
    "uniform",
    "least_likely",
    "least_likely_point",
    "disjoint",
    "point_mass",
    "perturbed",
    "near_degenerate",
]


@st.composite
def pq_pairs(draw, V=None, *, min_V: int = 1, max_V: int = 4096):
    """``(target_probs, draft_probs)`` float64 rows of one vocabulary, adversarial relations included.

    Relations: independent rows, q = p, q uniform, q concentrated on p's least likely
    token (90% or a point mass), disjoint supports, point masses, q = p perturbed by
    1e-30, near-degenerate rows.
    """
    if V is None:
        V = draw(vocab_sizes(min_V, max_V))
    target = normalise(draw(weight_rows(V)))
    relation = draw(st.sampled_from(RELATIONS))
    if relation == "independent":
        draft = normalise(draw(weight_rows(V)))
    elif relation == "equal":
        draft = target.clone()
    elif relation == "uniform":
        draft = torch.full((V,), 1.0 / V, dtype=torch.float64)
    elif relation in ("least_likely", "least_likely_point"):
        mass = 0.9 if relation == "least_likely" else 1.0
        draft = torch.full((V,), (1.0 - mass) / V, dtype=torch.float64)
        draft[int(target.argmin())] += mass
        draft = draft / draft.sum()
    elif relation == "disjoint":
        seed = draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        side = rng.random(V) < 0.5
        if V >= 2:
            side[0], side[1] = True, False
        t = rng.random(V) * side
        d = rng.random(V) * ~side
        target = normalise(t)
        draft = normalise(d) if d.sum() > 0 else normalise(np.ones(V))
    elif relation == "point_mass":
        draft = torch.zeros(V, dtype=torch.float64)
        draft[draw(st.integers(0, V - 1))] = 1.0
    elif relation == "perturbed":
        i = draw(st.integers(0, V - 1))
        draft = target.clone()
        draft[i] += draw(st.sampled_from([1e-30, 1e-16, 1e-12, 1e-6]))
        draft = draft / draft.sum()
    else:  # near_degenerate
        draft = torch.full((V,), 1e-30, dtype=torch.float64)
        draft[draw(st.integers(0, V - 1))] = 1.0
        draft = draft / draft.sum()
    return target, draft


@st.composite
def markov_tables(draw, *, max_V: int = 6):
    """``(V, init, transition)`` of a first-order Markov chain, rows from :func:`weight_rows`."""
    V = draw(st.integers(1, max_V))
    init = normalise(draw(weight_rows(V)))
    transition = torch.stack([normalise(draw(weight_rows(V))) for _ in range(V)])  # (V, V)
    return V, init, transition


def pooled_chisquare(counts, probs, *, e_min: float = 5.0, support: bool = False):
    """Pearson chi-square of ``counts`` against ``probs`` with the tail pooled.

    Categories with probability 0 are excluded (check them separately: any count
    there is a support failure), or with ``support=True`` a count there returns
    ``(inf, 0.0, 0)``.  Categories are sorted by probability; those with expected
    count >= e_min stay singletons, the rest are grouped consecutively until each
    group's expected count reaches e_min (a short last group joins the one before).

    Returns ``(statistic, pvalue, num_bins)``; pvalue is 1 with fewer than 2 bins.
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    n = counts.sum()
    keep = probs > 0
    if support and counts[~keep].sum() > 0:
        return float("inf"), 0.0, 0
    counts, probs = counts[keep], probs[keep]
    order = np.argsort(-probs, kind="stable")
    counts, expected = counts[order], n * probs[order]
    obs_bins, exp_bins = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(counts, expected):
        acc_o += o
        acc_e += e
        if acc_e >= e_min:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        if obs_bins:
            obs_bins[-1] += acc_o
            exp_bins[-1] += acc_e
        else:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
    if len(obs_bins) < 2:
        return 0.0, 1.0, len(obs_bins)
    obs, exp = np.array(obs_bins), np.array(exp_bins)
    exp = exp * (obs.sum() / exp.sum())
    statistic, pvalue = scipy.stats.chisquare(obs, exp)
    return float(statistic), float(pvalue), len(obs_bins)

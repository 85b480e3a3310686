"""One error budget per run: weighted Holm across test families, PractRand-style grades.

Each test i gets weight ``w_i = W_f / n_f`` (its family's weight W_f, renormalised
over the families present in the run, split equally among the n_f tests of the
family), so the weights sum to 1.  Weighted Holm (Holm 1979, sec. 3): sort the tests
by ``p_i / w_i``; the adjusted p-value of the j-th is

    p~_(j) = max_{k <= j} min(1, p_(k) * (sum_{l >= k} w_(l)) / w_(k)),

and a test FAILS iff ``p~ <= alpha``: exactly the hypotheses weighted Holm rejects at
family-wise error rate alpha (strong control, any dependence between tests).  A test
is SUSPICIOUS iff ``alpha < p~ <= min(1, suspicious_factor * alpha)`` (warns, does not
fail the gate).  Each result's ``alpha`` is set to its first-step share ``w_i * alpha``
and its detectable effects -- ``mde_tv``, a sparse test's ``details["mde_point_mass"]`` and a
z-test's ``details[details["mde_key"]]`` (from ``mde_per_z``) -- are recomputed at that level.

Two budgets per run: the tests of the law, and the rule-conformance tests
(:data:`specverify.core.conformance.CONFORMANCE_FAMILIES`: acceptance against the declared
rule), each graded by its own weighted Holm at ``alpha``, so conformance neither consumes
nor inflates the law's budget.  Verdicts are made of the law tests; ``gate_conformance=True``
adds the conformance tests (the gated verdict's false-alarm rate is then at most 2 alpha).

References: S. Holm, "A simple sequentially rejective multiple test procedure",
Scand. J. Statist. 6 (1979) 65-70; PractRand / TestU01 grading conventions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from specverify.core.conformance import is_conformance, verdict_results
from specverify.core.errors import InvalidArgument
from specverify.core.results import ERROR, FAIL, PASS, SUSPICIOUS, TestResult

from ._common import check_alpha
from .counts import MASS_KEY
from .power import min_detectable_tv, z_shift
from .sparse import point_mass_mde

__all__ = [
    "DEFAULT_FAMILY_WEIGHTS",
    "UNKNOWN_FAMILY_WEIGHT",
    "grade",
    "grade_run",
    "holm_adjust",
    "run_verdict",
    "verdict",
]

#: Default budget share of each family (renormalised over the families present).
#: Goodness of fit against exact laws is the primary evidence; directed tests and the
#: two-sample comparison the next; the rest are cheap consistency checks.  Support,
#: greedy and protocol checks are exact (p-values 0 or 1), so their share barely matters.
DEFAULT_FAMILY_WEIGHTS: Mapping[str, float] = {
    "gof": 0.30,
    "directed": 0.15,
    "two_sample": 0.15,
    "acceptance": 0.10,
    "independence": 0.10,
    "dependence": 0.10,
    "invariance": 0.10,
    "consistency": 0.10,
    "support": 0.04,
    "greedy": 0.03,
    "protocol": 0.03,
}
#: Weight of a family missing from the default table.
UNKNOWN_FAMILY_WEIGHT = 0.10


def holm_adjust(pvalues, weights) -> np.ndarray:
    """Weighted-Holm adjusted p-values (weights positive; renormalised to sum 1).

    Deterministic: ties in ``p / w`` are broken by input order.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if p.shape != w.shape or p.ndim != 1:
        raise InvalidArgument(f"pvalues and weights must be 1-D of equal length, got {p.shape} and {w.shape}")
    if p.size == 0:
        return p.copy()
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        i = int(np.flatnonzero(~np.isfinite(p) | (p < 0) | (p > 1))[0])
        raise InvalidArgument(f"pvalues[{i}] is {p[i]} (must be in [0, 1])")
    if np.any(~np.isfinite(w)) or np.any(w <= 0):
        i = int(np.flatnonzero(~np.isfinite(w) | (w <= 0))[0])
        raise InvalidArgument(f"weights[{i}] is {w[i]} (must be > 0)")
    w = w / w.sum()
    order = np.lexsort((np.arange(p.size), p / w))
    w_sorted = w[order]
    remaining = np.cumsum(w_sorted[::-1])[::-1]  # sum_{l >= k} w_(l)
    steps = np.minimum(1.0, p[order] * remaining / w_sorted)
    adjusted_sorted = np.maximum.accumulate(steps)
    adjusted = np.empty_like(p)
    adjusted[order] = adjusted_sorted
    return adjusted


def _weights(results, family_weights) -> np.ndarray:
    explicit = family_weights is not None
    table = dict(DEFAULT_FAMILY_WEIGHTS if family_weights is None else family_weights)
    fams = [r.family for r in results]
    sizes: dict[str, int] = {}
    for f in fams:
        sizes[f] = sizes.get(f, 0) + 1
    for f in sizes:
        if f not in table:
            if explicit:
                raise InvalidArgument(f"family_weights has no weight for family {f!r} (given: {sorted(table)})")
            table[f] = UNKNOWN_FAMILY_WEIGHT
        wf = table[f]
        if not (isinstance(wf, (int, float)) and math.isfinite(wf) and wf > 0):
            raise InvalidArgument(f"family_weights[{f!r}] must be a positive number, got {wf!r}")
    total = sum(table[f] for f in sizes)
    return np.array([table[f] / total / sizes[f] for f in fams], dtype=np.float64)


def grade(
    results: Iterable[TestResult],
    *,
    alpha: float = 1e-3,
    family_weights: Mapping[str, float] | None = None,
    suspicious_factor: float = 100.0,
) -> tuple[TestResult, ...]:
    """Grade a run's results: the law tests under one family-wise budget, the conformance tests under another.

    Parameters
    ----------
    results : iterable of TestResult
        Ungraded (or previously graded; grading is redone from ``pvalue``) results.
    alpha : float, default 1e-3
        Family-wise error rate of each budget: the law tests, and separately the
        rule-conformance tests (:func:`specverify.core.conformance.is_conformance`).
    family_weights : mapping family -> weight, optional
        Budget share per family, renormalised over the families present in each budget; default
        :data:`DEFAULT_FAMILY_WEIGHTS` (unknown families get
        :data:`UNKNOWN_FAMILY_WEIGHT`).  With an explicit mapping every family present
        must have a positive weight.
    suspicious_factor : float, default 100
        SUSPICIOUS when the adjusted p-value is within this factor of alpha.

    Returns
    -------
    tuple of TestResult
        In input order, with ``alpha`` (the allocated share ``w_i * alpha``),
        ``adjusted_pvalue``, ``grade`` and ``mde_tv`` (at the allocated alpha) set, and a
        sparse test's ``details["mde_point_mass"]`` recomputed at the allocated alpha
        (:func:`_graded_details`).

    Notes
    -----
    Controls the probability of any FAIL among the law tests at ``alpha`` when every test's
    p-value is valid (super-uniform under H0), whatever their dependence, and so for the
    conformance tests: grading the law tests alone gives them the same grades.  A p-value of
    0 (a certain failure such as a support violation) always FAILS.  Deterministic.
    """
    results = tuple(results)
    for i, r in enumerate(results):
        if not isinstance(r, TestResult):
            raise InvalidArgument(f"results[{i}] must be a TestResult, got {type(r).__name__}")
    alpha = check_alpha("alpha", alpha)
    try:
        factor = float(suspicious_factor)
    except (TypeError, ValueError):
        raise InvalidArgument(f"suspicious_factor must be a number >= 1, got {suspicious_factor!r}") from None
    if not (math.isfinite(factor) and factor >= 1):
        raise InvalidArgument(f"suspicious_factor must be a finite number >= 1, got {suspicious_factor!r}")
    if not results:
        return ()
    graded: list[TestResult | None] = [None] * len(results)
    for rule in (False, True):  # the law's budget, then the rule conformance's
        index = [i for i, r in enumerate(results) if is_conformance(r) == rule]
        if index:
            done = _grade_budget([results[i] for i in index], index, alpha, family_weights, factor)
            for i, r in zip(index, done):
                graded[i] = r
    return tuple(r for r in graded if r is not None)


def _grade_budget(results, index, alpha, family_weights, factor) -> list[TestResult]:
    """Weighted Holm over ``results`` (one budget); ``index`` their positions in the caller's input."""
    weights = _weights(results, family_weights)
    pvals = []
    for i, r in zip(index, results):
        p = float(r.pvalue)
        if math.isnan(p) or not 0.0 <= p <= 1.0:
            raise InvalidArgument(f"results[{i}].pvalue is {r.pvalue!r} ({r.family}/{r.name}); must be in [0, 1]")
        pvals.append(p)
    adjusted = holm_adjust(pvals, weights)
    warn_level = min(1.0, factor * alpha)
    graded = []
    for r, w, adj in zip(results, weights, adjusted):
        share = float(w * alpha)
        if r.pvalue == 0.0 or adj <= alpha:
            g = FAIL
        elif adj <= warn_level:
            g = SUSPICIOUS
        else:
            g = PASS
        changes = dict(alpha=share, adjusted_pvalue=float(adj), grade=g)
        mde_n = r.details.get("mde_n") if isinstance(r.details, Mapping) else None
        if r.mde_tv is not None and r.df and mde_n is not None and math.isfinite(r.mde_tv):
            power = r.details.get("power", 0.9)
            changes["mde_tv"] = min_detectable_tv(mde_n, r.df, share, power)
        details = _graded_details(r, share)
        if details is not None:
            changes["details"] = details
            if details.get("mde_key") == MASS_KEY:  # a set-mass test: its mass shift is its two-bin TV
                changes["mde_tv"] = details[MASS_KEY]
        graded.append(r.replace(**changes))
    return graded


def _graded_details(result: TestResult, share: float) -> dict | None:
    """``result.details`` with its detectable effects recomputed at ``share``, or None when it has none.

    A sparse test's ``mde_point_mass`` (when it records ``mde_n``, ``mde_top_prob`` and
    ``mde_top_weight``: :func:`specverify.stats.sparse.sparse_test`); a z-test's effect named by
    ``mde_key``, ``mde_per_z`` times ``z_{1-share/2} + z_power``
    (:func:`specverify.stats.dependence.pair_dependence_test`,
    :func:`specverify.stats.counts.set_mass_test`).
    """
    d = result.details
    if not isinstance(d, Mapping):
        return None
    power = float(d.get("power", 0.9))
    out = dict(d)
    if "mde_point_mass" in d:
        try:
            n, top, weight = int(d["mde_n"]), float(d["mde_top_prob"]), float(d["mde_top_weight"])
            out["mde_point_mass"] = point_mass_mde(n, top, weight, share, power)
        except (KeyError, TypeError, ValueError):
            pass
    per_z = d.get("mde_per_z")
    if isinstance(per_z, float) and math.isfinite(per_z) and "mde_key" in d:
        out[d["mde_key"]] = z_shift(share, power) * per_z
    return out if out != d else None


def verdict(graded_results: Iterable[TestResult], *, gate_conformance: bool = False) -> str:
    """``"fail"`` if any law test FAILS, else ``"suspicious"`` if any is SUSPICIOUS, else ``"pass"``.

    Every result must be graded (see :func:`grade`); an empty run passes.  Rule-conformance
    tests count only with ``gate_conformance=True``.
    """
    grades = []
    for i, r in enumerate(graded_results):
        if not isinstance(r, TestResult):
            raise InvalidArgument(f"graded_results[{i}] must be a TestResult, got {type(r).__name__}")
        if r.grade not in (PASS, SUSPICIOUS, FAIL):
            raise InvalidArgument(
                f"graded_results[{i}] ({r.family}/{r.name}) is not graded (grade={r.grade!r}); call grade() first"
            )
        if gate_conformance or not is_conformance(r):
            grades.append(r.grade)
    if FAIL in grades:
        return FAIL
    if SUSPICIOUS in grades:
        return SUSPICIOUS
    return PASS


def grade_run(
    results: Sequence[TestResult], errors: Sequence[str], *, alpha: float, gate_conformance: bool = False
) -> tuple[tuple[TestResult, ...], str]:
    """Grade a run's results (:func:`grade`: the law's budget and the conformance one) and give its verdict.

    The verdict is :func:`run_verdict`'s: a failed test fails the run, an implementation
    error without one makes it ``"error"``, and a run with no result at all fails.
    """
    graded = grade(results, alpha=alpha) if results else ()
    return tuple(graded), run_verdict(graded, errors, gate_conformance=gate_conformance)


def run_verdict(graded_results: Sequence[TestResult], errors: Sequence[str], *, gate_conformance: bool = False) -> str:
    """The verdict of a run from its graded results and its implementation errors.

    ``"fail"`` when a test of the law failed (a record that only holds an implementation
    error is not such a test: :func:`specverify.core.results.is_error_record`), even if
    other scenarios could not be tested; otherwise ``"error"`` when the implementation could
    not be tested somewhere; otherwise :func:`verdict` of the tests.  A run with neither
    tests nor errors fails: a silent pass is never the outcome of a run that tested nothing.
    The tests are the law's; rule-conformance tests join them with ``gate_conformance=True``.
    """
    tests = verdict_results(graded_results, gate_conformance=gate_conformance)
    if any(r.grade == FAIL for r in tests):
        return FAIL
    if errors:
        return ERROR
    return verdict(tests, gate_conformance=gate_conformance) if tests else FAIL

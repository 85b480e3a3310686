"""What a report says, independent of its format: ordering, verdict text, repro, counterexample.

Markdown and HTML renderers both build on these helpers so that the two always
tell the same story.  Everything here is pure and deterministic; inputs may come
from a live :class:`~specverify.core.results.Report` or one read back from JSON (where
non-finite floats are strings such as ``"nan"``), so every number is read through
:func:`num`.  The keys read are documented in :mod:`specverify.report`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specverify.core.repro import is_python_repro
from specverify.core.results import FAIL, PASS, SUSPICIOUS, Report, TestResult

GRADE_ORDER = {FAIL: 0, SUSPICIOUS: 1, PASS: 2}


# ----------------------------------------------------------------------------- numbers


#: Columns of the test table (HTML adds "method").
RESULT_COLUMNS = [
    "#",
    "grade",
    "family",
    "test",
    "scenario",
    "position",
    "N",
    "statistic",
    "p",
    "adjusted p",
    "alpha",
    "detectable TV",
]


def num(value: Any) -> float | None:
    """``value`` as a float (``"nan"``/``"inf"`` strings included), or None if it is not a number."""
    if value is None or isinstance(value, bool):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def finite(value: Any) -> float | None:
    x = num(value)
    return x if x is not None and math.isfinite(x) else None


def fmt(value: Any, spec: str = ".3g", none: str = "—") -> str:
    """Format a number; None -> ``none``; strings that are not numbers are returned as they are."""
    x = num(value)
    if x is None:
        return none if value is None else str(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and 1 <= abs(x) < 1e6 and spec in (".3g", ".4g"):
        return str(int(x))
    return format(x, spec)


def fmt_int(value: Any) -> str:
    x = finite(value)
    return "—" if x is None else f"{int(x):,}"


def float_list(value: Any) -> list[float] | None:
    """A flat list of floats, or None when ``value`` is not a 1-D sequence of numbers."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = [num(v) for v in value]
    return None if any(v is None for v in out) else out


# ----------------------------------------------------------------------------- ordering


def effective_p(result: TestResult) -> float:
    """The p-value used for ordering: adjusted if present, else raw; NaN sorts last."""
    for value in (result.adjusted_pvalue, result.pvalue):
        x = num(value)
        if x is not None:
            return math.inf if math.isnan(x) else x
    return math.inf


def sort_key(result: TestResult) -> tuple:
    raw = num(result.pvalue)
    raw = math.inf if raw is None or math.isnan(raw) else raw
    return (
        GRADE_ORDER.get(result.grade, 3),
        effective_p(result),
        raw,
        result.family,
        result.name,
        result.scenario,
        result.position,
    )


def worst_first(results: Sequence[TestResult]) -> list[TestResult]:
    """Failures first, then suspicious, pass, ungraded; within a grade by (adjusted) p."""
    return sorted(results, key=sort_key)


#: Passing tests listed (worst first) after the flagged ones before the test table folds the rest.
WORST_SHOWN = 10


def split_tests(
    results: Sequence[TestResult], *, worst: int = WORST_SHOWN
) -> tuple[list[TestResult], list[TestResult]]:
    """(listed, folded): every flagged (failed or suspicious) test and the ``worst`` next ones; the rest folded.

    Both lists are worst first; a renderer shows ``listed`` and folds ``folded`` away.
    """
    ordered = worst_first(results)
    flagged = [r for r in ordered if r.grade in (FAIL, SUSPICIOUS)]
    others = [r for r in ordered if r.grade not in (FAIL, SUSPICIOUS)]
    return flagged + others[:worst], others[worst:]


def grade_counts(results: Sequence[TestResult]) -> str:
    """``"3 failed, 1 suspicious, 40 passed"`` (grades that occur; ungraded tests as "ungraded")."""
    names = {FAIL: "failed", SUSPICIOUS: "suspicious", PASS: "passed"}
    counts: dict[str, int] = {}
    for r in results:
        key = names.get(r.grade, "ungraded")
        counts[key] = counts.get(key, 0) + 1
    order = ["failed", "suspicious", "passed", "ungraded"]
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


def test_label(result: TestResult) -> str:
    name = result.family if result.name in ("", result.family) else f"{result.family}/{result.name}"
    where = "/".join(x for x in (result.scenario, result.position) if x)
    return f"{name} at {where}" if where else name


def counts_of(result: TestResult) -> tuple[list[float], list[float], list[Any]] | None:
    """(observed, expected, bin labels) from ``details``, or None if absent or inconsistent."""
    details = result.details if isinstance(result.details, Mapping) else {}
    observed = float_list(details.get("observed"))
    expected = float_list(details.get("expected"))
    if observed is None or expected is None or len(observed) != len(expected):
        return None
    tokens = details.get("bin_tokens")
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple)) or len(tokens) != len(observed):
        tokens = [None] * len(observed)
    return observed, expected, list(tokens)


def bin_label(tokens: Any, index: int, *, limit: int = 6) -> str:
    """``"17"`` for a singleton bin, ``"3, 8, 9 (+12 more)"`` for a pooled one, ``"bin 4"`` if unknown."""
    if tokens is None:
        return f"bin {index}"
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple)):
        return str(tokens)
    shown = ", ".join(str(t) for t in tokens[:limit])
    return shown + (f" (+{len(tokens) - limit} more)" if len(tokens) > limit else "")


# ----------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Detectability:
    largest: float | None
    largest_result: TestResult | None
    median: float | None
    max_multi_token_mass: float | None
    count: int


def detectability(results: Sequence[TestResult]) -> Detectability:
    with_tv = [(finite(r.mde_tv), r) for r in results]
    with_tv = [(tv, r) for tv, r in with_tv if tv is not None]
    masses = [m for m in (finite(r.multi_token_mass) for r in results) if m is not None]
    if not with_tv:
        return Detectability(None, None, None, max(masses) if masses else None, 0)
    largest, largest_result = max(with_tv, key=lambda pair: (pair[0], *sort_key(pair[1])[3:]))
    median = statistics.median(tv for tv, _ in with_tv)
    return Detectability(largest, largest_result, median, max(masses) if masses else None, len(with_tv))


def detectability_sentence(report: Report) -> str:
    d = detectability(report.results)
    if d.count == 0:
        return (
            "No test recorded its minimum detectable deviation, so this run says nothing about how "
            "small a deviation it could have missed."
        )
    text = (
        f"What could have been detected: at power 0.9, the median test would catch a binned total-variation "
        f"distance of {fmt(d.median)}; the least sensitive one ({test_label(d.largest_result)}, "
        f"N={fmt_int(d.largest_result.n)}) only deviations of {fmt(d.largest)} or more. Smaller deviations "
        f"could have gone unnoticed"
    )
    if d.max_multi_token_mass:
        text += (
            f", as could reshuffling of probability among tokens pooled in one bin (up to "
            f"{fmt(d.max_multi_token_mass)} of the mass in one test)"
        )
    return text + "."


def _listing(results: Sequence[TestResult], limit: int = 5) -> str:
    parts = [f"{test_label(r)} (p={fmt(r.pvalue)}, adjusted p={fmt(r.adjusted_pvalue)})" for r in results[:limit]]
    if len(results) > limit:
        parts.append(f"and {len(results) - limit} more")
    return "; ".join(parts)


def verdict_paragraph(report: Report) -> str:
    """One paragraph: the verdict and what it means (plain text; renderers escape it)."""
    results = worst_first(report.results)
    failed = [r for r in results if r.grade == FAIL]
    suspicious = [r for r in results if r.grade == SUSPICIOUS]
    n = len(results)
    alpha = f"family-wise alpha {fmt(report.alpha)}"
    if report.verdict == PASS:
        return (
            f"PASS: no test detected a deviation from the target distribution. All {n} tests passed at "
            f"{alpha} (weighted Holm across families). This is not a proof of exactness. "
            + detectability_sentence(report)
        )
    if report.verdict == SUSPICIOUS:
        return (
            f"SUSPICIOUS: no test crossed its allocated alpha, so the gate passes (a warning, not a failure), "
            f"but {len(suspicious)} of {n} tests came within 100x of it: {_listing(suspicious)}. Under a correct "
            f"implementation that happens by chance now and then; rerun with another --seed or a higher "
            f"--tier: a real deviation keeps lowering p as N grows, chance does not. " + detectability_sentence(report)
        )
    if report.verdict == FAIL:
        parts = ["FAIL: the implementation does not emit the target's distribution"]
        reasons = []
        if failed:
            reasons.append(f"{len(failed)} of {n} tests rejected it at {alpha}: {_listing(failed)}")
        if report.errors:
            reasons.append(
                f"{len(report.errors)} implementation error(s) (protocol violations such as exceptions, "
                f"wrong shapes or out-of-vocabulary tokens) were recorded, see below"
            )
        if not reasons:
            reasons.append("the verdict is fail although no failing test or error was recorded")
        return parts[0] + " or violates its protocol. " + "; ".join(reasons) + ". The gate fails."
    return f"Verdict {report.verdict!r}: {n} tests, {len(failed)} failed, {len(suspicious)} suspicious."


# ----------------------------------------------------------------------------- reproduction


def repro_command(report: Report) -> str:
    """How to rerun the report: ``report.command`` (a command line, or a Python snippet for runs from Python)."""
    return str(report.command or "")


def repro_is_python(report: Report) -> bool:
    """True when the recorded repro is a Python snippet (the run was started from Python), not a command line."""
    return is_python_repro(repro_command(report))


def seeds(report: Report) -> list[tuple[str, Any]]:
    """Every seed recorded: the root seed, scenario keys ending in "seed", per-test details["seed"]."""
    out: list[tuple[str, Any]] = [("root (--seed)", report.seed)]
    for i, scenario in enumerate(report.scenarios):
        if not isinstance(scenario, Mapping):
            continue
        label = str(scenario.get("name", f"scenario {i}"))
        out += [(f"{label}: {k}", v) for k, v in scenario.items() if str(k).endswith("seed")]
    for r in report.results:
        if isinstance(r.details, Mapping) and "seed" in r.details:
            out.append((f"{test_label(r)}: seed", r.details["seed"]))
    return out


# ----------------------------------------------------------------------------- counterexample


def scenario_map(report: Report) -> dict[str, Mapping[str, Any]]:
    return {str(s["name"]): s for s in report.scenarios if isinstance(s, Mapping) and "name" in s}


def scenario_size(scenario: Mapping[str, Any] | None) -> float:
    """V*K of a scenario (K defaults to 1); unknown V -> inf."""
    if not scenario:
        return math.inf
    vocab, k = finite(scenario.get("vocab_size")), finite(scenario.get("k"))
    if vocab is None:
        return math.inf
    return vocab * (k if k is not None else 1.0)


@dataclass(frozen=True)
class Counterexample:
    result: TestResult
    scenario: Mapping[str, Any] | None
    counts: tuple[list[float], list[float], list[Any]] | None
    rows: list[tuple[str, float, float, float]]  # (bin label, observed, expected, residual) worst first


def counterexample(report: Report, *, max_bins: int = 20) -> Counterexample | None:
    """The failing result from the smallest scenario (see :mod:`specverify.report`), or None."""
    failed = [r for r in report.results if r.grade == FAIL]
    if not failed:
        return None
    scenarios = scenario_map(report)

    def key(r: TestResult) -> tuple:
        n = finite(r.n)
        return (
            scenario_size(scenarios.get(r.scenario)),
            0 if counts_of(r) else 1,
            n if n is not None else math.inf,
            sort_key(r),
        )

    result = min(failed, key=key)
    counts = counts_of(result)
    rows = []
    if counts:
        observed, expected, tokens = counts
        for i, (o, e, t) in enumerate(zip(observed, expected, tokens)):
            resid = (o - e) / math.sqrt(e) if e > 0 else (math.inf if o > 0 else 0.0)
            rows.append((bin_label(t, i), o, e, resid))
        order = sorted(range(len(rows)), key=lambda i: (-abs(rows[i][3]), i))
        rows = [rows[i] for i in order[:max_bins]]
    return Counterexample(result, scenarios.get(result.scenario), counts, rows)


def preview(values: Any, *, limit: int = 16) -> str | list[str]:
    """A compact rendering of a probability preview: one line for (V,), one line per row for (R, V)."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (list, tuple)) and values and all(isinstance(v, (list, tuple)) for v in values):
        return [f"row {i}: {preview(v, limit=limit)}" for i, v in enumerate(values)]
    flat = float_list(values)
    if flat is None:
        return str(values)
    shown = ", ".join(fmt(v, ".4g") if v != 0 else "0" for v in flat[:limit])
    return f"[{shown}{', ...' if len(flat) > limit else ''}] (V={len(flat)})"


# ----------------------------------------------------------------------------- acceptance


@dataclass(frozen=True)
class AcceptanceRow:
    position: Any
    observed: float
    expected: float
    n: float | None


@dataclass(frozen=True)
class AcceptanceScenario:
    name: str
    rows: list[AcceptanceRow]
    length_counts: list[float] | None
    length_probs: list[float] | None


def acceptance(report: Report) -> list[AcceptanceScenario]:
    """Parse ``extra["acceptance"]`` (shape documented in :mod:`specverify.report`); bad entries skipped."""
    data = report.extra.get("acceptance") if isinstance(report.extra, Mapping) else None
    if not isinstance(data, Mapping):
        return []
    out = []
    for name, entry in data.items():
        records = entry.get("positions") if isinstance(entry, Mapping) else entry
        rows = []
        for rec in records if isinstance(records, (list, tuple)) else ():
            if not isinstance(rec, Mapping):
                continue
            obs, exp = finite(rec.get("observed_rate")), finite(rec.get("expected_rate"))
            if obs is None or exp is None:
                continue
            rows.append(AcceptanceRow(rec.get("position", len(rows) + 1), obs, exp, finite(rec.get("n"))))
        counts = probs = None
        if isinstance(entry, Mapping):
            counts, probs = float_list(entry.get("length_counts")), float_list(entry.get("length_probs"))
            if counts is None or probs is None or len(counts) != len(probs):
                counts = probs = None
        if rows or counts:
            out.append(AcceptanceScenario(str(name), rows, counts, probs))
    return out


def other_extra(report: Report, *, exclude: Sequence[str] | set[str] = ()) -> dict[str, Any]:
    """``extra`` less the keys rendered in their own sections (``acceptance`` and ``exclude``)."""
    if not isinstance(report.extra, Mapping):
        return {}
    skip = {"acceptance", *exclude}
    return {k: v for k, v in report.extra.items() if k not in skip}

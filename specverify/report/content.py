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

from specverify.core.conformance import conformance_line, verdict_results
from specverify.core.conformance import count_phrase as conformance_count_phrase
from specverify.core.repro import is_python_repro
from specverify.core.results import (
    ERROR,
    FAIL,
    PASS,
    SUSPICIOUS,
    Report,
    TestResult,
    detectable_masses,
    effect_size,
    error_groups,
    is_error_record,
    rank_flagged,
    rank_key,
)

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
    "observed TV",
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
    """:func:`specverify.core.results.rank_key`: the one ordering of tests (the last four items are names)."""
    return rank_key(result)


def worst_first(results: Sequence[TestResult]) -> list[TestResult]:
    """Failures first, then suspicious, pass, ungraded; within a grade by adjusted p, then observed TV
    (:func:`specverify.core.results.rank_key`, the order of the terminal summary too)."""
    return sorted(results, key=sort_key)


def tested(report: Report) -> list[TestResult]:
    """The report's tests of the law: its results without the records of implementation errors
    (:func:`specverify.core.results.is_error_record`; the error section shows those, once)."""
    return [r for r in report.results if not is_error_record(r)]


def count_phrase(report: Report) -> str:
    """The report's tests as every rendering counts them (:func:`specverify.core.conformance.count_phrase`)."""
    return conformance_count_phrase(report.results, gate_conformance=bool(report.gate_conformance))


def verdict_tests(report: Report) -> list[TestResult]:
    """The tests the verdict is made of: the law's, and the rule-conformance ones when they gate it
    (:func:`specverify.core.conformance.verdict_results`)."""
    return verdict_results(report.results, gate_conformance=bool(report.gate_conformance))


def conformance_sentence(report: Report) -> str | None:
    """The report's rule-conformance line (grade, whether it gates, efficiency), or None without such tests."""
    return conformance_line(report.conformance)


def first_failure(report: Report) -> TestResult | None:
    """The failing test every part of a report names first (terminal, verdict, counterexample), or None."""
    return next((r for r in rank_flagged(verdict_tests(report)) if r.grade == FAIL), None)


def sentence_start(text: str) -> str:
    """``text`` with its first letter upper-case (the rest as it is)."""
    return text[:1].upper() + text[1:]


def errors_heading(report: Report) -> str:
    """``"Implementation errors: 14 of 14 scenarios could not be tested"`` (the error section's title)."""
    groups = error_groups(report)
    untested = {n for g in groups for n in g.scenarios}
    if untested:
        return (
            f"Implementation errors: {len(untested)} of {max(len(report.scenarios), 1)} scenarios could not be tested"
        )
    return f"Implementation errors ({len(report.errors)})"


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
    if isinstance(tokens, Mapping):  # {bin: token ids} for the small bins only (specverify.stats.gof)
        by_bin = {str(k): v for k, v in tokens.items()}
        tokens = [by_bin.get(str(i)) for i in range(len(observed))]
    if not isinstance(tokens, (list, tuple)) or len(tokens) != len(observed):
        tokens = [None] * len(observed)
    return observed, expected, list(tokens)


def bin_sizes(result: TestResult) -> list[float | None]:
    """Tokens per bin from ``details["tokens_per_bin"]``, or None per bin when not recorded."""
    details = result.details if isinstance(result.details, Mapping) else {}
    sizes = float_list(details.get("tokens_per_bin"))
    counts = counts_of(result)
    length = len(counts[0]) if counts else 0
    return list(sizes) if sizes is not None and len(sizes) == length else [None] * length


def bin_label(tokens: Any, index: int, *, limit: int = 6, size: float | None = None) -> str:
    """``"17"`` for a singleton bin, ``"3, 8, 9 (+12 more)"`` for a pooled one, ``"bin 4"`` if unknown
    (``"bin 4 (37 tokens)"`` when its ``size`` is known)."""
    if tokens is None:
        if size is not None and size > 1:
            return f"bin {index} ({int(size)} tokens)"
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
    largest, largest_result = max(with_tv, key=lambda pair: (pair[0], *sort_key(pair[1])[-4:]))
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
    masses = detectable_masses(report.results)
    if masses:
        text += ". Shifts of mass it would have caught: " + "; ".join(masses)
    shared = sorted(v for v in (finite(r.details.get("mde_shared_fraction")) for r in report.results) if v is not None)
    if shared:
        text += (
            f". Rows of one call tested in pairs would have shown dependence if {shared[len(shared) // 2]:.2%} of "
            f"the pairs shared one random number (median of {len(shared)} pair tests; best {shared[0]:.2%})"
        )
    return text + "."


def _observed_tv(result: TestResult) -> str:
    effect = effect_size(result)
    return "" if effect is None else f", observed TV {fmt(effect)}"


def _listing(results: Sequence[TestResult], limit: int = 5) -> str:
    parts = [
        f"{test_label(r)} (p={fmt(r.pvalue)}, adjusted p={fmt(r.adjusted_pvalue)}{_observed_tv(r)})"
        for r in results[:limit]
    ]
    if len(results) > limit:
        parts.append(f"and {len(results) - limit} more")
    return "; ".join(parts)


def _of_law(report: Report) -> str:
    """``" of the law"`` when the report holds rule-conformance tests the verdict does not count."""
    return " of the law" if not report.gate_conformance and report.conformance.tests else ""


def verdict_paragraph(report: Report) -> str:
    """One paragraph: the verdict and what it means (plain text; renderers escape it)."""
    results = worst_first(verdict_tests(report))
    failed = [r for r in results if r.grade == FAIL]
    suspicious = [r for r in results if r.grade == SUSPICIOUS]
    n = len(results)
    alpha = f"family-wise alpha {fmt(report.alpha)}"
    if report.verdict == PASS:
        return (
            f"PASS: no test detected a deviation from the target distribution. All {n} tests{_of_law(report)} "
            f"passed at "
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
    if report.verdict == ERROR:
        groups = error_groups(report)
        untested = {name for g in groups for name in g.scenarios}
        where = f" in {len(untested)} of {len(report.scenarios)} scenarios" if untested else ""
        ran = (
            f" {n} tests ran on the rest: {len(failed)} failed, {len(suspicious)} suspicious."
            if n
            else " No test of the distribution ran."
        )
        return (
            f"ERROR: the implementation could not be tested{where}: it raised, returned output of the wrong form "
            f"or broke the test protocol ({len(groups)} distinct error{'s' if len(groups) != 1 else ''}, each shown "
            f"once below with the scenarios that met it). Nothing is said about its distribution where it could "
            f"not be tested.{ran} The gate fails (exit status 2): fix the error and rerun."
        )
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
    """The counterexample of :func:`first_failure` (the same test the verdict and terminal name first), or None."""
    result = first_failure(report)
    if result is None:
        return None
    scenarios = scenario_map(report)
    counts = counts_of(result)
    rows = []
    if counts:
        observed, expected, tokens = counts
        sizes = bin_sizes(result)
        for i, (o, e, t) in enumerate(zip(observed, expected, tokens)):
            resid = (o - e) / math.sqrt(e) if e > 0 else (math.inf if o > 0 else 0.0)
            rows.append((bin_label(t, i, size=sizes[i]), o, e, resid))
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
    """``extra`` less the keys rendered in their own sections (``acceptance``, ``cpu_seconds`` and ``exclude``)."""
    if not isinstance(report.extra, Mapping):
        return {}
    skip = {"acceptance", "cpu_seconds", *exclude}
    return {k: v for k, v in report.extra.items() if k not in skip}


def timing_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The timings table: each scenario's wall seconds (and CPU seconds when recorded), to the 10 ms.

    ``(header, rows)``; no rows when the report has no timings.
    """
    timings = report.timings if isinstance(report.timings, Mapping) else {}
    cpu = report.extra.get("cpu_seconds") if isinstance(report.extra, Mapping) else None
    cpu = cpu if isinstance(cpu, Mapping) else {}
    header = ["part", "wall s"] + (["CPU s"] if cpu else [])
    rows = []
    for name, seconds in timings.items():
        row = [str(name), fmt(seconds, ",.2f")]
        rows.append(row + ([fmt(cpu.get(name), ",.2f")] if cpu else []))
    for name in (n for n in cpu if n not in timings):
        rows.append([str(name), "—", fmt(cpu[name], ",.2f")])
    return header, rows


#: At most this many rows of a nested section (the rest is in report.json).
READABLE_ROWS = 60


def readable_items(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A nested section as ``(path, text)`` rows for a reader: dotted paths, numbers to 4 figures, lists joined.

    A list of plain values reads ``"1, 2, 3"`` (the first 12, then how many more); a list of
    objects gives rows ``key[i].field``; at most :data:`READABLE_ROWS` rows in all.
    """
    rows: list[tuple[str, str]] = []

    def walk(value: Any, path: str) -> None:
        if len(rows) >= READABLE_ROWS:
            return
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (list, tuple)) and value and any(isinstance(v, (Mapping, list, tuple)) for v in value):
            for i, item in enumerate(value[:20]):
                walk(item, f"{path}[{i}]")
            if len(value) > 20:
                rows.append((path, f"... and {len(value) - 20} more"))
        else:
            rows.append((path, _plain(value)))

    walk(data, prefix)
    if len(rows) >= READABLE_ROWS:
        rows = rows[: READABLE_ROWS - 1] + [("...", "more in report.json")]
    return rows


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if isinstance(value, float):
        return fmt(value, ".4g")
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_plain(v) for v in value[:12])
        return shown + (f", ... ({len(value)} in all)" if len(value) > 12 else "") if value else "(none)"
    if isinstance(value, Mapping):
        return "(none)"
    return str(value)


# ----------------------------------------------------------------------------- scenarios

#: A configuration value longer than this (as text) is shown under its scenario's row, not in a column.
SHORT_VALUE = 28


def config_text(value: Any) -> str:
    """A configuration value as short plain text: ``{"sigma": 0.3}`` -> ``"sigma=0.3"``, ``{}``/``[]`` -> ``"—"``."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={config_text(v)}" for k, v in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(config_text(v) for v in value) or "—"
    if value is None:
        return "None"
    x = num(value)
    return fmt(x, ".6g") if isinstance(value, float) and x is not None else str(value)


@dataclass(frozen=True)
class ScenarioTable:
    """The Scenarios section: one row per scenario, one column per configuration key.

    ``common`` holds the keys with one value in every scenario (when there are at least 3
    scenarios), shown once above the table; ``notes`` per row the long values (the
    description first), shown under the row (HTML) or in a last column (Markdown);
    ``others`` the scenarios that are not mappings (shown as they are).
    """

    columns: list[str]
    rows: list[dict[str, str]]
    notes: list[list[tuple[str, str]]]
    common: list[tuple[str, str]]
    others: list[Any]


def scenario_table(report: Report) -> ScenarioTable | None:
    """Lay out ``report.scenarios`` (``*_preview`` keys left out: they belong to the counterexample)."""
    scenarios = [s for s in report.scenarios if isinstance(s, Mapping)]
    others = [s for s in report.scenarios if not isinstance(s, Mapping)]
    if not scenarios and not others:
        return None
    keys: list[str] = []
    for sc in scenarios:
        keys += [str(k) for k in sc if not str(k).endswith("_preview") and str(k) not in keys]
    texts = [{str(k): config_text(v) for k, v in sc.items() if not str(k).endswith("_preview")} for sc in scenarios]
    common: list[tuple[str, str]] = []
    if len(texts) >= 3:
        for key in keys:
            values = {t.get(key) for t in texts}
            if key != "name" and len(values) == 1 and None not in values:
                value = values.pop()
                if value is not None and len(value) <= SHORT_VALUE:
                    common.append((key, value))
    shared = {k for k, _ in common}
    long = [
        k for k in keys if k == "description" or (k != "name" and any(len(t.get(k, "")) > SHORT_VALUE for t in texts))
    ]
    long.sort(key=lambda k: k != "description")
    columns = [k for k in keys if k not in shared and k not in long]
    columns.sort(key=lambda k: k != "name")
    rows = [{k: t[k] for k in columns if k in t} for t in texts]
    notes = [[(k, t[k]) for k in long if k in t and k not in shared] for t in texts]
    return ScenarioTable(columns, rows, notes, common, others)

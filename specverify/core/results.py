"""Result records: one frozen dataclass per statistical test, and the run's Report.

``TestResult`` follows scipy.stats: ``statistic`` and ``pvalue`` first, then what a
reader needs to judge and reproduce the number (N, df, bins, the mass hidden in
multi-token bins, the minimum detectable binned TV at power 0.9, the allocated
alpha, the adjusted p-value and the grade).  ``Report`` is the whole run; its
``to_json`` is the one writer of the versioned report schema, from which the
Markdown and HTML reports are rendered.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "detectable_masses",
    "ERROR",
    "ErrorGroup",
    "FAIL",
    "PASS",
    "READABLE_SCHEMAS",
    "SCHEMA_VERSION",
    "SUSPICIOUS",
    "Grade",
    "Report",
    "TestResult",
    "effect_size",
    "error_groups",
    "protocol_result",
    "rank_flagged",
    "rank_key",
]

SCHEMA_VERSION = "specverify.report/2"
#: Schemas :meth:`Report.from_dict` reads.  Version 2 added ``gate_conformance`` and the derived
#: ``"conformance"`` object; a version-1 report reads back with ``gate_conformance=False`` (its
#: acceptance tests were graded in the law's budget then, which only made the law tests stricter).
READABLE_SCHEMAS = ("specverify.report/1", SCHEMA_VERSION)

PASS, SUSPICIOUS, FAIL = "pass", "suspicious", "fail"
Grade = str  # one of PASS, SUSPICIOUS, FAIL
#: A report's verdict when the implementation could not be tested: it raised, returned output
#: of the wrong form or broke the protocol (``Report.errors``); the command exits 2.
ERROR = "error"


def _jsonable(value: Any) -> Any:
    """Plain-JSON form of a value: floats stay floats (inf/nan as strings), tuples become lists."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return _jsonable(value.tolist())
    return value


def from_jsonable(cls: type, data: Any) -> Any:
    """Rebuild a (nested) frozen dataclass from its :func:`_jsonable` form.

    Fields are read by their annotations: nested dataclasses, ``tuple[X, ...]`` of them,
    ``X | None``, and floats written as ``"nan"``/``"inf"`` strings; keys that are not fields
    (e.g. a derived ``label``) are ignored; anything else is taken as it is.
    """
    import typing

    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: _value_of(hints.get(k, Any), v) for k, v in data.items() if k in names}
    return cls(**values)


def _value_of(hint: Any, value: Any) -> Any:
    import types
    import typing

    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _value_of(options[0], value) if len(options) == 1 else value
    if origin is tuple and isinstance(value, list):
        item = args[0] if args else Any
        return tuple(_value_of(item, v) for v in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return from_jsonable(hint, value)
    if hint is float and isinstance(value, str):
        return float(value)
    return value


@dataclass(frozen=True)
class TestResult:
    """Outcome of one statistical test.

    Attributes
    ----------
    statistic : float
        The test statistic (its meaning is given by ``method``).
    pvalue : float
        Unadjusted p-value; 0.0 for a certain failure (e.g. a support violation).
    name : str
        Short test name, e.g. ``"gof"``, ``"support"``, ``"pit_p"``.
    family : str
        Error-budget family the test belongs to (``"gof"``, ``"support"``,
        ``"directed"``, ``"acceptance"``, ``"independence"``, ``"two_sample"``,
        ``"consistency"``, ``"greedy"``, ``"protocol"``).
    method : str
        Human-readable description of statistic and reference distribution.
    n : int
        Number of samples the test used.
    df : float or None
        Degrees of freedom of the chi-square reference, when there is one.
    bins : int or None
        Number of bins (after pooling) for binned tests.
    multi_token_mass : float or None
        Probability mass in bins holding more than one token (deviations inside
        such a bin are invisible to the test).
    mde_tv : float or None
        Minimum binned total-variation distance detectable at power 0.9 with this
        N, df and the allocated alpha.
    alpha : float or None
        Alpha allocated to this test by the run's error budget.
    adjusted_pvalue : float or None
        Weighted-Holm adjusted p-value within the run.
    grade : str or None
        ``"pass"``, ``"suspicious"`` or ``"fail"`` once graded.
    scenario : str
        Name of the scenario that produced the samples.
    position : str
        Where in the sequence the test looked (``"abs=3"``, ``"block=2"``, ``"node=..."``).
    details : Mapping
        Anything else a reader needs: observed and expected counts per bin,
        offending token ids, the stopping sample count of an e-process, ...
    """

    statistic: float
    pvalue: float
    name: str
    family: str
    method: str
    n: int
    df: float | None = None
    bins: int | None = None
    multi_token_mass: float | None = None
    mde_tv: float | None = None
    alpha: float | None = None
    adjusted_pvalue: float | None = None
    grade: Grade | None = None
    scenario: str = ""
    position: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    def replace(self, **changes) -> TestResult:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return _jsonable(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TestResult:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("statistic", "pvalue"):
            if isinstance(values.get(key), str):
                values[key] = float(values[key])
        return cls(**values)

    def summary(self) -> str:
        """One line: family/name at scenario/position, statistic, p, N, grade."""
        where = "/".join(x for x in (self.scenario, self.position) if x)
        tv = f", detectable TV {self.mde_tv:.3g}" if self.mde_tv is not None else ""
        adj = f", adjusted p={self.adjusted_pvalue:.3g}" if self.adjusted_pvalue is not None else ""
        effect = effect_size(self)
        observed = f", observed TV {effect:.3g}" if effect is not None else ""
        return (
            f"[{(self.grade or '?').upper()}] {self.family}/{self.name} {where}: "
            f"statistic={self.statistic:.4g}, p={self.pvalue:.3g}{adj}, N={self.n}{observed}{tv}"
        )


#: Rank of each grade in :func:`rank_key` (ungraded tests last).
GRADE_RANK = {FAIL: 0, SUSPICIOUS: 1, PASS: 2}


def _number(value: Any) -> float | None:
    """``value`` as a float (``"nan"``/``"inf"`` strings and numpy scalars included), or None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _numbers(value: Any) -> list[float] | None:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = [x for x in (_number(v) for v in value) if x is not None and math.isfinite(x)]
    return out if len(out) == len(value) else None


def effect_size(result: TestResult) -> float | None:
    """The deviation a test observed, on the total-variation scale; None when it recorded none.

    Read from ``details`` (so it works on a report read back from JSON):

    - per-bin counts (``observed`` and ``expected`` lists of one length, as the binned
      goodness-of-fit tests record): the observed binned TV ``1/2 sum_i |o_i/O - e_i/E|``;
    - an acceptance test (``observed_rate``, ``expected_rate``): ``|observed - expected|``,
      the TV between the observed and the exact accept/reject law;
    - a single-count goodness-of-fit test (scalar ``observed``/``expected`` counts of one
      token, as the sparse test records): ``|observed - expected| / N``, a lower bound on the
      TV (``TV >= |Q(A) - P(A)|`` for any event A).

    Other tests (directed scores, collisions, support, protocol) carry no TV-scale effect and
    get None: they rank after the tests that record one at the same adjusted p.
    """
    details = result.details if isinstance(result.details, Mapping) else {}
    observed, expected = _numbers(details.get("observed")), _numbers(details.get("expected"))
    if observed is not None and expected is not None and len(observed) == len(expected):
        total_o, total_e = sum(observed), sum(expected)
        if total_o > 0 and total_e > 0:
            return 0.5 * sum(abs(o / total_o - e / total_e) for o, e in zip(observed, expected))
        return None
    rate_o, rate_e = _number(details.get("observed_rate")), _number(details.get("expected_rate"))
    if rate_o is not None and rate_e is not None and math.isfinite(rate_o - rate_e):
        return abs(rate_o - rate_e)
    count_o, count_e, n = _number(details.get("observed")), _number(details.get("expected")), _number(result.n)
    if result.family == "gof" and count_o is not None and count_e is not None and n and n > 0:
        value = abs(count_o - count_e) / n
        return value if math.isfinite(value) else None
    return None


def rank_key(result: TestResult) -> tuple:
    """The one ordering of tests, worst first, used everywhere a report names "the first failure".

    By grade (fail, suspicious, pass, ungraded), then adjusted p ascending (the raw p when
    there is no adjusted one; NaN last), then :func:`effect_size` descending (tests without
    one after those with one), then raw p, then family, name, scenario and position (so the
    order is total and deterministic).  The terminal summary (:meth:`Report.summary`), the
    verdict paragraph and test table of the Markdown/HTML reports and the counterexample
    they show all take their first failure from this order.
    """
    adjusted = math.inf
    for value in (result.adjusted_pvalue, result.pvalue):
        x = _number(value)
        if x is not None:
            adjusted = math.inf if math.isnan(x) else x
            break
    raw = _number(result.pvalue)
    raw = math.inf if raw is None or math.isnan(raw) else raw
    effect = effect_size(result)
    return (
        GRADE_RANK.get(result.grade or "", 3),
        adjusted,
        -effect if effect is not None else math.inf,
        raw,
        str(result.family),
        str(result.name),
        str(result.scenario),
        str(result.position),
    )


def rank_flagged(results: Sequence[TestResult]) -> list[TestResult]:
    """The failed and suspicious tests in :func:`rank_key` order: element 0 is the first failure."""
    return sorted((r for r in results if r.grade in (FAIL, SUSPICIOUS)), key=rank_key)


def _unrecorded_command(report: Report) -> str:
    """The ``command`` of a report whose producer recorded none: a Python comment saying what is known."""
    return (
        f"# Python: how this {report.kind} run was started was not recorded; it audited "
        f"{report.implementation} at tier={report.tier!r}, seed={report.seed!r}, alpha={report.alpha!r}."
    )


@dataclass(frozen=True)
class Report:
    """The outcome of one specverify run.

    Attributes
    ----------
    kind : str
        ``"verifier"``, ``"decoder"`` or ``"drafter"``.
    implementation : str
        Name of the implementation under test (``module:name`` or repr).
    tier, seed, alpha
        The run's tier, root seed and family-wise error rate.
    verdict : str
        ``"pass"``, ``"suspicious"`` (warns, passes the gate), ``"fail"`` (a test of the law
        failed) or ``"error"`` (the implementation could not be tested: ``errors`` says why).
        Rule-conformance tests (acceptance against the declared rule,
        :mod:`specverify.core.conformance`) count only when ``gate_conformance`` is set.
    results : tuple of TestResult
        Every graded test.
    errors : tuple of str
        ``ImplementationError`` messages, ``"<scenario>: <what happened>"`` (the implementation
        raised, returned output of the wrong form or broke the protocol); any makes the verdict
        ``"error"``.  :func:`error_groups` folds the scenarios that met the same error.
    scenarios : tuple of dict
        The configuration of every scenario that ran (enough to reproduce it).
    timings : dict
        Seconds per scenario and in total.
    environment : dict
        Versions of specverify, torch, numpy, scipy, python; device.
    extra : dict
        Kind-specific sections (e.g. a drafter audit's efficiency table).
    command : str
        How to reproduce the run, recorded from what ran: the canonical ``specverify audit ...``
        line of a command-line run (every spec, factory option, tier, seed, alpha and filter),
        or a Python snippet (first line starting with ``# Python``, see
        :mod:`specverify.core.repro`) for a run started from Python with plain objects.
        Never empty: a report built without one gets a snippet comment naming what is known.
    gate_conformance : bool
        Whether rule conformance is part of the verdict (``gate_conformance=True`` of the run).
        :attr:`conformance` summarises it either way.
    """

    kind: str
    implementation: str
    tier: str
    seed: int
    alpha: float
    verdict: str
    results: tuple[TestResult, ...] = ()
    errors: tuple[str, ...] = ()
    scenarios: tuple[Mapping[str, Any], ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    environment: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    command: str = ""
    gate_conformance: bool = False

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", _unrecorded_command(self))

    @property
    def passed(self) -> bool:
        """The gate: True unless the verdict is ``"fail"`` or ``"error"``."""
        return self.verdict not in (FAIL, ERROR)

    @property
    def failures(self) -> tuple[TestResult, ...]:
        return tuple(r for r in self.results if r.grade == FAIL)

    @property
    def conformance(self):
        """The run's rule conformance and efficiency (:func:`specverify.core.conformance.conformance_of`)."""
        from specverify.core.conformance import conformance_of

        return conformance_of(self.results, gated=self.gate_conformance)

    def to_dict(self) -> dict:
        data = {"schema": SCHEMA_VERSION, "passed": self.passed}
        data.update(_jsonable(self))
        data["conformance"] = _jsonable(self.conformance.to_dict())
        from specverify.core.conformance import test_counts

        data["test_counts"] = test_counts(self.results)  # derived: the counts every rendering states
        return data

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping) -> Report:
        schema = data.get("schema")
        if schema not in READABLE_SCHEMAS:
            from specverify.core.errors import InvalidArgument

            raise InvalidArgument(f"report schema {schema!r} is not supported (expected one of {READABLE_SCHEMAS})")
        from specverify.core.report_schema import checked_report

        data = checked_report(data)  # InvalidArgument naming the first field of the wrong type
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["results"] = tuple(TestResult.from_dict(r) for r in values.get("results", ()))
        values["errors"] = tuple(values.get("errors", ()))
        values["scenarios"] = tuple(values.get("scenarios", ()))
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))

    def summary(self) -> str:
        """A one-screen text summary (kind-specific sections: :func:`specverify.report.terminal_summary`)."""
        from specverify.core.conformance import conformance_line, count_phrase, verdict_results

        untested = " (the implementation could not be tested)" if self.verdict == ERROR else ""
        tests = verdict_results(self.results, gate_conformance=self.gate_conformance)
        lines = [
            f"specverify {self.kind} audit of {self.implementation}: {self.verdict.upper()}{untested}",
            f"tier={self.tier} seed={self.seed} alpha={self.alpha:g} "
            f"{count_phrase(self.results, gate_conformance=self.gate_conformance)} "
            f"time={self.timings.get('total', float('nan')):.1f}s",
        ]
        for group in error_groups(self):
            lines.append(f"  implementation error{group.where(prefix=' ')}: {group.message}")
        flagged = rank_flagged(tests)
        counts = {g: sum(r.grade == g for r in tests) for g in (FAIL, SUSPICIOUS, PASS)}
        untested_scenarios = {n for g in error_groups(self) for n in g.scenarios}
        not_run = (
            f"; {len(untested_scenarios)} of {len(self.scenarios)} scenarios not tested" if untested_scenarios else ""
        )
        lines.append(f"  {counts[FAIL]} failed, {counts[SUSPICIOUS]} suspicious, {counts[PASS]} passed{not_run}")
        if flagged:
            lines.append("  flagged tests, first failure first (lowest adjusted p, then largest observed TV):")
        lines += ["  " + r.summary() for r in flagged[:10]]
        if len(flagged) > 10:
            lines.append(f"  ... and {len(flagged) - 10} more flagged tests (see the report)")
        rule = conformance_line(self.conformance)
        if rule:
            lines.append("  " + rule)
        fidelity = self.extra.get("logprob_fidelity") if isinstance(self.extra, Mapping) else None
        if isinstance(fidelity, Mapping) and isinstance(fidelity.get("line"), str):  # its own line (endpoint audits)
            lines.append("  " + fidelity["line"])
        tvs = sorted(r.mde_tv for r in self.results if isinstance(r.mde_tv, float) and math.isfinite(r.mde_tv))
        if tvs:
            n = sum(r.n for r in self.results if r.family == "gof")
            lines.append(
                f"  detectable binned TV at power 0.9: median {tvs[len(tvs) // 2]:.3g}, best {tvs[0]:.3g}, "
                f"worst {tvs[-1]:.3g} over {len(tvs)} tests ({n:,} tokens in goodness-of-fit strata)"
            )
        masses = detectable_masses(self.results)
        if masses:
            lines.append("  detectable mass shifts at power 0.9: " + "; ".join(masses))
        shared = sorted(
            v
            for v in (r.details.get("mde_shared_fraction") for r in tests)
            if isinstance(v, float) and math.isfinite(v)
        )
        if shared:  # the dependence family (specverify.stats.dependence): pairs of rows of one call
            lines.append(
                f"  detectable dependence at power 0.9: {shared[len(shared) // 2]:.2%} of row pairs sharing one uniform "
                f"(median of {len(shared)} pair tests; best {shared[0]:.2%})"
            )
        return "\n".join(lines)


def detectable_masses(results: Sequence[TestResult]) -> list[str]:
    """Phrases for the mass shifts the run could detect at power 0.9, one per kind of set.

    Set-mass tests (``details["set"]``, :func:`specverify.stats.set_mass_test`): the smallest and
    largest detectable shift of each set's mass; support tests: the mass on ids of probability 0
    seen with probability 0.9 (median over the tests).
    """
    by_set: dict[str, list[float]] = {}
    zero: list[float] = []
    for r in results:
        d = r.details if isinstance(r.details, Mapping) else {}
        m = _number(d.get("mde_mass"))
        if m is None or not math.isfinite(m):
            continue
        if r.family == "support":
            zero.append(m)
        elif isinstance(d.get("set"), str):
            by_set.setdefault(d["set"], []).append(m)
    out = []
    for label, values in by_set.items():
        span = f"{min(values):.3g}" if len(values) == 1 else f"{min(values):.3g}-{max(values):.3g}"
        out.append(f"{span} of the mass in {label} ({len(values)} test{'s' if len(values) > 1 else ''})")
    if zero:
        zero.sort()
        out.append(f"{zero[len(zero) // 2]:.3g} on ids of probability 0 (median of {len(zero)} support tests)")
    return out


def is_error_record(result: TestResult) -> bool:
    """Whether ``result`` only records an implementation error (a protocol result holding its message).

    Such a record is not a test of the law: reports show its error (once, in
    :func:`error_groups`) instead of listing it among failed tests.
    """
    details = result.details if isinstance(result.details, Mapping) else {}
    return result.family == "protocol" and bool(details.get("error"))


@dataclass(frozen=True)
class ErrorGroup:
    """One implementation error and the scenarios that met it (in the order they ran)."""

    message: str
    scenarios: tuple[str, ...]
    total: int  # scenarios in the run

    def where(self, limit: int = 3, *, prefix: str = "") -> str:
        """``"in pos8_uniform_k4"``, ``"in 14 of 14 scenarios (pos8_uniform_k4, pos16_noisy_k1, ...)"``;
        ``""`` when no scenario is known (``prefix`` goes before a non-empty answer)."""
        if not self.scenarios:
            return ""
        if len(self.scenarios) == 1:
            return f"{prefix}in {self.scenarios[0]}"
        shown = ", ".join(self.scenarios[:limit]) + (", ..." if len(self.scenarios) > limit else "")
        return f"{prefix}in {len(self.scenarios)} of {self.total} scenarios ({shown})"


def error_groups(report: Report) -> list[ErrorGroup]:
    """``report.errors`` with the scenarios that met the same error folded into one group.

    An error reads ``"<scenario>: <message>"`` when a scenario of the run (``report.scenarios``
    names) prefixes it; errors with equal messages form one group, in order of first appearance.
    """
    names = [str(s.get("name")) for s in report.scenarios if isinstance(s, Mapping) and s.get("name") is not None]
    by_length = sorted(set(names), key=len, reverse=True)
    groups: dict[str, list[str]] = {}
    for error in report.errors:
        text = str(error)
        scenario = next((n for n in by_length if text.startswith(n + ": ")), None)
        message = text[len(scenario) + 2 :] if scenario is not None else text
        groups.setdefault(message, [])
        if scenario is not None and scenario not in groups[message]:
            groups[message].append(scenario)
    return [ErrorGroup(message, tuple(where), max(len(names), 1)) for message, where in groups.items()]


def protocol_result(scenario: str, error: str | None, n: int, *, method: str, position: str = "") -> TestResult:
    """The exact (not statistical) record of an implementation's protocol checks.

    ``error`` None: passed (statistic 0, p 1); otherwise failed (statistic 1, p 0) with the
    message in ``details["error"]``.  ``method`` says what was checked.
    """
    return TestResult(
        statistic=0.0 if error is None else 1.0,
        pvalue=1.0 if error is None else 0.0,
        name="protocol",
        family="protocol",
        method=method,
        n=n,
        scenario=scenario,
        position=position,
        details={} if error is None else {"error": error},
    )

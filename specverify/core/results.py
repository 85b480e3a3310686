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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAIL", "PASS", "SCHEMA_VERSION", "SUSPICIOUS", "Grade", "Report", "TestResult", "protocol_result"]

SCHEMA_VERSION = "specverify.report/1"

PASS, SUSPICIOUS, FAIL = "pass", "suspicious", "fail"
Grade = str  # one of PASS, SUSPICIOUS, FAIL


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
        return (
            f"[{(self.grade or '?').upper()}] {self.family}/{self.name} {where}: "
            f"statistic={self.statistic:.4g}, p={self.pvalue:.3g}{adj}, N={self.n}{tv}"
        )


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
        ``"pass"``, ``"suspicious"`` (warns, passes the gate) or ``"fail"``.
    results : tuple of TestResult
        Every graded test.
    errors : tuple of str
        ``ImplementationError`` messages (protocol violations); any makes the verdict ``"fail"``.
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

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", _unrecorded_command(self))

    @property
    def passed(self) -> bool:
        """The gate: True unless the verdict is ``"fail"``."""
        return self.verdict != FAIL

    @property
    def failures(self) -> tuple[TestResult, ...]:
        return tuple(r for r in self.results if r.grade == FAIL)

    def to_dict(self) -> dict:
        data = {"schema": SCHEMA_VERSION, "passed": self.passed}
        data.update(_jsonable(self))
        return data

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping) -> Report:
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            from specverify.core.errors import InvalidArgument

            raise InvalidArgument(f"report schema {schema!r} is not supported (expected {SCHEMA_VERSION!r})")
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
        """A one-screen text summary."""
        lines = [
            f"specverify {self.kind} audit of {self.implementation}: {self.verdict.upper()}",
            f"tier={self.tier} seed={self.seed} alpha={self.alpha:g} tests={len(self.results)} "
            f"time={self.timings.get('total', float('nan')):.1f}s",
        ]
        lines += [f"  implementation error: {e}" for e in self.errors]
        flagged = [r for r in self.results if r.grade in (FAIL, SUSPICIOUS)]
        counts = {g: sum(r.grade == g for r in self.results) for g in (FAIL, SUSPICIOUS, PASS)}
        lines.append(f"  {counts[FAIL]} failed, {counts[SUSPICIOUS]} suspicious, {counts[PASS]} passed")
        flagged.sort(key=lambda r: (r.grade != FAIL, r.adjusted_pvalue if r.adjusted_pvalue is not None else r.pvalue))
        lines += ["  " + r.summary() for r in flagged[:10]]
        if len(flagged) > 10:
            lines.append(f"  ... and {len(flagged) - 10} more flagged tests (see the report)")
        tvs = sorted(r.mde_tv for r in self.results if isinstance(r.mde_tv, float) and math.isfinite(r.mde_tv))
        if tvs:
            n = sum(r.n for r in self.results if r.family == "gof")
            lines.append(
                f"  detectable binned TV at power 0.9: median {tvs[len(tvs) // 2]:.3g}, best {tvs[0]:.3g}, "
                f"worst {tvs[-1]:.3g} over {len(tvs)} tests ({n:,} tokens in goodness-of-fit strata)"
            )
        return "\n".join(lines)


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

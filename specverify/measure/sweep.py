"""The trade-off curve of a lossy knob: distance from the target vs what it buys.

:func:`sweep` measures one verifier per value of one knob (HF's ensemble weight,
Medusa's typical ``posterior_threshold`` / ``posterior_alpha``, SGLang's thresholds)
with :func:`specverify.measure.chain.measure_divergence`, on one scenario with one
seed, and records per value:

* the TV point estimate inside its confidence interval at every absolute position
  (``abs=0..L-1``) and in-block position 2..K+1 (in-block position 1 is ``abs=0``), and the mean TV per emitted token over the
  absolute positions with a simultaneous (Bonferroni) interval
  (:class:`specverify.measure.chain.OverallTV`);
* the declared law's exact TV and the conformance verdict, when the verifier declares
  its law (``verify.declared_law``, as the factories of ``reference.lossy`` and
  :mod:`specverify.adapters.medusa` provide) or ``declared_law(value)`` is given;
* tokens per target pass (measured) and the memory-bound speedup of the cost model
  (:func:`specverify.measure.costmodel.speedup`: ``E[tokens per round] / (c K + 1)``
  with the measured acceptance rate per in-block position and a drafter pass costing
  ``c = draft_cost`` target passes).

``kind="tree"`` sweeps a tree verifier (``make_verify(value)`` returns a ``verify_tree``
callable) over a tree scenario with
:func:`specverify.measure.tree.measure_tree_divergence`: the in-round strata are the
depths ``depth=j``, K is the scenario's maximum depth (the cost model then charges one
drafter pass per depth), and no declared law is taken.

Every value is measured with the same seed (common random numbers), so differences
between neighbouring values are not sampling noise of independent runs.  Intervals are
per stratum at ``level``; the overall one is simultaneous over positions, not over values.

:mod:`specverify.report.sweep` renders the result (Markdown, HTML with the plot);
``specverify measure --sweep KEY=V1,V2,...`` is the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specverify.core.errors import InvalidArgument
from specverify.core.results import _jsonable, from_jsonable
from specverify.core.validation import check_int
from specverify.measure.chain import MeasureResult, declared_law_of, estimate_mark, estimate_notes, measure_divergence
from specverify.measure.costmodel import expected_tokens_per_round, speedup
from specverify.measure.tree import measure_tree_divergence

__all__ = ["SweepPoint", "SweepResult", "sweep", "DEFAULT_DRAFT_COST", "KINDS"]

#: Drafter pass cost in target passes used when none is given (a small head or EAGLE-like drafter).
DEFAULT_DRAFT_COST = 0.05
#: What a sweep measures: chain verifiers (:func:`measure_divergence`) or tree verifiers.
KINDS = ("chain", "tree")


@dataclass(frozen=True)
class SweepPoint:
    """One knob value: its measurement, tokens per target pass and the modelled speedup."""

    value: Any
    tokens_per_pass: float
    expected_tokens_per_round: float  # 1 + a_1 + a_1 a_2 + ... from the measured acceptance rates
    speedup: float  # expected_tokens_per_round / (draft_cost K + 1)
    measure: MeasureResult

    @property
    def label(self) -> str:
        return _label(self.value)


@dataclass(frozen=True)
class SweepResult:
    """A knob swept over values (see :func:`sweep`); ``to_dict`` is its JSON form."""

    knob: str
    subject: str
    scenario: str
    k: int
    tier: str
    seed: int
    level: float
    draft_cost: float
    points: tuple[SweepPoint, ...]
    command: str | None = None  # the command line that regenerates it, when run from the CLI or a script
    kind: str = "chain"  # "tree": tree verifier over a tree scenario, k = its maximum depth

    def to_dict(self) -> dict:
        data = _jsonable(self)
        for point, raw in zip(data["points"], self.points):
            point["label"] = raw.label
        return data

    @classmethod
    def from_dict(cls, data) -> SweepResult:
        """The sweep of :meth:`to_dict`'s form (e.g. a ``sweep.json`` read back, to render it again).

        A knob value JSON wrote as a list was a tuple (a knob of several options): it is one again.
        """
        points = [{**p, "value": tuple(p["value"]) if isinstance(p.get("value"), list) else p.get("value")}
                  for p in data.get("points", ())]  # fmt: skip
        return from_jsonable(cls, {**data, "points": points})

    @property
    def verdicts(self) -> tuple[str | None, ...]:
        """Conformance verdict to the declared law per value (None without a declared law)."""
        return tuple(p.measure.conformance_verdict for p in self.points)

    @property
    def verdict_word(self) -> str:
        """``"CONFORMS"``, ``"DOES NOT CONFORM"`` (any value fails its declared law) or ``"NO DECLARED LAW"``."""
        graded = [v for v in self.verdicts if v is not None]
        if not graded:
            return "NO DECLARED LAW"
        return "DOES NOT CONFORM" if "fail" in graded else "CONFORMS"

    @property
    def verdict_grade(self) -> str:
        """The sweep's grade: ``"fail"``, ``"suspicious"``, ``"pass"``, or ``"none"`` without a declared law."""
        graded = [v for v in self.verdicts if v is not None]
        if not graded:
            return "none"
        return "fail" if "fail" in graded else "suspicious" if "suspicious" in graded else "pass"

    def verdict_line(self) -> str:
        """The answer first: conformance to the declared law over the settings, then the trade-off's two ends.

        E.g. ``"CONFORMS to the declared law at 5/5 settings; 1 SUSPICIOUS (weight=0.3: a warning, the
        gate passes). Best modelled speedup 3.70x at weight=0.1 (mean TV/token 0.464); closest to the
        target: weight=0.9 (mean TV/token 0.055, 1.53x)."``
        """
        names = [f"{self.knob}={p.label}" for p in self.points]
        graded = [(name, v) for name, v in zip(names, self.verdicts) if v is not None]
        failing = [name for name, v in graded if v == "fail"]
        suspicious = [name for name, v in graded if v == "suspicious"]
        ungraded = [name for name, v in zip(names, self.verdicts) if v is None]
        word = self.verdict_word
        if not graded:
            what = "a tree rule's law depends on the whole drafted tree" if self.kind == "tree" else "none was given"
            parts = [f"{word}: conformance is not graded at any of the {len(names)} settings ({what})"]
        elif failing:
            parts = [f"{word} to the declared law at {len(failing)}/{len(graded)} settings ({', '.join(failing)})"]
        else:
            parts = [f"{word} to the declared law at {len(graded)}/{len(graded)} settings"]
        if suspicious:
            parts.append(
                f"{len(suspicious)} SUSPICIOUS ({', '.join(suspicious)}: a warning, the gate passes; rerun with "
                "another --seed)"
            )
        if graded and ungraded:
            parts.append(f"no declared law at {', '.join(ungraded)}")
        text = "; ".join(parts) + "."
        measured = [p for p in self.points if p.measure.overall is not None]
        if measured:
            fast = max(measured, key=lambda p: p.speedup)
            close = min(measured, key=lambda p: p.measure.overall.tv)  # type: ignore[union-attr]
            tv = lambda p: f"mean TV/token {p.measure.overall.tv:.3f}"  # noqa: E731
            if fast is close:
                text += f" Best modelled speedup and smallest TV both at {self.knob}={fast.label}: {fast.speedup:.2f}x, {tv(fast)}."
            else:
                text += (
                    f" Best modelled speedup {fast.speedup:.2f}x at {self.knob}={fast.label} ({tv(fast)}); closest to "
                    f"the target: {self.knob}={close.label} ({tv(close)}, {close.speedup:.2f}x)."
                )
        return text

    def summary(self) -> str:
        """Plain-text table: value, mean TV per token with its interval, per-position intervals, tokens per pass, speedup."""
        head = (
            f"{self.subject}: {self.knob} swept on {self.scenario} ({'D' if self.kind == 'tree' else 'K'}={self.k}, tier={self.tier}, seed={self.seed}, "
            f"{self.level:.0%} intervals, draft cost {self.draft_cost:g} target passes)"
        )
        lines = [self.verdict_line(), head, f"{'value':>8} {'mean TV/token [interval]':>30} {'declared':>8} {'tok/pass':>8} "
                 f"{'speedup':>7} {'conformance':>11}  in-block TV intervals"]  # fmt: skip
        marks = set()
        for p in self.points:
            o = p.measure.overall
            declared = "" if o is None or o.declared_tv is None else f"{o.declared_tv:.4f}"
            mark = "" if o is None else estimate_mark(o)
            marks.add(mark)
            overall = "" if o is None else f"{o.tv:.4f}{mark} [{o.tv_lower:.4f}, {o.tv_upper:.4f}]"
            blocks = " ".join(
                f"{s.stratum.split('=')[1]}:[{s.estimate.tv_lower:.3f},{s.estimate.tv_upper:.3f}]"
                for s in p.measure.by_block
            )
            verdict = p.measure.conformance_verdict or "-"
            lines.append(
                f"{p.label:>8} {overall:>30} {declared:>8} {p.tokens_per_pass:>8.3f} {p.speedup:>7.3f} "
                f"{verdict:>11}  {blocks}"
            )
        return "\n".join(lines + estimate_notes(marks))


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _check_draft_cost(draft_cost) -> float:
    if isinstance(draft_cost, bool) or not isinstance(draft_cost, (int, float)) or not math.isfinite(draft_cost):
        raise InvalidArgument(f"draft_cost must be a finite number >= 0, got {draft_cost!r}")
    if draft_cost < 0:
        raise InvalidArgument(f"draft_cost must be a finite number >= 0, got {draft_cost!r}")
    return float(draft_cost)


def sweep(
    make_verify: Callable[[Any], Callable],
    values: Sequence[Any],
    *,
    scenario=None,
    tier: str = "smoke",
    seed: int = 0,
    level: float = 0.95,
    draft_cost: float = DEFAULT_DRAFT_COST,
    declared_law: Callable[[Any], Callable | None] | None = None,
    knob: str = "value",
    subject: str | None = None,
    alpha: float = 1e-3,
    batch_size: int | None = None,
    length: int | None = None,
    progress: Callable[[str], None] | None = None,
    command: str | None = None,
    kind: str = "chain",
) -> SweepResult:
    """Measure ``make_verify(value)`` for every value: TV with confidence bands vs tokens per pass and speedup.

    Parameters
    ----------
    make_verify : callable
        ``make_verify(value) -> verify``, a chain verifier (protocol of
        :func:`specverify.measure.chain.measure_divergence`), or with ``kind="tree"`` a
        tree verifier (:mod:`specverify.protocols.tree`).
    values : sequence
        Knob values in the order to report them (at least one).
    scenario : str or Scenario or TreeScenario, optional
        Battery scenario (default :data:`specverify.measure.chain.DEFAULT_SCENARIO`; with
        ``kind="tree"`` a tree scenario, default
        :data:`specverify.measure.tree.DEFAULT_TREE_SCENARIO`).
    tier, seed, level, alpha, batch_size, length
        As in :func:`~specverify.measure.chain.measure_divergence`; the same seed for every value.
    draft_cost : float, default :data:`DEFAULT_DRAFT_COST`
        One drafter pass in target passes, for the memory-bound speedup ``E[tokens] / (c K + 1)``.
    declared_law : callable, optional
        ``declared_law(value) -> law or None``; default: the verifier's ``declared_law``
        attribute if it has one.
    knob, subject : str
        Names for the report: the knob swept and what was measured.
    progress : callable, optional
        Called with one line per measured value.
    command : str, optional
        The command that regenerates this sweep, recorded in the result and its reports.
    kind : {"chain", "tree"}, default "chain"
        What ``make_verify`` builds (see the module docstring); a tree sweep takes no
        ``declared_law`` and no ``alpha`` (there is no conformance test).

    Returns
    -------
    SweepResult

    Raises
    ------
    InvalidArgument
        Bad arguments (naming the argument and its value).
    ImplementationError
        A verifier raised or violated its protocol.
    """
    if not callable(make_verify):
        raise InvalidArgument(f"make_verify must be callable (value -> verify), got {make_verify!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise InvalidArgument(f"values must be a non-empty sequence of knob values, got {values!r}")
    if declared_law is not None and not callable(declared_law):
        raise InvalidArgument(f"declared_law must be callable (value -> law), got {declared_law!r}")
    if not isinstance(knob, str) or not knob:
        raise InvalidArgument(f"knob must be a non-empty string, got {knob!r}")
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "tree" and declared_law is not None:
        raise InvalidArgument(f"declared_law applies to chain sweeps, not to kind='tree', got {declared_law!r}")
    seed = check_int("seed", seed, minimum=0)
    draft_cost = _check_draft_cost(draft_cost)
    points = []
    for value in values:
        verify = make_verify(value)
        if not callable(verify):
            raise InvalidArgument(f"make_verify({value!r}) must return a verify callable, got {verify!r}")
        common = dict(scenario=scenario, tier=tier, seed=seed, level=level, batch_size=batch_size, length=length)
        if kind == "tree":
            result = measure_tree_divergence(verify, **common)
        else:
            law = declared_law_of(verify, declared_law(value) if declared_law is not None else None)
            result = measure_divergence(verify, declared_law=law, alpha=alpha, **common)
        points.append(_point(value, result, draft_cost))
        _report(progress, knob, value, result)
    first = points[0].measure
    return SweepResult(
        knob=knob,
        subject=str(subject or getattr(make_verify, "__name__", type(make_verify).__name__)),
        scenario=first.scenario,
        k=first.k,
        tier=tier,
        seed=seed,
        level=level,
        draft_cost=draft_cost,
        points=tuple(points),
        command=command,
        kind=kind,
    )


def _point(value, result: MeasureResult, draft_cost: float) -> SweepPoint:
    rates = [0.0 if math.isnan(a) else a for a in result.acceptance_by_block]
    return SweepPoint(
        value=value,
        tokens_per_pass=result.tokens_per_pass,
        expected_tokens_per_round=expected_tokens_per_round(rates, result.k),
        speedup=speedup(rates, result.k, draft_cost),
        measure=result,
    )


def _report(progress, knob: str, value, result: MeasureResult) -> None:
    if progress is not None:
        o = result.overall
        band = "" if o is None else f" mean TV {o.tv:.4f} [{o.tv_lower:.4f}, {o.tv_upper:.4f}]"
        progress(f"{knob}={_label(value)}:{band} tokens/pass {result.tokens_per_pass:.3f}")

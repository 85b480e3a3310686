"""Drafter-audit sections of a report: the diagnosis and the efficiency numbers, format-independent.

:func:`specverify.drafter.audit_drafter` stores ``Report.extra["diagnosis"]``
(which component is at fault) and ``Report.extra["efficiency"]`` (acceptance per
in-block position with Clopper-Pearson intervals, accepted length, target passes
per token, the speedup curve of Leviathan et al. 2023, sec. 3, and the memory-bound
latency).  This module parses both into frozen dataclasses and builds the plain
text of their sentences and table cells; :mod:`specverify.report.markdown` and
:mod:`specverify.report.html` escape and lay them out, so the two formats say the
same thing.  The keys read are documented in :mod:`specverify.report`.  Every part
is optional: a missing or malformed entry skips its row or table, and a key whose
section cannot be built at all stays in "Other sections" as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specverify.core.results import Report
from specverify.report import content as c

__all__ = ["Diagnosis", "diagnosis", "Efficiency", "efficiency", "fmt_seconds", "rendered_extra_keys"]

#: How each culprit of ``extra["diagnosis"]`` is named in the report.
CULPRIT_LABEL = {
    "drafter": "the drafter",
    "verifier": "the verifier (or its wiring)",
    "protocol": "a protocol violation",
}
#: At most this many failing tests are listed under the diagnosis.
MAX_FAILED_LISTED = 12


def _extra(report: Report, key: str) -> Any:
    return report.extra.get(key) if isinstance(report.extra, Mapping) else None


def fmt_seconds(value: Any) -> str:
    """``0.00478`` -> ``"4.78 ms"``; microseconds, milliseconds or seconds, three significant digits."""
    x = c.finite(value)
    if x is None:
        return c.fmt(value)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e-9:.3g} ns"


def fmt_count(value: Any) -> str:
    """``8e9`` -> ``"8B"``, ``1.3e8`` -> ``"130M"``, small counts as integers with separators."""
    x = c.finite(value)
    if x is None:
        return c.fmt(value)
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return c.fmt_int(x) if x == int(x) else c.fmt(x)


# ----------------------------------------------------------------------------- diagnosis


@dataclass(frozen=True)
class Diagnosis:
    culprit: str | None
    message: str
    failed_tests: tuple[str, ...]

    @property
    def culprit_text(self) -> str:
        """``"the drafter"``, ..., or ``"none"`` (an unknown culprit is shown as it is)."""
        if self.culprit is None:
            return "none"
        return CULPRIT_LABEL.get(self.culprit, self.culprit)

    @property
    def headline(self) -> str:
        """``"the culprit is the drafter"`` or ``"no culprit"``."""
        return "no culprit" if self.culprit is None else f"the culprit is {self.culprit_text}"

    @property
    def sentence(self) -> str:
        """The message as a sentence (capitalised, ending in a full stop)."""
        text = self.message.strip()
        if self.culprit is None and text in ("", "no failure"):
            return "No test failed and no implementation error was recorded."
        text = text or "no explanation recorded"
        text = text[0].upper() + text[1:]
        return text if text.endswith((".", "!", "?")) else text + "."

    @property
    def unlisted_failures(self) -> tuple[str, ...]:
        """The failing tests, unless the message already names every one of them."""
        named = lambda t: re.search(rf"(?<![\w@=/.:]){re.escape(t)}(?![\w@=/.:])", self.message)  # noqa: E731
        if all(named(t) for t in self.failed_tests):
            return ()
        return self.failed_tests


def diagnosis(report: Report) -> Diagnosis | None:
    """Parse ``extra["diagnosis"]``: ``{"culprit": str | None, "message": str, "failed_tests": [str]}``."""
    data = _extra(report, "diagnosis")
    if not isinstance(data, Mapping):
        return None
    culprit, message = data.get("culprit"), data.get("message", "")
    if not (culprit is None or isinstance(culprit, str)) or not isinstance(message, str):
        return None
    if culprit is None and not message:
        return None
    failed = data.get("failed_tests")
    failed = tuple(str(t) for t in failed) if isinstance(failed, (list, tuple)) else ()
    return Diagnosis(culprit or None, message, failed)


# ----------------------------------------------------------------------------- efficiency


@dataclass(frozen=True)
class PositionRow:
    position: Any
    drafted: float | None
    accepted: float | None
    observed: float
    ci: tuple[float, float] | None
    expected: float | None


@dataclass(frozen=True)
class Metric:
    label: str
    observed: float
    ci: tuple[float, float] | None
    exact: float | None


@dataclass(frozen=True)
class SpeedupCurve:
    cost: float
    best_k: int | None
    best_speedup: float | None
    at_audited_k: float | None
    speedups: tuple[float, ...]  # index i is K = i + 1
    seconds_at_best_k: float | None
    seconds_at_audited_k: float | None


@dataclass(frozen=True)
class Latency:
    target_pass_seconds: float
    model_params: float | None
    bytes_per_param: float | None
    bandwidth: float | None
    note: str


@dataclass(frozen=True)
class Efficiency:
    k: int | None
    ci_level: float
    rounds: float | None
    tokens_generated: float | None
    tokens_kept: float | None
    positions: tuple[PositionRow, ...]
    metrics: tuple[Metric, ...]
    curves: tuple[SpeedupCurve, ...]
    latency: Latency | None
    note: str

    @property
    def ci_label(self) -> str:
        return f"{self.ci_level * 100:.4g}% CI"


def _interval(value: Any) -> tuple[float, float] | None:
    pair = c.float_list(value)
    if pair is None or len(pair) != 2:
        return None
    low, high = (c.finite(x) for x in pair)
    return (low, high) if low is not None and high is not None and low <= high else None


def _positions(data: Mapping) -> tuple[PositionRow, ...]:
    records = data.get("positions")
    rows = []
    for rec in records if isinstance(records, (list, tuple)) else ():
        if not isinstance(rec, Mapping):
            continue
        observed = c.finite(rec.get("observed_rate"))
        if observed is None:
            continue
        position = rec.get("position", len(rows) + 1)
        rows.append(
            PositionRow(
                position if isinstance(position, (int, str)) and not isinstance(position, bool) else len(rows) + 1,
                c.finite(rec.get("drafted")),
                c.finite(rec.get("accepted")),
                observed,
                _interval([rec.get("ci_low"), rec.get("ci_high")]),
                c.finite(rec.get("expected_rate")),
            )
        )
    return tuple(rows)


def _metrics(data: Mapping) -> tuple[Metric, ...]:
    get = lambda key: c.finite(data.get(key))  # noqa: E731
    mean, mean_ci = get("mean_accepted"), _interval(data.get("mean_accepted_ci"))
    per_pass, exact_per_pass = get("tokens_per_target_pass"), get("expected_tokens_per_target_pass")
    out = []
    if mean is not None:
        out.append(
            Metric("mean accepted length (drafts accepted per block)", mean, mean_ci, get("expected_mean_accepted"))
        )
    # tokens per pass = 1 + accepted length, so its interval is the accepted length's shifted by one
    shifted = (
        (mean_ci[0] + 1, mean_ci[1] + 1)
        if (mean_ci and mean is not None and per_pass is not None and abs(per_pass - mean - 1) < 1e-9)
        else None
    )
    if per_pass is not None:
        out.append(Metric("tokens per target pass", per_pass, shifted, exact_per_pass))
    passes = get("target_passes_per_token")
    if passes is not None:
        ci = (1 / shifted[1], 1 / shifted[0]) if shifted and shifted[0] > 0 and passes > 0 else None
        exact = 1 / exact_per_pass if exact_per_pass else None
        out.append(Metric("target passes per token", passes, ci, exact))
    kept = get("target_passes_per_kept_token")
    if kept is not None:
        out.append(
            Metric("target passes per kept token (the last round may overshoot max_new_tokens)", kept, None, None)
        )
    return tuple(out)


def _curves(data: Mapping) -> tuple[SpeedupCurve, ...]:
    blocks = data.get("speedup")
    out = []
    for block in blocks if isinstance(blocks, (list, tuple)) else ():
        if not isinstance(block, Mapping):
            continue
        cost, speedups = c.finite(block.get("draft_cost")), c.float_list(block.get("speedups"))
        if cost is None or speedups is None:
            continue
        best_k = c.finite(block.get("best_k"))
        out.append(
            SpeedupCurve(
                cost,
                int(best_k) if best_k is not None and best_k == int(best_k) else None,
                c.finite(block.get("best_speedup")),
                c.finite(block.get("speedup_at_audited_k")),
                tuple(speedups),
                c.finite(block.get("seconds_per_token_at_best_k")),
                c.finite(block.get("seconds_per_token_at_audited_k")),
            )
        )
    return tuple(out)


def _latency(data: Mapping) -> Latency | None:
    block = data.get("latency")
    if not isinstance(block, Mapping):
        return None
    seconds = c.finite(block.get("target_pass_seconds"))
    if seconds is None or seconds <= 0:
        return None
    note = block.get("note")
    return Latency(
        seconds,
        c.finite(block.get("model_params")),
        c.finite(block.get("bytes_per_param")),
        c.finite(block.get("bandwidth_bytes_per_s")),
        note if isinstance(note, str) else "",
    )


def efficiency(report: Report) -> Efficiency | None:
    """Parse ``extra["efficiency"]``; None when it holds none of the parts the report can show."""
    data = _extra(report, "efficiency")
    if not isinstance(data, Mapping):
        return None
    positions, metrics, curves, latency = _positions(data), _metrics(data), _curves(data), _latency(data)
    if not (positions or metrics or curves or latency):
        return None
    k = c.finite(data.get("k"))
    level = c.finite(data.get("ci_level"))
    note = data.get("model_note")
    return Efficiency(
        k=int(k) if k is not None and k == int(k) and k >= 1 else None,
        ci_level=level if level is not None and 0 < level < 1 else 0.95,
        rounds=c.finite(data.get("rounds")),
        tokens_generated=c.finite(data.get("tokens_generated")),
        tokens_kept=c.finite(data.get("tokens_kept")),
        positions=positions,
        metrics=metrics,
        curves=curves,
        latency=latency,
        note=note if isinstance(note, str) else "",
    )


def rendered_extra_keys(report: Report) -> set[str]:
    """The ``extra`` keys that get their own section (so they are not repeated as JSON)."""
    keys = set()
    if diagnosis(report) is not None:
        keys.add("diagnosis")
    if efficiency(report) is not None:
        keys.add("efficiency")
    return keys


# ----------------------------------------------------------------------------- text and table cells


def sample_sentence(eff: Efficiency) -> str:
    """Where the numbers come from (empty when no counter was recorded)."""
    parts = []
    if eff.rounds is not None:
        parts.append(f"{c.fmt_int(eff.rounds)} verification rounds (one target pass each)")
    if eff.tokens_generated is not None:
        kept = f" ({c.fmt_int(eff.tokens_kept)} within max_new_tokens)" if eff.tokens_kept is not None else ""
        parts.append(f"{c.fmt_int(eff.tokens_generated)} emitted tokens{kept}")
    k = f" at draft length K={eff.k}" if eff.k is not None else ""
    return f"Measured over {' and '.join(parts)}{k}." if parts else ""


def position_table(eff: Efficiency) -> tuple[list[str], list[list[str]]]:
    header = [
        "position",
        "drafted",
        "accepted",
        "acceptance rate",
        eff.ci_label,
        "exact expected rate",
        "exact inside CI",
    ]
    rows = []
    for r in eff.positions:
        ci = f"[{r.ci[0]:.4f}, {r.ci[1]:.4f}]" if r.ci else "—"
        inside = "—" if r.ci is None or r.expected is None else ("yes" if r.ci[0] <= r.expected <= r.ci[1] else "no")
        rows.append(
            [
                str(r.position),
                c.fmt_int(r.drafted),
                c.fmt_int(r.accepted),
                c.fmt(r.observed, ".4f"),
                ci,
                c.fmt(r.expected, ".4f"),
                inside,
            ]
        )
    return header, rows


def metric_table(eff: Efficiency) -> tuple[list[str], list[list[str]]]:
    rows = [
        [
            m.label,
            c.fmt(m.observed, "#.4g"),
            f"[{m.ci[0]:#.4g}, {m.ci[1]:#.4g}]" if m.ci else "—",
            c.fmt(m.exact, "#.4g"),
        ]
        for m in eff.metrics
    ]
    return ["quantity", "observed", eff.ci_label, "exact expectation"], rows


def speedup_table(eff: Efficiency) -> tuple[list[str], list[list[str]], set[tuple[int, int]]]:
    """One row per drafter cost c, one column per draft length K = 1..max; also the (row, column) cells of best K."""
    length = max(len(cv.speedups) for cv in eff.curves)
    header = ["c \\ K"] + [str(k) + (" (audited)" if eff.k == k else "") for k in range(1, length + 1)]
    rows, best = [], set()
    for i, cv in enumerate(eff.curves):
        rows.append(
            [f"c={c.fmt(cv.cost, '.3g')}"] + [f"{x:.2f}" for x in cv.speedups] + ["—"] * (length - len(cv.speedups))
        )
        if cv.best_k is not None and 1 <= cv.best_k <= len(cv.speedups):
            best.add((i, cv.best_k))
    return header, rows, best


def speedup_sentences(eff: Efficiency) -> list[str]:
    """One line per drafter cost: the best K and its speedup, the speedup at the audited K, and (with
    ``latency``) the memory-bound seconds per token at each."""

    def at(speedup: float | None, seconds: float | None) -> str:
        per_token = f", {fmt_seconds(seconds)} per token" if seconds is not None and eff.latency else ""
        return f"{c.fmt(speedup, '.3f')}x{per_token}"

    out = []
    for cv in eff.curves:
        parts = []
        if cv.best_k is not None:
            parts.append(f"best K={cv.best_k} ({at(cv.best_speedup, cv.seconds_at_best_k)})")
        if cv.at_audited_k is not None and eff.k is not None:
            parts.append(f"at the audited K={eff.k}: {at(cv.at_audited_k, cv.seconds_at_audited_k)}")
        if parts:
            out.append(f"c={c.fmt(cv.cost, '.3g')}: " + "; ".join(parts) + ".")
    return out


def latency_sentence(eff: Efficiency) -> str:
    """The memory-bound latency per token of plain decoding (empty without ``latency``)."""
    lat = eff.latency
    if lat is None:
        return ""
    model = []
    if lat.model_params is not None:
        model.append(f"{fmt_count(lat.model_params)} parameters")
    if lat.bytes_per_param is not None:
        model.append(f"{c.fmt(lat.bytes_per_param, '.3g')} bytes each")
    if lat.bandwidth is not None:
        model.append(f"{c.fmt(lat.bandwidth / 1e12, '.3g')} TB/s")
    text = "Memory-bound latency per token" + (f" ({', '.join(model)})" if model else "")
    text += f": plain decoding {fmt_seconds(lat.target_pass_seconds)}, one target pass"
    if any(cv.seconds_at_best_k is not None or cv.seconds_at_audited_k is not None for cv in eff.curves):
        text += "; speculative decoding per drafter cost below"
    text += "."
    if lat.note:
        text += " " + lat.note[0].upper() + lat.note[1:] + ("" if lat.note.endswith(".") else ".")
    return text


def summary_items(eff: Efficiency) -> list[str]:
    """The efficiency answer in a few lines, for the top of a drafter audit: acceptance per position
    vs exact, tokens per target pass, best K and speedup per drafter cost, memory-bound latency."""
    out = []
    if eff.positions:
        rates = ", ".join(
            f"{r.position}: {c.fmt(r.observed, '.3f')}"
            + (f" ({c.fmt(r.expected, '.3f')})" if r.expected is not None else "")
            for r in eff.positions
        )
        out.append(f"Acceptance per in-block position, observed (exact): {rates}.")
    per_pass = next((m for m in eff.metrics if m.label == "tokens per target pass"), None)
    if per_pass is not None:
        exact = f" (exact {c.fmt(per_pass.exact, '#.4g')})" if per_pass.exact is not None else ""
        k = f" at K={eff.k}" if eff.k is not None else ""
        out.append(f"Tokens per target pass{k}: {c.fmt(per_pass.observed, '#.4g')}{exact}.")
    out += [f"Speedup, drafter cost {s}" for s in speedup_sentences(eff)]
    lat = eff.latency
    if lat is not None:
        text = f"Memory-bound latency per token: plain decoding {fmt_seconds(lat.target_pass_seconds)}"
        best = [cv for cv in eff.curves if cv.seconds_at_best_k is not None and cv.best_k is not None]
        if best:
            cv = best[0]
            text += (
                f"; speculative at best K={cv.best_k} (c={c.fmt(cv.cost, '.3g')}) {fmt_seconds(cv.seconds_at_best_k)}"
            )
        out.append(text + ".")
    return out


def terminal_lines(report: Report) -> list[str]:
    """The efficiency answer for the terminal summary of a drafter audit (:func:`specverify.report.terminal_summary`).

    Empty unless the report holds ``extra["efficiency"]``.  One line for what was measured at
    the audited K (tokens per target pass against its exact expectation, and the modelled
    speedup at each drafter cost), one per drafter cost for the best K (said to be an
    extrapolation when it lies past the audited K), and one for the memory-bound latency
    when ``--model-params`` gave one.
    """
    eff = efficiency(report)
    if eff is None:
        return []
    at_k = f" at K={eff.k}" if eff.k is not None else ""
    parts = []
    per_pass = next((m for m in eff.metrics if m.label == "tokens per target pass"), None)
    if per_pass is not None:
        exact = f" (exact {c.fmt(per_pass.exact, '#.4g')})" if per_pass.exact is not None else ""
        parts.append(f"{c.fmt(per_pass.observed, '#.4g')} tokens per target pass{exact}")
    parts += [
        f"speedup {c.fmt(cv.at_audited_k, '.3f')}x at drafter cost c={c.fmt(cv.cost, '.3g')}"
        for cv in eff.curves
        if cv.at_audited_k is not None and eff.k is not None
    ]
    out = [f"  efficiency{at_k}: " + "; ".join(parts)] if parts else []
    for cv in eff.curves:
        if cv.best_k is None:
            continue
        beyond = (
            f" (K > {eff.k} assumes the last observed acceptance rate)"
            if eff.k is not None and cv.best_k > eff.k
            else ""
        )
        out.append(
            f"  best K={cv.best_k} at drafter cost c={c.fmt(cv.cost, '.3g')}: speedup "
            f"{c.fmt(cv.best_speedup, '.3f')}x{beyond}"
        )
    lat = eff.latency
    if lat is not None:
        params = f" ({fmt_count(lat.model_params)} parameters)" if lat.model_params is not None else ""
        text = f"  memory-bound latency per token{params}: plain decoding {fmt_seconds(lat.target_pass_seconds)}"
        for cv in eff.curves[:1]:
            if cv.seconds_at_audited_k is not None and eff.k is not None:
                text += f", speculative at K={eff.k} {fmt_seconds(cv.seconds_at_audited_k)}"
            if cv.seconds_at_best_k is not None and cv.best_k is not None and cv.best_k != eff.k:
                text += f", at best K={cv.best_k} {fmt_seconds(cv.seconds_at_best_k)}"
        out.append(text)
    return out

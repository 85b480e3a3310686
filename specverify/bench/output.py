"""The bench report: both answers in one headline -- the audit's verdict with its detectable TV, and the
measured speedup with its interval at each concurrency -- then the tables, JSON and HTML.

Files written by :func:`write`: ``bench.json`` (every number, the command, seeds and subjects),
``bench.md`` and ``bench.html`` (with the plots: speedup against concurrency with intervals,
acceptance by draft position; matplotlib is optional).  The cost model's prediction
(:func:`predict`) sits beside the measurement wherever the engine exposes acceptance by
position: ``E[tokens per round] / (c K + 1)`` with ``c`` the drafter's weight bytes over the
target's (a memory-bound pass reads every weight once), and the target pass's time on the named
accelerator, ``weight bytes / bandwidth``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from specverify.bench.analysis import SPEEDUPS, LevelSummary
from specverify.bench.counters import SpecCounts
from specverify.core.errors import InvalidArgument
from specverify.core.files import atomic_write_text
from specverify.measure.costmodel import expected_tokens_per_round, speedup, target_pass_seconds

__all__ = ["Accelerator", "AuditAnswer", "BenchReport", "predict", "audit_answer", "median_detectable_tv", "write"]


@dataclass(frozen=True)
class Accelerator:
    """A memory-bound cost model: the target's and drafter's weight bytes and the accelerator's bandwidth."""

    name: str = "H100 SXM"
    bandwidth_bytes_per_s: float = 3.35e12
    target_parameters: float = 8e9
    draft_parameters: float = 1e9
    bytes_per_parameter: float = 2.0

    def __post_init__(self):
        for name in ("bandwidth_bytes_per_s", "target_parameters", "bytes_per_parameter"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InvalidArgument(f"cost model {name} must be a positive number, got {value!r}")
        if not isinstance(self.draft_parameters, (int, float)) or not 0 <= self.draft_parameters < math.inf:
            raise InvalidArgument(f"cost model draft_parameters must be a number >= 0, got {self.draft_parameters!r}")

    @property
    def draft_cost(self) -> float:
        """A drafter pass over a target pass (weight bytes over weight bytes)."""
        return self.draft_parameters / self.target_parameters


def conditional_rates(counts: SpecCounts) -> list[float] | None:
    """P(draft i accepted | drafts before it accepted) per position, from per-position counters."""
    if not counts.drafts or not counts.accepted_per_pos:
        return None
    reached = [counts.drafts, *counts.accepted_per_pos[:-1]]
    return [a / r if r else 0.0 for a, r in zip(counts.accepted_per_pos, reached)]


def predict(counts: SpecCounts | None, accelerator: Accelerator) -> dict | None:
    """The cost model's speedup and time per token on ``accelerator`` from measured acceptance (None without it)."""
    rates = None if counts is None else conditional_rates(counts)
    if rates is None:
        return None
    k = len(rates)
    target_s = target_pass_seconds(accelerator.target_parameters, bytes_per_parameter=accelerator.bytes_per_parameter,
                                   bandwidth_bytes_per_s=accelerator.bandwidth_bytes_per_s)  # fmt: skip
    predicted = speedup(rates, k, accelerator.draft_cost)
    return {
        "accelerator": accelerator.name,
        "k": k,
        "conditional_acceptance": rates,
        "tokens_per_round": expected_tokens_per_round(rates, k),
        "draft_cost": accelerator.draft_cost,
        "target_pass_ms": 1e3 * target_s,
        "speedup": predicted,
        "ms_per_token": 1e3 * target_s / predicted,
        "ms_per_token_baseline": 1e3 * target_s,
    }


def median_detectable_tv(results: list) -> float | None:
    """The median of an audit report's recorded detectable binned TVs (power 0.9), None when none is recorded."""
    tvs = sorted(r["mde_tv"] for r in results if isinstance(r.get("mde_tv"), float) and math.isfinite(r["mde_tv"]))
    return tvs[len(tvs) // 2] if tvs else None


@dataclass(frozen=True)
class AuditAnswer:
    """The correctness answer a bench report states: an audit report's verdict and its detectable TV."""

    verdict: str
    detectable_tv: float | None
    source: str


def audit_answer(path: str | Path) -> AuditAnswer:
    """Read an audit's ``report.json`` (``specverify audit --out DIR``) for the headline."""
    try:
        report = json.loads(Path(path).read_text())
        verdict = str(report["verdict"])
        results = report.get("results") or []
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InvalidArgument(f"--audit-report {str(path)!r} is not an audit's report.json ({error})") from None
    return AuditAnswer(verdict, median_detectable_tv(results), str(path))


@dataclass(frozen=True)
class BenchReport:
    """A finished benchmark: its settings, each concurrency's summary, the audit's answer and predictions."""

    settings: dict
    levels: tuple[LevelSummary, ...]
    audit: AuditAnswer | None = None
    accelerator: Accelerator | None = None
    predictions: tuple = field(default=())

    def headline(self) -> str:
        if self.audit is None:
            correctness = "correctness not audited here (--audit-report gives the verdict)"
        else:
            tv = "n/a" if self.audit.detectable_tv is None else f"{self.audit.detectable_tv:.3g}"
            correctness = f"verdict {self.audit.verdict.upper()} (detectable TV {tv})"
        parts = []
        for level in self.levels:
            tps = level.speedups.get("tokens_per_s")
            text = "n/a" if tps is None else tps.text()
            parts.append(f"c={level.concurrency} {text}")
        speed = "speedup (tokens/s) " + ", ".join(parts)
        lengths = [level.counters.mean_acceptance_length for level in self.levels if level.counters is not None]
        lengths = [x for x in lengths if x is not None]
        accept = f"acceptance length {sum(lengths) / len(lengths):.2f}" if lengths else "acceptance length unavailable"
        return f"{correctness}; {speed}; {accept}"

    def as_dict(self) -> dict:
        return {
            "schema": "specverify-bench/1",
            "headline": self.headline(),
            "settings": self.settings,
            "audit": None if self.audit is None else vars(self.audit),
            "accelerator": None if self.accelerator is None else vars(self.accelerator),
            "levels": [level.as_dict() for level in self.levels],
            "predictions": list(self.predictions),
        }

    def markdown(self) -> str:
        s = self.settings
        lines = [
            "# Speculative decoding: lossless, and how much faster",
            "",
            f"**{self.headline()}**",
            "",
            f"Speculative: `{s['speculative']}`; baseline: `{s['baseline']}`; {s['max_tokens']} tokens per reply, "
            f"sampling {s['sampling'] or 'server defaults'}; {s['pairs']} interleaved pairs of rounds per "
            f"concurrency after {s['warmup_pairs']} warm-up pair(s), {s['requests_per_client']} request(s) per "
            f"client per round; intervals: paired bootstrap, {s['level']:.0%}, seed {s['seed']}.",
            "",
            "| concurrency | " + " | ".join(SPEEDUPS) + " | saved per request (ms) | acceptance length "
            "| acceptance by position |",
            "|---|" + "---|" * (len(SPEEDUPS) + 3),
        ]
        for level in self.levels:
            cells = [level.speedups[n].text() if n in level.speedups else "n/a" for n in SPEEDUPS]
            counts = level.counters
            length = None if counts is None else counts.mean_acceptance_length
            rate = None if counts is None else counts.acceptance_rate
            by_pos = "" if counts is None else ", ".join(f"{a:.2f}" for a in counts.acceptance_by_position)
            if length is not None:
                accept = f"{length:.2f}"
            elif rate is not None:
                accept = f"acceptance rate {rate:.2f} (no verification steps reported)"
            else:
                accept = f"unavailable ({level.counters_note or 'no counters'})"
            saved = level.saved_ms.text(1)
            lines.append(
                f"| {level.concurrency} | " + " | ".join(cells) + f" | {saved} | {accept} | {by_pos or 'n/a'} |"
            )
        lines += ["", "| concurrency | arm | requests | tokens/s | latency p50 / p90 / p99 (s) | TTFT p50 (s) | TPOT p50 (ms) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for level in self.levels:
            for arm in ("speculative", "baseline"):
                a = getattr(level, arm)
                lat = " / ".join(f"{a.latency[q]:.3f}" for q in (50, 90, 99))
                ttft = "n/a" if a.ttft is None else f"{a.ttft[50]:.3f}"
                tpot = "n/a" if a.tpot is None else f"{1e3 * a.tpot[50]:.1f}"
                lines.append(
                    f"| {level.concurrency} | {arm} | {a.requests} | {a.tokens_per_s:.1f} | {lat} | {ttft} | {tpot} |"
                )
        if self.accelerator is not None:
            acc = self.accelerator
            lines += ["", f"Cost model on {acc.name} ({acc.bandwidth_bytes_per_s / 1e12:g} TB/s; target "
                      f"{acc.target_parameters:g} parameters, drafter {acc.draft_parameters:g}, "
                      f"{acc.bytes_per_parameter:g} bytes each; memory bound, batch 1):", ""]  # fmt: skip
            for level, p in zip(self.levels, self.predictions):
                if p is None:
                    lines.append(f"- c={level.concurrency}: no prediction (no acceptance by position)")
                else:
                    lines.append(f"- c={level.concurrency}: predicted speedup {p['speedup']:.2f} "
                                 f"({p['ms_per_token']:.2f} ms per token against {p['ms_per_token_baseline']:.2f}), "
                                 f"from {p['tokens_per_round']:.2f} tokens per round at K = {p['k']}")  # fmt: skip
        lines += ["", f"Command: `{s['command']}`", ""]
        return "\n".join(lines)

    def html(self) -> str:
        body = html.escape(self.markdown())
        images = "".join(f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{png}"></p>'
                         for alt, png in _plots(self))  # fmt: skip
        note = (
            ""
            if images
            else "<p>Plots are unavailable: matplotlib is not installed (pip install specverify[plots]).</p>"
        )
        return (f"<!doctype html><html><head><meta charset='utf-8'><title>specverify bench</title></head><body>"
                f"<pre>{body}</pre>{images}{note}</body></html>\n")  # fmt: skip


def _plots(report: BenchReport) -> list[tuple[str, str]]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return []

    def encode(fig) -> str:
        FigureCanvasAgg(fig)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return base64.b64encode(buffer.getvalue()).decode()

    out = []
    fig = Figure(figsize=(5.5, 3.2))
    ax = fig.add_subplot()
    for name, marker in (("tokens_per_s", "o"), ("latency_mean", "s"), ("tpot_p50", "^")):
        points = [(lv.concurrency, lv.speedups[name]) for lv in report.levels if name in lv.speedups]
        if points:
            xs = [c for c, _ in points]
            ys = [i.estimate for _, i in points]
            err = [[i.estimate - i.low for _, i in points], [i.high - i.estimate for _, i in points]]
            ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=3, label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speedup (baseline / speculative)")
    ax.set_title("speedup against concurrency, 95% paired-bootstrap intervals")
    ax.legend(fontsize=8)
    out.append(("speedup against concurrency", encode(fig)))
    levels = [lv for lv in report.levels if lv.counters is not None and lv.counters.acceptance_by_position]
    if levels:
        fig = Figure(figsize=(5.5, 3.2))
        ax = fig.add_subplot()
        width = 0.8 / len(levels)
        for j, lv in enumerate(levels):
            rates = lv.counters.acceptance_by_position
            ax.bar([i + 1 + (j - (len(levels) - 1) / 2) * width for i in range(len(rates))], rates, width=width,
                   label=f"c={lv.concurrency}")  # fmt: skip
        ax.set_xlabel("draft position")
        ax.set_ylabel("share of verification steps accepted")
        ax.set_title("acceptance by draft position")
        ax.legend(fontsize=8)
        out.append(("acceptance by draft position", encode(fig)))
    return out


def write(report: BenchReport, out: str | Path) -> Path:
    """Write ``bench.json``, ``bench.md`` and ``bench.html`` into ``out`` (created); the directory."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / "bench.json", json.dumps(report.as_dict(), indent=2) + "\n")
    atomic_write_text(directory / "bench.md", report.markdown())
    atomic_write_text(directory / "bench.html", report.html())
    return directory

"""Rendering a knob sweep (:class:`specverify.verifier.sweep.SweepResult`): Markdown, HTML, plot.

The plot has one point per knob value: the mean TV per emitted token with its
simultaneous confidence band (error bars) against tokens per target pass (left) and
against the memory-bound speedup of the cost model (right), each point labelled with
its knob value, and the declared law's exact TV as an open marker when there is one.
A third panel shows the TV interval at every in-block position per knob value.

matplotlib is imported lazily (Agg canvas, no pyplot, no PNG ``Software`` metadata,
fixed size and DPI: the same sweep gives the same bytes); without it the HTML says so.
:func:`write_sweep` writes ``sweep.json``, ``sweep.md`` and ``sweep.html`` atomically
(:func:`specverify.report.io.atomic_write_text`).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from specverify.core.errors import InvalidArgument
from specverify.report.html import CSS, esc, table
from specverify.report.io import atomic_write_text, check_out_dir

__all__ = ["render_sweep_markdown", "render_sweep_html", "render_sweep_plot", "write_sweep", "SWEEP_FILENAMES"]

SWEEP_FILENAMES = {"json": "sweep.json", "markdown": "sweep.md", "html": "sweep.html"}
DPI = 100


def _check(result):
    from specverify.verifier.sweep import SweepResult

    if not isinstance(result, SweepResult):
        raise InvalidArgument(f"result must be a specverify.verifier.sweep.SweepResult, got {type(result).__name__}")
    return result


def _interval(e) -> str:
    return f"{e.tv:.4f} [{e.tv_lower:.4f}, {e.tv_upper:.4f}]"


def _rows(result) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the main table (one row per knob value)."""
    blocks = [s.stratum for s in result.points[0].measure.by_block]
    header = [result.knob, "mean TV/token [interval]", "declared", *blocks, "tokens/pass", "speedup", "conformance"]
    rows = []
    for p in result.points:
        o = p.measure.overall
        by_name = {s.stratum: s for s in p.measure.by_block}
        rows.append(
            [
                p.label,
                "" if o is None else f"{o.tv:.4f} [{o.tv_lower:.4f}, {o.tv_upper:.4f}]",
                "" if o is None or o.declared_tv is None else f"{o.declared_tv:.4f}",
                *(_interval(by_name[b].estimate) if b in by_name else "" for b in blocks),
                f"{p.tokens_per_pass:.3f}",
                f"{p.speedup:.3f}",
                p.measure.conformance_verdict or "-",
            ]
        )
    return header, rows


def _position_rows(result) -> tuple[list[str], list[list[str]]]:
    positions = [s.stratum for s in result.points[0].measure.by_position]
    header = [result.knob, *positions]
    rows = [[p.label, *(_interval(s.estimate) for s in p.measure.by_position)] for p in result.points]
    return header, rows


def _intro(result) -> str:
    tree = getattr(result, "kind", "chain") == "tree"
    shape = (
        f"tree scenario `{result.scenario}` (max depth D={result.k}"
        if tree
        else f"scenario `{result.scenario}` (K={result.k}"
    )
    return (
        f"{result.subject}: `{result.knob}` swept over {len(result.points)} values on {shape}, tier {result.tier}, "
        f"seed {result.seed}, the same seed for every "
        f"value). TV is the bias-corrected total-variation distance of the emitted tokens from the target; "
        f"intervals have level {result.level:.0%} per stratum; the mean TV per token has a simultaneous "
        f"(Bonferroni over positions) interval. The point estimate subtracts the plug-in's bias under exact "
        f"sampling; under a lossy law that over-corrects (by at most that bias), so it can sit below the lower "
        f"bound: the interval is the guarantee. Speedup: memory-bound cost model, "
        f"E[tokens per round] / (c K + 1) with a drafter pass costing c = {result.draft_cost:g} target passes. "
        f"`declared` is the exact TV of the law the rule declares; `conformance` grades the samples against "
        f"that law (GOF + support, one error budget)."
        + (
            " Tree: the strata `depth=j` are the j-th token a round emits (first per row); tokens per pass = "
            "mean accepted depth + 1; the cost model charges one drafter pass per depth (c D + 1); no declared "
            "law is taken (a tree rule's law depends on the whole drafted tree)."
            if tree
            else ""
        )
    )


def render_sweep_markdown(result) -> str:
    """The sweep as Markdown: the trade-off table and the per-absolute-position intervals."""
    result = _check(result)
    header, rows = _rows(result)
    lines = [f"# Trade-off: {result.subject}, {result.knob}", "", _intro(result), ""]
    if result.command:
        lines += ["Regenerate:", "", "```bash", result.command, "```", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    header, rows = _position_rows(result)
    lines += ["", "## TV per absolute position", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_sweep_plot(result) -> bytes | None:
    """PNG of the trade-off curve, or None without matplotlib."""
    result = _check(result)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(13, 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    points = [p for p in result.points if p.measure.overall is not None]
    tv = [p.measure.overall.tv for p in points]
    err = [
        [p.measure.overall.tv - p.measure.overall.tv_lower for p in points],
        [p.measure.overall.tv_upper - p.measure.overall.tv for p in points],
    ]
    for ax, key, xlabel in (
        (axes[0], "tokens_per_pass", "tokens per target pass (measured)"),
        (axes[1], "speedup", f"memory-bound speedup (draft cost {result.draft_cost:g})"),
    ):
        x = [getattr(p, key) for p in points]
        ax.errorbar(x, tv, yerr=[[max(e, 0.0) for e in err[0]], [max(e, 0.0) for e in err[1]]], fmt="o-",
                    capsize=3, color="#1f77b4", label=f"measured, {result.level:.0%} band")  # fmt: skip
        declared = [(xi, p.measure.overall.declared_tv) for xi, p in zip(x, points)]
        declared = [(xi, d) for xi, d in declared if d is not None]
        if declared:
            ax.plot(*zip(*declared), "s", mfc="none", color="#d62728", label="declared law, exact")
        for xi, yi, p in zip(x, tv, points):
            ax.annotate(p.label, (xi, yi), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean TV per token")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    for j, p in enumerate(result.points):
        blocks = p.measure.by_block
        xs = [i + (j - len(result.points) / 2) * 0.04 for i in range(1, len(blocks) + 1)]
        ys = [s.estimate.tv for s in blocks]
        lo = [max(s.estimate.tv - s.estimate.tv_lower, 0.0) for s in blocks]
        hi = [max(s.estimate.tv_upper - s.estimate.tv, 0.0) for s in blocks]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=".-", capsize=2, label=p.label, lw=1)
    ax.set_xlabel("in-block position (K+1 = bonus)")
    ax.set_ylabel("TV at the position")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, title=result.knob, title_fontsize=8, ncol=2)
    fig.suptitle(f"{result.subject}: {result.knob} on {result.scenario}", fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def render_sweep_html(result, *, plots: bool = True) -> str:
    """A self-contained HTML page: intro, plot (embedded PNG), tables."""
    result = _check(result)
    title = f"Trade-off: {result.subject}, {result.knob}"
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p class=meta>{esc(_intro(result))}</p>",
    ]
    if result.command:
        parts.append(f"<p>Regenerate:</p><pre>{esc(result.command)}</pre>")
    png = render_sweep_plot(result) if plots else None
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f"<figure><img alt='trade-off plot' src='data:image/png;base64,{data}'><figcaption>Mean TV per token "
            "(with its band) against tokens per target pass and the modelled speedup, one point per knob value; "
            "right: TV interval per in-block position.</figcaption></figure>"
        )
    else:
        parts.append("<p class=note>Plot not drawn (matplotlib missing or plots disabled).</p>")
    for heading, (header, rows) in (
        ("Trade-off table", _rows(result)),
        ("TV per absolute position", _position_rows(result)),
    ):
        cells = [[esc(cell) for cell in row] for row in rows]
        parts += [f"<h2>{heading}</h2>", table(header, cells, numeric="r" * len(header))]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_sweep(result, out_dir, *, plots: bool = True) -> dict[str, Path]:
    """Write ``sweep.json``, ``sweep.md`` and ``sweep.html`` into ``out_dir`` atomically; returns their paths."""
    result = _check(result)
    out = check_out_dir(out_dir)
    texts = {
        "json": json.dumps(result.to_dict(), indent=1) + "\n",
        "markdown": render_sweep_markdown(result),
        "html": render_sweep_html(result, plots=bool(plots)),
    }
    out.mkdir(parents=True, exist_ok=True)
    return {key: atomic_write_text(out / SWEEP_FILENAMES[key], text) for key, text in texts.items()}

"""Rendering a knob sweep (:class:`specverify.measure.sweep.SweepResult`): Markdown, HTML, plot.

Both reports answer first: the verdict line
(:meth:`~specverify.measure.sweep.SweepResult.verdict_line`: conformance to the declared law
at every setting, the SUSPICIOUS and failing ones named, then the two ends of the
trade-off), then the trade-off table -- one row per knob value with the columns a reader
asked for first (conformance, modelled speedup, tokens per target pass, mean TV per token,
its interval, the declared law's TV) -- then the plot, the TV per in-block and per absolute
position, and how to read the numbers.  A TV estimate outside its own interval is marked
(``^``: the bias-corrected value was outside its interval and is shown clipped to it) and the mark explained under the table
(:func:`specverify.measure.chain.estimate_notes`).

The plot has two panels: the mean TV per emitted token with its simultaneous band against
the memory-bound speedup of the cost model, one point per knob value coloured by its
conformance verdict (tokens per target pass are in the table: the speedup is a function of
the same acceptance rates, so a second panel against them would repeat this one), and the
TV interval at every in-block position per knob value.

matplotlib is imported lazily (Agg canvas, no pyplot, no PNG ``Software`` metadata,
fixed size and DPI: the same sweep gives the same bytes); without it the HTML says so.
:func:`write_sweep` writes ``sweep.json``, ``sweep.md`` and ``sweep.html`` atomically
(:func:`specverify.report.io.atomic_write_text`).
"""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

from specverify.core.errors import InvalidArgument
from specverify.core.files import atomic_write_text, check_out_dir
from specverify.measure.chain import estimate_mark, estimate_notes
from specverify.report.html import CSS, esc, table

__all__ = ["render_sweep_markdown", "render_sweep_html", "render_sweep_plot", "write_sweep", "SWEEP_FILENAMES"]

SWEEP_FILENAMES = {"json": "sweep.json", "markdown": "sweep.md", "html": "sweep.html"}
DPI = 100
#: Colour of a point in the plot by its conformance verdict (None: no declared law).
VERDICT_COLOR = {"pass": "#1f77b4", "suspicious": "#ef8f00", "fail": "#c62828", None: "#607d8b"}
_CSS = CSS + ".ci{color:#57606a;font-size:12px;white-space:nowrap}\n"


def _check(result):
    from specverify.measure.sweep import SweepResult

    if not isinstance(result, SweepResult):
        raise InvalidArgument(f"result must be a specverify.measure.sweep.SweepResult, got {type(result).__name__}")
    return result


def _verdict_cell(verdict: str | None) -> str:
    if verdict is None:
        return "—"
    return verdict if verdict == "pass" else verdict.upper()


def _rows(result) -> tuple[list[str], list[list[str]], set[str]]:
    """Header, rows and marks used of the main table (one row per knob value), the answer columns first."""
    header = [
        result.knob,
        "conformance",
        "speedup",
        "tokens/pass",
        "mean TV/token",
        f"{result.level:.0%} interval",
        "declared TV",
    ]
    rows, marks = [], set()
    for p in result.points:
        o = p.measure.overall
        mark = "" if o is None else estimate_mark(o)
        marks.add(mark)
        rows.append(
            [
                p.label,
                _verdict_cell(p.measure.conformance_verdict),
                f"{p.speedup:.2f}x",
                f"{p.tokens_per_pass:.3f}",
                "" if o is None else f"{o.tv:.4f}{mark}",
                "" if o is None else f"[{o.tv_lower:.4f}, {o.tv_upper:.4f}]",
                "" if o is None or o.declared_tv is None else f"{o.declared_tv:.4f}",
            ]
        )
    return header, rows, marks


def _strata_rows(result, which: str) -> tuple[list[str], list[list[tuple[str, str]]], set[str]]:
    """Header and (estimate with its mark, interval) cells per knob value for ``by_block`` or ``by_position``."""
    names = [s.stratum for s in getattr(result.points[0].measure, which)]
    rows, marks = [], set()
    for p in result.points:
        by_name = {s.stratum: s.estimate for s in getattr(p.measure, which)}
        cells = []
        for name in names:
            e = by_name.get(name)
            if e is None:
                cells.append(("", ""))
                continue
            mark = estimate_mark(e)
            marks.add(mark)
            cells.append((f"{e.tv:.4f}{mark}", f"[{e.tv_lower:.4f}, {e.tv_upper:.4f}]"))
        rows.append([(p.label, ""), *cells])
    return [result.knob, *names], rows, marks


def _strata_title(result, which: str) -> str:
    if which == "by_position":
        return "TV per absolute position (from 0)"
    if getattr(result, "kind", "chain") == "tree":
        return "TV per in-round depth (depth 1 is absolute position 0)"
    return "TV per in-block position (position 1 is absolute position 0)"


def _intro(result) -> str:
    """How to read the numbers (inline code in backticks; the HTML renders it as ``<code>``)."""
    tree = getattr(result, "kind", "chain") == "tree"
    shape = (
        f"tree scenario `{result.scenario}` (max depth D={result.k}"
        if tree
        else f"scenario `{result.scenario}` (K={result.k}"
    )
    return (
        f"{result.subject}: `{result.knob}` swept over {len(result.points)} values on {shape}, tier {result.tier}, "
        f"seed {result.seed}, the same seed for every "
        f"value). TV is the total-variation distance of the emitted tokens from the target; "
        f"intervals have level {result.level:.0%} per stratum; the mean TV per token has a simultaneous "
        f"(Bonferroni over positions) interval. Absolute positions are counted from 0; the first in-round position (in-block position or depth 1) "
        f"is absolute position 0 (every row opens a round there), so it is measured once, there. The point "
        f"estimate subtracts the plug-in's bias under exact sampling and is clipped to its interval (marked ^ "
        f"where it was: under a lossy law the correction over-subtracts): the interval is the guarantee. "
        f"Speedup: memory-bound cost model, "
        f"E[tokens per round] / (c K + 1) with a drafter pass costing c = {result.draft_cost:g} target passes. "
        f"`declared TV` is the exact TV of the law the rule declares; `conformance` grades the samples against "
        f"that law (GOF + support, one error budget; SUSPICIOUS warns, only FAIL fails)."
        + (
            " Tree: the strata `depth=j` are the j-th token a round emits (first per row); tokens per pass = "
            "mean accepted depth + 1; the cost model charges one drafter pass per depth (c D + 1); no declared "
            "law is taken (a tree rule's law depends on the whole drafted tree)."
            if tree
            else ""
        )
    )


def _md_cell(text: str) -> str:
    return text.replace("*", "\\*").replace("|", "\\|")


def _md_table(header, rows) -> list[str]:
    return ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows
    ]


def _md_notes(marks: set[str]) -> list[str]:
    """The explanation of the marks a table used (one line each), or nothing."""
    notes = [_md_cell(n) for n in estimate_notes(marks)]
    return [n + "  " for n in notes[:-1]] + [notes[-1], ""] if notes else []


def _html_notes(marks: set[str]) -> list[str]:
    notes = estimate_notes(marks)
    return ['<p class="note">' + "<br>".join(esc(n) for n in notes) + "</p>"] if notes else []


def render_sweep_markdown(result) -> str:
    """The sweep as Markdown: verdict line, trade-off table, TV per in-block and per absolute position."""
    result = _check(result)
    verdict = result.verdict_line()
    word = result.verdict_word
    lines = [f"# Trade-off: {result.subject}, {result.knob}", "", f"**{word}**{_md_cell(verdict[len(word) :])}", ""]
    header, rows, marks = _rows(result)
    lines += _md_table(header, rows) + [""] + _md_notes(marks)
    for which in ("by_block", "by_position"):
        header, cells, marks = _strata_rows(result, which)
        lines += [f"## {_strata_title(result, which)}", ""]
        lines += _md_table(header, [[f"{e} {ci}".strip() for e, ci in row] for row in cells]) + [""]
        lines += _md_notes(marks)
    lines += ["## How to read the numbers", "", _intro(result), ""]
    if result.command:
        lines += ["Regenerate:", "", "```bash", result.command, "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_sweep_plot(result) -> bytes | None:
    """PNG of the trade-off (mean TV per token vs modelled speedup) and the per-position TV, or None."""
    result = _check(result)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    points = [p for p in result.points if p.measure.overall is not None]
    ax = axes[0]
    x = [p.speedup for p in points]
    tv = [p.measure.overall.tv for p in points]
    low = [max(p.measure.overall.tv - p.measure.overall.tv_lower, 0.0) for p in points]
    high = [max(p.measure.overall.tv_upper - p.measure.overall.tv, 0.0) for p in points]
    ax.plot(x, tv, "-", color="#90a4ae", lw=1, zorder=1)
    for verdict in ("pass", "suspicious", "fail", None):
        idx = [i for i, p in enumerate(points) if p.measure.conformance_verdict == verdict]
        if not idx:
            continue
        label = "no declared law" if verdict is None else f"conformance: {_verdict_cell(verdict)}"
        ax.errorbar([x[i] for i in idx], [tv[i] for i in idx], yerr=[[low[i] for i in idx], [high[i] for i in idx]],
                    fmt="o", capsize=3, color=VERDICT_COLOR[verdict], label=label, zorder=3)  # fmt: skip
    declared = [(xi, p.measure.overall.declared_tv) for xi, p in zip(x, points)]
    declared = [(xi, d) for xi, d in declared if d is not None]
    if declared:
        ax.plot(*zip(*declared), "s", mfc="none", color="#d62728", label="declared law, exact", zorder=2)
    for xi, yi, p in zip(x, tv, points):
        ax.annotate(f"{result.knob}={p.label}", (xi, yi), textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax.set_xlabel(f"memory-bound speedup (draft cost {result.draft_cost:g})")
    ax.set_ylabel(f"mean TV per token ({result.level:.0%} simultaneous band)")
    ax.set_title("what the knob trades", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    for j, p in enumerate(result.points):
        blocks = _in_round(p.measure)
        xs = [i + (j - len(result.points) / 2) * 0.04 for i, _ in blocks]
        blocks = [s for _, s in blocks]
        ys = [s.estimate.tv for s in blocks]
        lo = [max(s.estimate.tv - s.estimate.tv_lower, 0.0) for s in blocks]
        hi = [max(s.estimate.tv_upper - s.estimate.tv, 0.0) for s in blocks]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=".-", capsize=2, label=p.label, lw=1)
    tree = getattr(result, "kind", "chain") == "tree"
    ax.set_xlabel("in-round depth j" if tree else "in-block position (K+1 = bonus)")
    ax.set_ylabel("TV at the position")
    ax.set_title("where the distance is", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, title=result.knob, title_fontsize=8, ncol=2)
    fig.suptitle(f"{result.subject}: {result.knob} on {result.scenario}", fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def _in_round(measure) -> list:
    """(in-round position, stratum) pairs: position 1 is ``abs=0`` (every row opens a round there), then ``by_block``."""
    out = [(int(s.stratum.split("=")[1]), s) for s in measure.by_block]
    first = [s for s in measure.by_position if s.stratum == "abs=0"]
    if first and all(i != 1 for i, _ in out):
        out.insert(0, (1, first[0]))
    return out


def _inline(text: str) -> str:
    """Escaped HTML of ``text`` with its `backtick` spans as ``<code>`` (no raw Markdown left)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text))


def render_sweep_html(result, *, plots: bool = True) -> str:
    """A self-contained HTML page: verdict line, trade-off table, plot (embedded PNG), per-position tables."""
    result = _check(result)
    title = f"Trade-off: {result.subject}, {result.knob}"
    grade = result.verdict_grade
    verdict = result.verdict_line()
    word = result.verdict_word
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<div class="verdict v-{grade if grade != "none" else "other"}"><b>{esc(word)}</b>'
        f"{esc(verdict[len(word) :])}</div>",
    ]
    header, rows, marks = _rows(result)
    classes = [
        f"g-{p.measure.conformance_verdict}" if p.measure.conformance_verdict in ("fail", "suspicious") else ""
        for p in result.points
    ]
    cells = [[f"<b>{esc(c)}</b>" if j == 1 and c not in ("pass", "—") else esc(c) for j, c in enumerate(row)]
             for row in rows]  # fmt: skip
    parts += ["<h2>Trade-off table</h2>", f'<div class="wide">{table(header, cells, "r.rrrrr", classes)}</div>']
    parts += _html_notes(marks)
    png = render_sweep_plot(result) if plots else None
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f"<figure><img alt='trade-off plot' src='data:image/png;base64,{data}'><figcaption>Left: mean TV per "
            "token (with its simultaneous band) against the modelled speedup, one point per knob value, coloured by "
            "its conformance verdict (tokens per target pass are in the table). Right: TV interval per in-block "
            "position.</figcaption></figure>"
        )
    else:
        parts.append("<p class=note>Plot not drawn (matplotlib missing or plots disabled).</p>")
    for which in ("by_block", "by_position"):
        header, strata, marks = _strata_rows(result, which)
        html_cells = [
            [esc(e) if not ci else f'{esc(e)}<br><span class="ci">{esc(ci)}</span>' for e, ci in row] for row in strata
        ]
        parts += [
            f"<h2>{esc(_strata_title(result, which))}</h2>",
            f'<div class="wide">{table(header, html_cells, "r" * len(header))}</div>',
        ]
        parts += _html_notes(marks)
    parts += ["<h2>How to read the numbers</h2>", f"<p class=meta>{_inline(_intro(result))}</p>"]
    if result.command:
        parts.append(f"<p>Regenerate:</p><pre>{esc(result.command)}</pre>")
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

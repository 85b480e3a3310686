"""PNG plots for the HTML report (optional: ``pip install specverify[plots]``).

matplotlib is imported lazily inside :func:`render_plots` and drawn on an Agg canvas
(``matplotlib.figure.Figure`` + ``FigureCanvasAgg``: no pyplot, no global backend
switch, nothing at import time of specverify).  Figures use matplotlib's default
style, fixed sizes and DPI and no PNG ``Software`` metadata, so the same report
gives the same bytes.  Plots:

- observed vs expected counts per bin for the worst tests that recorded them
  (``details["observed"]``, ``details["expected"]``, ``details["bin_tokens"]``), with
  +-2 sqrt(expected) bars and the standardised residuals below;
- a QQ plot of every test's p-value against the uniform law (-log10 scale, 95%
  pointwise band from the Beta order-statistic law);
- acceptance rate per draft position and accepted-length distribution vs their exact
  expectation (``extra["acceptance"]``);
- minimum detectable binned TV vs N at power 0.9 for the run's degrees of freedom:
  TV* = sqrt(lambda* / (4 N)) with lambda* the noncentrality at which the chi-square
  test at level alpha has power 0.9 (scipy ``ncx2``), with each test's own value marked.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specverify.core.results import FAIL, PASS, SUSPICIOUS, Report, TestResult
from specverify.report import content as c

__all__ = ["Plot", "PlotSet", "bin_axis_label", "render_plots", "noncentrality_for_power"]

DPI = 100
GRADE_COLOR = {FAIL: "#c62828", SUSPICIOUS: "#ef8f00", PASS: "#2e7d32", None: "#607d8b"}
MAX_HISTOGRAMS = 4


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    caption: str
    png_base64: str


@dataclass(frozen=True)
class PlotSet:
    plots: list[Plot] = field(default_factory=list)
    unavailable: str | None = None  # why there are no plots at all


def noncentrality_for_power(df: float, alpha: float, power: float = 0.9) -> float:
    """lambda* with P(ncx2(df, lambda*) > chi2.isf(alpha, df)) = power."""
    from scipy import optimize, stats

    crit = stats.chi2.isf(alpha, df)
    hi = max(1.0, df)
    while stats.ncx2.sf(crit, df, hi) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda lam: stats.ncx2.sf(crit, df, lam) - power, 0.0, hi, xtol=1e-10))


def render_plots(report: Report) -> PlotSet:
    """Every plot the report's data allows; ``unavailable`` is set when matplotlib is missing."""
    try:
        import matplotlib
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return PlotSet([], "Plots are unavailable: matplotlib is not installed (pip install specverify[plots]).")

    def new_figure(width: float, height: float, rows: int = 1, cols: int = 1, **kw):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        return fig, fig.subplots(rows, cols, squeeze=False, **kw)

    def encode(fig) -> str:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        return base64.b64encode(buf.getvalue()).decode("ascii")

    plots: list[Plot] = []
    with matplotlib.style.context("default"), matplotlib.rc_context({"font.size": 9, "axes.titlesize": 10}):
        for r in _histogram_results(c.tested(report)):
            plots.append(_histogram(r, new_figure, encode))
        for make in (_qq, _acceptance, _mde):
            plot = make(report, new_figure, encode)
            if plot is not None:
                plots.append(plot)
    return PlotSet(plots, None)


#: Characters of a legend label at most (longer ones are cut with "...").
LEGEND_LABEL = 40


def _fitted(title: str, width: int = 90) -> str:
    """A title in at most two lines of ``width`` characters (a long scenario name must not squeeze the axes away)."""
    import textwrap

    lines = textwrap.wrap(title, width, break_long_words=True) or [""]
    if len(lines) > 2:
        lines = [lines[0], lines[1][: width - 3] + "..."]
    return "\n".join(lines)


def _legend(ax, *, above: bool = False) -> None:
    """The axes' legend outside its data: to the right, or in a row above (the constrained layout makes room)."""
    if above:
        legend = ax.legend(
            loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=8, frameon=False, borderaxespad=0.2
        )
    else:
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, borderaxespad=0.0)
    for text in legend.get_texts():  # a long name (a scenario's) must not squeeze the axes away
        label = text.get_text()
        if len(label) > LEGEND_LABEL:
            text.set_text(label[: LEGEND_LABEL - 3] + "...")


def _histogram_results(results: Sequence[TestResult]) -> list[TestResult]:
    """Failing and suspicious tests with per-bin counts (at most 4); else the 2 lowest-p passing ones."""
    with_counts = [r for r in c.worst_first(results) if c.counts_of(r)]
    flagged = [r for r in with_counts if r.grade in (FAIL, SUSPICIOUS)]
    return flagged[:MAX_HISTOGRAMS] if flagged else with_counts[:2]


def _histogram(r: TestResult, new_figure, encode) -> Plot:
    observed, expected, tokens = c.counts_of(r)
    nb = len(observed)
    x = list(range(nb))
    resid = [(o - e) / math.sqrt(e) if e > 0 else 0.0 for o, e in zip(observed, expected)]
    fig, axes = new_figure(8.0, 3.6, 2, 1, sharex=True, height_ratios=[3, 1.3])
    top, bottom = axes[0][0], axes[1][0]
    color = GRADE_COLOR.get(r.grade, GRADE_COLOR[None])
    if nb <= 100:
        top.bar(x, observed, width=0.8, color=color, alpha=0.55, label="observed")
        err = [2 * math.sqrt(max(e, 0.0)) for e in expected]
        top.errorbar(
            x,
            expected,
            yerr=err,
            fmt="_",
            color="black",
            markersize=10 if nb <= 40 else 4,
            elinewidth=0.8,
            label="expected +- 2 sqrt(expected)",
        )
        bottom.bar(x, resid, width=0.8, color=[GRADE_COLOR[FAIL] if abs(z) > 3 else "#78909c" for z in resid])
    else:  # many bins: lines instead of one patch per bin
        top.stairs(observed, [i - 0.5 for i in range(nb + 1)], color=color, lw=1.0, label="observed")
        top.plot(x, expected, color="black", lw=0.8, label="expected")
        bottom.plot(x, resid, ".", ms=2, color="#78909c")
        flagged = [(i, z) for i, z in zip(x, resid) if abs(z) > 3]
        bottom.plot([i for i, _ in flagged], [z for _, z in flagged], ".", ms=3, color=GRADE_COLOR[FAIL])
    positive = [e for e in expected if e > 0]
    if positive and max(positive) / min(positive) > 50:
        top.set_yscale("log")
    top.set_ylabel("count")
    _legend(top, above=True)
    title = f"{c.test_label(r)}: p={c.fmt(r.pvalue)}, N={c.fmt_int(r.n)} [{(r.grade or '?').upper()}]"
    top.set_title(_fitted(title), loc="left", pad=16)
    for level in (-3, 3):
        bottom.axhline(level, color="black", lw=0.6, ls="--")
    bottom.axhline(0, color="black", lw=0.6)
    bottom.set_ylabel("(o-e)/sqrt(e)")
    bottom.set_xlabel(bin_axis_label(tokens, expected))
    if nb <= 30:
        sizes = c.bin_sizes(r)
        labels = [c.bin_label(t, i, limit=3, size=sizes[i]) for i, t in enumerate(tokens)]
        slanted = nb > 12 or max(len(s) for s in labels) > 8
        bottom.set_xticks(
            x, labels, rotation=40 if slanted else 0, ha="right" if slanted else "center", fontsize=7 if slanted else 8
        )
    caption = (
        f"Observed vs expected counts per bin for {c.test_label(r)}; bars below are standardised "
        f"residuals (|z| > 3 in red)."
    )
    return Plot(f"hist-{c.test_label(r)}", f"Counts: {c.test_label(r)}", caption, encode(fig))


def bin_axis_label(tokens: Sequence, expected: Sequence[float]) -> str:
    """What the histogram's x axis shows: token ids where the bins recorded them, else bin numbers.

    Ticks are labelled with token ids only when the axis has at most 30 bins; bins whose tokens
    were not recorded (large pooled bins) are labelled ``bin i (m tokens)``.  The order is said
    to be most probable first when the expected counts do not increase (the p-order of
    :func:`specverify.stats.binning.make_bins`).
    """
    nb = len(expected)
    ordered = all(a >= b for a, b in zip(expected, expected[1:]))
    order = "most probable first" if ordered else "in the test's order"
    known = sum(t is not None for t in tokens)
    if nb > 30:
        return f"bin number ({nb} bins, {order})"
    if known == nb:
        return f"token ids in each bin ({order})"
    if known:
        return f"token ids in each bin, else bin number (bins {order})"
    return f"bin number (bins {order}; token ids not recorded)"


def _qq(report: Report, new_figure, encode) -> Plot | None:
    points = [(c.num(r.pvalue), r.grade) for r in c.tested(report)]
    points = sorted((p, g) for p, g in points if p is not None and not math.isnan(p))
    n = len(points)
    if n < 2:
        return None
    positive = [p for p, _ in points if p > 0]
    floor = min(min(positive, default=1.0), 1e-16) / 10.0
    import numpy as np
    from scipy import stats

    rank = np.arange(1, n + 1)
    expected = (-np.log10(rank / (n + 1))).tolist()
    observed = [-math.log10(min(max(p, floor), 1.0)) for p, _ in points]
    lo = (-np.log10(stats.beta.ppf(0.975, rank, n - rank + 1))).tolist()
    hi = (-np.log10(stats.beta.ppf(0.025, rank, n - rank + 1))).tolist()
    fig, axes = new_figure(7.0, 4.6)
    ax = axes[0][0]
    ax.fill_between(expected, lo, hi, color="#cfd8dc", label="95% band under H0")
    top = max(expected[0], 1.0)
    ax.plot([0, top], [0, top], color="black", lw=0.8)
    for grade in (PASS, SUSPICIOUS, FAIL, None):
        xs = [e for e, (p, g) in zip(expected, points) if g == grade and p > 0]
        ys = [o for o, (p, g) in zip(observed, points) if g == grade and p > 0]
        if xs:
            ax.scatter(xs, ys, s=14, color=GRADE_COLOR[grade], label=grade or "ungraded", zorder=3)
        xs = [e for e, (p, g) in zip(expected, points) if g == grade and p <= 0]
        if xs:
            ax.scatter(
                xs,
                [-math.log10(floor)] * len(xs),
                marker="^",
                s=30,
                color=GRADE_COLOR[grade],
                label=f"{grade or 'ungraded'}, p=0 (clipped)",
                zorder=3,
            )
    ax.set_xlabel("expected -log10 p (uniform)")
    ax.set_ylabel("observed -log10 p")
    ax.set_title(f"p-values vs uniform: {c.count_phrase(report)}", fontsize=9)
    _legend(ax)
    caption = (
        "Sorted raw p-values against uniform quantiles. Under a correct implementation points stay in the "
        "grey band; points far above it are deviations, a curve below it means conservative tests."
    )
    return Plot("qq", "p-value QQ plot", caption, encode(fig))


def _acceptance(report: Report, new_figure, encode) -> Plot | None:
    sections = c.acceptance(report)[:8]
    with_rates = [s for s in sections if s.rows]
    with_lengths = [s for s in sections if s.length_counts][:4]
    panels = int(bool(with_rates)) + int(bool(with_lengths))
    if not panels:
        return None
    fig, axes = new_figure(6.4 * panels + 1.0, 3.8, 1, panels)
    k = 0
    colors = ["#1565c0", "#6a1b9a", "#00838f", "#ad1457", "#4e342e", "#558b2f", "#283593", "#bf360c"]
    if with_rates:
        ax = axes[0][k]
        k += 1
        for j, s in enumerate(with_rates):
            xs = [i + 1 + (j - (len(with_rates) - 1) / 2) * 0.08 for i in range(len(s.rows))]
            err = [2 * math.sqrt(a.expected * (1 - a.expected) / a.n) if a.n else 0.0 for a in s.rows]
            col = colors[j % len(colors)]
            ax.errorbar(
                xs, [a.expected for a in s.rows], yerr=err, fmt="_", color="black", markersize=12, elinewidth=0.8
            )
            ax.plot(xs, [a.observed for a in s.rows], "o", color=col, ms=5, label=s.name)
        longest = max(with_rates, key=lambda s: len(s.rows))
        ax.set_xticks(range(1, len(longest.rows) + 1), [str(a.position) for a in longest.rows])
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_title("observed (dots) vs exact (bars: +- 2 SE)")
        _legend(ax)
    if with_lengths:
        ax = axes[0][k]
        width = 0.8 / len(with_lengths)
        for j, s in enumerate(with_lengths):
            total = sum(s.length_counts) or 1.0
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(s.length_counts))]
            col = colors[j % len(colors)]
            ax.bar(xs, [o / total for o in s.length_counts], width=width, color=col, alpha=0.55, label=s.name)
            ax.plot(xs, s.length_probs, "_", color="black", ms=10)
        ax.set_xlabel("accepted drafts per block")
        ax.set_ylabel("fraction of blocks")
        ax.set_title("accepted length: observed (bars) vs exact (ticks)")
        _legend(ax)
    caption = "Acceptance vs its exact expectation sum_x min(p, q) per draft position, and the accepted-length law."
    return Plot("acceptance", "Acceptance", caption, encode(fig))


def _pick_dfs(dfs: Sequence[float]) -> list[float]:
    dfs = sorted(set(dfs))
    if len(dfs) <= 4:
        return dfs
    return [dfs[0], dfs[len(dfs) // 2], dfs[-1]]


def _mde(report: Report, new_figure, encode) -> Plot | None:
    rows = [(c.finite(r.n), c.finite(r.df), c.finite(r.mde_tv), r) for r in c.tested(report)]
    rows = [(n, df, tv, r) for n, df, tv, r in rows if n and n > 0 and df and df > 0]
    if not rows:
        return None
    alphas = sorted(a for a in (c.finite(r.alpha) for _, _, _, r in rows) if a and 0 < a < 1)
    alpha = alphas[len(alphas) // 2] if alphas else c.finite(report.alpha)
    if not alpha or not 0 < alpha < 1:
        return None
    try:
        curves = [(df, noncentrality_for_power(df, alpha)) for df in _pick_dfs([df for _, df, _, _ in rows])]
    except ImportError:
        return None
    ns = [n for n, _, _, _ in rows]
    lo, hi = math.log10(max(min(ns) / 10, 1.0)), math.log10(max(ns) * 10)
    grid = [10 ** (lo + (hi - lo) * i / 99) for i in range(100)]
    fig, axes = new_figure(7.8, 4.4)
    ax = axes[0][0]
    for df, lam in curves:
        ax.plot(grid, [min(1.0, math.sqrt(lam / (4 * n))) for n in grid], lw=1.2, label=f"df={c.fmt(df)}")
    families = sorted({r.family for _, _, tv, r in rows if tv})
    for i, fam in enumerate(families):
        pts = [(n, tv) for n, _, tv, r in rows if tv and r.family == fam]
        ax.scatter(
            [p[0] for p in pts], [p[1] for p in pts], s=16, marker="os^Dv<>"[i % 7], zorder=3, label=f"tests: {fam}"
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="major", color="#e0e0e0", lw=0.6)
    ax.set_xlabel("N (samples)")
    ax.set_ylabel("minimum detectable binned TV")
    ax.set_title(f"detectable TV at power 0.9, alpha={c.fmt(alpha)}")
    _legend(ax)
    caption = (
        "Smallest binned total-variation distance a chi-square test with the given df detects with power 0.9 "
        "at the median allocated alpha, as N grows; markers are the run's tests at their own alpha."
    )
    return Plot("mde", "Detectable TV vs N", caption, encode(fig))

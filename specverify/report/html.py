"""Self-contained HTML rendering of a :class:`~specverify.core.results.Report` (``report.html``).

One file: inline CSS, plots as inline ``data:image/png;base64`` images, no
JavaScript, no external resources, so it can be attached to a CI run or mailed.
Every string from the report passes through :func:`html.escape`.  The section
order matches the Markdown (:mod:`specverify.report.markdown`), except that the plots
themselves sit where the Markdown points to them: before the test table.  The test table
lists every flagged test and the worst others; the rest are inside a ``<details>`` element.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specverify.core.results import ERROR, FAIL, PASS, SUSPICIOUS, Report, TestResult, effect_size, error_groups
from specverify.report import content as c
from specverify.report import drafter as d
from specverify.report.endpoint import endpoint_items
from specverify.report.endpoint import rendered_keys as endpoint_keys
from specverify.report.plots import PlotSet, render_plots

__all__ = ["render_html"]

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:15px;line-height:1.45;
color:#1f2328;max-width:1100px;margin:24px auto;padding:0 20px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:19px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}
.meta{color:#57606a;margin-bottom:14px} code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:10px;overflow-x:auto;white-space:pre-wrap}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600;font-size:14px;
vertical-align:middle}
.verdict{border-left:6px solid;padding:10px 14px;border-radius:4px;margin:12px 0}
.v-pass{border-color:#2e7d32;background:#edf7ee} .v-suspicious{border-color:#ef8f00;background:#fff6e5}
.v-fail{border-color:#c62828;background:#fdecea} .v-other{border-color:#607d8b;background:#eef2f4}
.v-error{border-color:#6a1b9a;background:#f5ecf8}
.b-pass{background:#2e7d32} .b-suspicious{background:#ef8f00} .b-fail{background:#c62828} .b-other{background:#607d8b}
.b-error{background:#6a1b9a}
.errors{border:2px solid #c62828;background:#fdecea;border-radius:6px;padding:4px 14px 10px;margin:14px 0}
.errors h2{border:none;color:#b71c1c;margin-top:8px}
.errors pre{background:#fff;border-color:#e57373}
table{border-collapse:collapse;margin:8px 0 14px;font-size:13px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.method{color:#57606a;font-size:12px;min-width:9em}
.wide{max-width:100%;overflow-x:auto;margin:8px 0 14px} .wide table{margin:0}
table.tests{width:100%} table.tests td,table.tests th{padding:3px 5px;overflow-wrap:break-word}
table.tests td.method{width:34%}
tr.sub td{color:#57606a;font-size:12px;border-top:none}
tr.g-fail td{background:#fdecea} tr.g-suspicious td{background:#fff6e5}
figure{margin:14px 0} figure img{max-width:100%;height:auto;border:1px solid #d0d7de}
figcaption{color:#57606a;font-size:13px} .note{color:#57606a;font-size:13px}
details summary{cursor:pointer;font-weight:600;margin:6px 0}
.diagnosis{border:1px solid #d0d7de;border-radius:4px;padding:8px 14px;margin:8px 0 12px;background:#f6f8fa}
.d-drafter,.d-verifier,.d-protocol,.d-other{border-color:#c62828;background:#fff}
ul.summary{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:8px 14px 8px 30px}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


_COLUMN_CLASS = {"r": "num", "m": "method"}


def _cls(verdict: Any) -> str:
    return verdict if verdict in (PASS, SUSPICIOUS, FAIL, ERROR) else "other"


def table(
    header: Sequence[str], rows: Iterable[Sequence[str]], numeric: str = "", row_classes=None, *, cls: str = ""
) -> str:
    """``rows`` hold already-escaped HTML; ``numeric`` marks right-aligned columns "r", muted ones "m";
    ``cls`` is the table's class."""
    attr = f' class="{cls}"' if cls else ""
    out = [f"<table{attr}><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(
            f'<td class="{_COLUMN_CLASS[numeric[j : j + 1]]}">{cell}</td>'
            if numeric[j : j + 1] in _COLUMN_CLASS
            else f"<td>{cell}</td>"
            for j, cell in enumerate(row)
        )
        out.append(f"<tr{cls}>{cells}</tr>")
    return "\n".join(out) + "</tbody></table>"


def _value(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return f"<code>{esc(json.dumps(value, default=str, allow_nan=True))}</code>"
    return f"<code>{esc(value)}</code>"


def _wide(table_html: str) -> str:
    """A table in its own horizontally scrolling box, so it never overflows the page's column."""
    return f'<div class="wide">{table_html}</div>'


def _breakable(value: Any) -> str:
    """Escaped text with optional line breaks after ``:``, ``_``, ``,`` and ``/`` (long ids in narrow columns)."""
    text = esc(value)
    for ch in ":_,/":
        text = text.replace(ch, ch + "<wbr>")
    return text


def _result_rows(results: Sequence[TestResult], start: int) -> tuple[list[list[str]], list[str]]:
    rows, classes = [], []
    for i, r in enumerate(results):
        grade = r.grade or "?"
        rows.append(
            [
                str(start + i),
                f"<b>{esc(grade.upper())}</b>" if grade in (FAIL, SUSPICIOUS) else esc(grade),
                esc(r.family),
                _breakable(r.name),
                _breakable(r.scenario),
                _breakable(r.position),
                esc(c.fmt_int(r.n)),
                esc(c.fmt(r.statistic, ".4g")),
                esc(c.fmt(r.pvalue)),
                esc(c.fmt(r.adjusted_pvalue)),
                esc(c.fmt(effect_size(r))),
                esc(c.fmt(r.alpha)),
                esc(c.fmt(r.mde_tv)),
                esc(r.method),
            ]
        )
        classes.append(f"g-{r.grade}" if r.grade in (FAIL, SUSPICIOUS) else "")
    return rows, classes


RESULT_HEADER = [*c.RESULT_COLUMNS, "method"]
RESULT_NUMERIC = "r.....rrrrrrrm"


def _tests_section(report: Report) -> list[str]:
    tests = c.tested(report)
    listed, folded = c.split_tests(tests)
    out = [f"<h2>Tests, flagged and worst first: {esc(c.count_phrase(report))}; {esc(c.grade_counts(tests))}</h2>"]
    if not listed:
        return out + ["<p>No statistical tests ran.</p>"]
    rows, classes = _result_rows(listed, 1)
    out.append(_wide(table(RESULT_HEADER, rows, RESULT_NUMERIC, classes, cls="tests")))
    if folded:
        rows, classes = _result_rows(folded, len(listed) + 1)
        out.append(f"<details><summary>{len(folded)} more tests ({esc(c.grade_counts(folded))})</summary>")
        out.append(_wide(table(RESULT_HEADER, rows, RESULT_NUMERIC, classes, cls="tests")) + "</details>")
    out.append(
        '<p class="note">Observed TV: the deviation the test saw, on the total-variation scale (binned TV from '
        "its counts, the acceptance-rate difference, or one token's frequency difference); tests of other kinds "
        "have none. Detectable TV: the binned total-variation distance the test detects with power "
        "0.9 at its allocated alpha.</p>"
    )
    return out


def _repro_section(report: Report) -> list[str]:
    out = ["<h2>Reproduce</h2>"]
    if c.repro_is_python(report):
        out.append(
            '<p class="note">This run was started from Python with plain objects; the snippet below says how '
            "to rerun it.</p>"
        )
    out.append(f"<pre>{esc(c.repro_command(report))}</pre>")
    out.append(table(["seed", "value"], [[esc(k), _value(v)] for k, v in c.seeds(report)]))
    return out


def _errors_section(report: Report) -> list[str]:
    """Each implementation error once, with the scenarios that met it (instead of a counterexample)."""
    if not report.errors:
        return []
    out = [f'<div class="errors"><h2>{esc(c.errors_heading(report))}</h2>']
    for group in error_groups(report):
        where = f"<p>{esc(c.sentence_start(group.where(limit=len(group.scenarios))))}:</p>" if group.scenarios else ""
        out.append(f"{where}<pre>{esc(group.message)}</pre>")
    return out + ["</div>"]


def _counterexample_section(report: Report) -> list[str]:
    ce = c.counterexample(report)
    if ce is None:
        return []
    r = ce.result
    out = [
        "<h2>Minimal counterexample</h2>",
        f"<p>The first failure (lowest adjusted p, then largest observed TV{esc(_effect(r))}: the test the "
        f"verdict and the terminal summary name first): <code>{esc(r.family)}/{esc(r.name)}</code> at scenario "
        f"<code>{esc(r.scenario or '?')}</code>, position <code>{esc(r.position or '?')}</code>: statistic "
        f"{esc(c.fmt(r.statistic, '.4g'))}, p={esc(c.fmt(r.pvalue))}, adjusted p={esc(c.fmt(r.adjusted_pvalue))}, "
        f"N={esc(c.fmt_int(r.n))} ({esc(r.method)}).</p>",
    ]
    sc = ce.scenario
    if sc:
        config = ", ".join(f"{esc(k)}={_value(v)}" for k, v in sc.items() if not str(k).endswith("_preview"))
        out.append(f"<p>Scenario: {config}.</p>")
        for key, label in (("target_probs_preview", "Target law p"), ("draft_probs_preview", "Draft law q")):
            if key in sc:
                shown = c.preview(sc[key])
                text = "\n".join(shown) if isinstance(shown, list) else shown
                out.append(f"<p>{esc(label)}:</p><pre>{esc(text)}</pre>")
    else:
        out.append(f"<p>No configuration recorded for scenario <code>{esc(r.scenario or '?')}</code>.</p>")
    details = r.details if isinstance(r.details, Mapping) else {}
    if details.get("tokens"):
        out.append(f"<p>Emitted tokens with target probability 0: {_value(details['tokens'])}.</p>")
    if ce.rows:
        out.append(
            f"<p>Observed vs expected counts ({len(ce.rows)} of {len(ce.counts[0])} bins, largest "
            "standardised residual first):</p>"
        )
        out.append(
            table(
                ["bin (tokens)", "observed", "expected", "obs - exp", "(obs - exp)/sqrt(exp)"],
                (
                    [
                        esc(label),
                        esc(c.fmt(o, ".6g")),
                        esc(c.fmt(e, ".6g")),
                        esc(c.fmt(o - e, ".4g")),
                        esc(c.fmt(z, ".3g")),
                    ]
                    for label, o, e, z in ce.rows
                ),
                ".rrrr",
            )
        )
    else:
        out.append('<p class="note">This test recorded no per-bin counts (details keys "observed"/"expected").</p>')
    return out


def _acceptance_section(report: Report) -> list[str]:
    sections = c.acceptance(report)
    if not sections:
        return []
    out = ["<h2>Acceptance vs its exact expectation</h2>"]
    for sc in sections:
        out.append(f"<p>Scenario <code>{esc(sc.name)}</code>:</p>")
        if sc.rows:
            rows = []
            for a in sc.rows:
                se = (a.expected * (1 - a.expected) / a.n) ** 0.5 if a.n else None
                z = (a.observed - a.expected) / se if se else None
                rows.append(
                    [
                        esc(a.position),
                        esc(c.fmt(a.observed, ".4f")),
                        esc(c.fmt(a.expected, ".4f")),
                        esc(c.fmt_int(a.n)),
                        esc(c.fmt(z, ".3g")),
                    ]
                )
            out.append(table(["draft position", "observed rate", "expected rate", "N", "z"], rows, ".rrrr"))
        if sc.length_counts:
            total = sum(sc.length_counts) or 1.0
            rows = [
                [str(i), esc(c.fmt_int(o)), esc(c.fmt(o / total, ".4f")), esc(c.fmt(p, ".4f"))]
                for i, (o, p) in enumerate(zip(sc.length_counts, sc.length_probs))
            ]
            out.append(table(["accepted drafts", "blocks", "observed fraction", "exact probability"], rows, "rrrr"))
    return out


def _diagnosis_section(report: Report) -> list[str]:
    diag = d.diagnosis(report)
    if diag is None:
        return []
    kind = diag.culprit if diag.culprit in d.CULPRIT_LABEL else ("none" if diag.culprit is None else "other")
    out = [f'<div class="diagnosis d-{kind}"><b>Diagnosis: {esc(diag.headline)}.</b> {esc(diag.sentence)}']
    failed = diag.unlisted_failures
    if failed:
        shown = ", ".join(f"<code>{esc(t)}</code>" for t in failed[: d.MAX_FAILED_LISTED])
        more = f" and {len(failed) - d.MAX_FAILED_LISTED} more" if len(failed) > d.MAX_FAILED_LISTED else ""
        out.append(f"<br>Failing tests ({len(failed)}): {shown}{more}.")
    return ["".join(out) + "</div>"]


def _efficiency_section(report: Report) -> list[str]:
    eff = d.efficiency(report)
    if eff is None:
        return []
    out = ["<h2>Efficiency</h2>"]
    summary = d.summary_items(eff)
    if summary:
        out.append('<ul class="summary">' + "".join(f"<li>{esc(s)}</li>" for s in summary) + "</ul>")
    sample = d.sample_sentence(eff)
    if sample:
        out.append(f"<p>{esc(sample)}</p>")
    if eff.positions:
        header, rows = d.position_table(eff)
        out.append(
            "<p>Acceptance per in-block position (Clopper-Pearson interval; the exact rate is the mean of "
            "the per-trial sum<sub>x</sub> min(p, q)):</p>"
        )
        out.append(table(header, [[esc(x) for x in row] for row in rows], "rrrrrr"))
    if eff.metrics:
        header, rows = d.metric_table(eff)
        out.append(table(header, [[esc(x) for x in row] for row in rows], ".rrr"))
    if eff.curves:
        header, rows, best = d.speedup_table(eff)
        cells = [
            [f"<b>{esc(x)}</b>" if (i, j) in best else esc(x) for j, x in enumerate(row)] for i, row in enumerate(rows)
        ]
        out.append(
            "<p>Speedup over plain decoding (x) by draft length K (columns) for drafter cost c = drafter "
            "pass / target pass (rows); the best K in bold:</p>"
        )
        out.append(table(header, cells, "." + "r" * (len(header) - 1)))
        if eff.note:
            out.append(f'<p class="note">Model: {esc(eff.note)}.</p>')
    latency = d.latency_sentence(eff)
    if latency:
        out.append(f"<p>{esc(latency)}</p>")
    lines = d.speedup_sentences(eff)
    if lines:
        out.append("<ul>" + "".join(f"<li>{esc(s)}</li>" for s in lines) + "</ul>")
    return out


def _plots_section(plot_set: PlotSet | None) -> list[str]:
    out = ["<h2>Plots</h2>"]
    if plot_set is None:
        return out + ['<p class="note">Plots were not requested (plots=False).</p>']
    if plot_set.unavailable:
        return out + [f'<p class="note">{esc(plot_set.unavailable)}</p>']
    if not plot_set.plots:
        return out + ['<p class="note">The report holds no data to plot.</p>']
    for p in plot_set.plots:
        out.append(
            f'<figure><img src="data:image/png;base64,{p.png_base64}" alt="{esc(p.title)}">'
            f"<figcaption>{esc(p.caption)}</figcaption></figure>"
        )
    return out


def _effect(result: TestResult) -> str:
    effect = effect_size(result)
    return "" if effect is None else f", here {c.fmt(effect)}"


def _scenarios_section(report: Report) -> list[str]:
    layout = c.scenario_table(report)
    if layout is None:
        return []
    body = [f"<h2>Scenarios ({len(report.scenarios)})</h2>"]
    if layout.common:
        shared = ", ".join(f"{esc(k)}=<code>{esc(v)}</code>" for k, v in layout.common)
        body.append(f'<p class="note">Every scenario has {shared}.</p>')
    if layout.rows:
        width = len(layout.columns)
        head = "".join(f"<th>{_breakable(k)}</th>" for k in layout.columns)
        out = [f'<table class="scenarios"><thead><tr>{head}</tr></thead><tbody>']
        for row, notes in zip(layout.rows, layout.notes):
            cells = "".join(
                f"<td><code>{_breakable(row.get(k, ''))}</code></td>"
                if k == "name"
                else f"<td>{esc(row.get(k, ''))}</td>"
                for k in layout.columns
            )
            out.append(f"<tr>{cells}</tr>")
            if notes:
                text = " · ".join(esc(v) if k == "description" else f"{esc(k)}: {esc(v)}" for k, v in notes)
                out.append(f'<tr class="sub"><td colspan="{width}">{text}</td></tr>')
        body.append(_wide("\n".join(out) + "</tbody></table>"))
    if layout.others:
        body.append("<ul>" + "".join(f"<li>{_value(sc)}</li>" for sc in layout.others) + "</ul>")
    return body


def _mapping_section(title: str, data: Any) -> list[str]:
    if not isinstance(data, Mapping) or not data:
        return []
    rows = [[_breakable(path), esc(text)] for path, text in c.readable_items(data)]
    return [f"<h2>{esc(title)}</h2>", _wide(table(["key", "value"], rows))]


def _timings_section(report: Report) -> list[str]:
    header, rows = c.timing_rows(report)
    if not rows:
        return []
    return ["<h2>Timings</h2>", table(header, [[esc(x) for x in row] for row in rows], "l" + "r" * (len(header) - 1))]


def render_html(report: Report, *, plots: bool = True) -> str:
    """Render ``report`` as one self-contained HTML page (plots inline when matplotlib is available)."""
    verdict = report.verdict.upper() if isinstance(report.verdict, str) else str(report.verdict)
    total_time = report.timings.get("total") if isinstance(report.timings, Mapping) else None
    cls = _cls(report.verdict)
    title = f"specverify {report.kind} audit of {report.implementation}: {verdict}"
    body = [
        f'<h1>specverify {esc(report.kind)} audit <span class="badge b-{cls}">{esc(verdict)}</span></h1>',
        f'<div class="meta">implementation <code>{esc(report.implementation)}</code> · tier '
        f"<code>{esc(report.tier)}</code> · seed <code>{esc(report.seed)}</code> · alpha "
        f"{esc(c.fmt(report.alpha))} · {esc(c.count_phrase(report))} · time {esc(c.fmt(total_time, '.1f', 'n/a'))} s</div>",
        f'<div class="verdict v-{cls}">{esc(c.verdict_paragraph(report))}</div>',
    ]
    rule = c.conformance_sentence(report)
    body += [f'<p class="conformance">{esc(c.sentence_start(rule))}</p>'] if rule else []
    body += _diagnosis_section(report)
    body += _efficiency_section(report)
    body += _errors_section(report)
    items = endpoint_items(report)
    body += ["<h2>Endpoint</h2>", "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"] if items else []
    body += _counterexample_section(report)
    body += _repro_section(report)
    body += _plots_section(render_plots(report) if plots else None)
    body += _tests_section(report)
    body += _acceptance_section(report)
    body += _scenarios_section(report)
    body += _timings_section(report)
    body += _mapping_section("Environment", report.environment)
    rendered = d.rendered_extra_keys(report) | endpoint_keys(report)
    body += _mapping_section("Other sections", c.other_extra(report, exclude=rendered))
    head = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
    )
    return head + "\n" + "\n".join(body) + "\n</body></html>\n"

"""Markdown rendering of a :class:`~specverify.core.results.Report` (``report.md``).

Order (what the reader asked first): title and one-line configuration, the verdict
paragraph, the diagnosis (drafter audits: which component is at fault), the drafter
audit's efficiency section (a summary -- acceptance per position vs exact, tokens per
target pass, best K and speedup, memory-bound latency -- then its tables), implementation
errors (each once, with the scenarios that met it), the minimal counterexample (failures), the repro command (or Python snippet) and
seeds, a pointer to the plots, the test table (every flagged test and the worst others
listed, the rest folded in ``<details>``), acceptance tables, configuration, timings,
environment and other sections.  Every string taken from
the report is escaped (CommonMark backslash escapes, code spans with a long
enough fence) so that an implementation name such as ``<script>`` stays text.
Plots live in ``report.html`` only (Markdown viewers do not show data URIs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specverify.core.results import FAIL, PASS, SUSPICIOUS, Report, TestResult, effect_size, error_groups
from specverify.report import content as c
from specverify.report import drafter as d
from specverify.report.endpoint import endpoint_items
from specverify.report.endpoint import rendered_keys as endpoint_keys

__all__ = ["render_markdown", "md_text", "md_code"]

# ``_`` is left alone: intraword underscores never emphasise in CommonMark, and names are full of them.
_MD_SPECIAL = re.compile(r"([\\`*{}\[\]<>|#!~])")


def md_text(value: Any) -> str:
    """Escape text for Markdown prose or a table cell (one line)."""
    text = " ".join(str(value).split())
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_code(value: Any) -> str:
    """An inline code span holding ``value`` literally (pipes escaped for tables)."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    runs = [len(m) for m in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_block(value: Any, lang: str = "") -> list[str]:
    """A fenced code block holding ``value`` literally."""
    text = str(value)
    runs = [len(m) for m in re.findall(r"`{3,}", text)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return [f"{fence}{lang}", text, fence]


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> list[str]:
    align = align or "l" * len(header)
    marks = {"l": "---", "r": "--:", "c": ":-:"}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


GRADE_BADGE = {FAIL: "**FAIL**", SUSPICIOUS: "**suspicious**", PASS: "pass"}


def result_row(i: int, r: TestResult) -> list[str]:
    return [
        str(i),
        GRADE_BADGE.get(r.grade, md_text(r.grade or "?")),
        md_code(r.family),
        md_code(r.name),
        md_code(r.scenario) if r.scenario else "",
        md_code(r.position) if r.position else "",
        c.fmt_int(r.n),
        c.fmt(r.statistic, ".4g"),
        c.fmt(r.pvalue),
        c.fmt(r.adjusted_pvalue),
        c.fmt(effect_size(r)),
        c.fmt(r.alpha),
        c.fmt(r.mde_tv),
    ]


RESULT_HEADER = c.RESULT_COLUMNS
RESULT_ALIGN = "rllllllrrrrrr"


def _value(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return md_code(json.dumps(value, default=str, allow_nan=True))
    return md_code(value)


def counterexample_lines(report: Report) -> list[str]:
    ce = c.counterexample(report)
    if ce is None:
        return []
    r = ce.result
    lines = [
        "## Minimal counterexample",
        "",
        f"The first failure (lowest adjusted p, then largest observed TV{_effect(r)}: the test the verdict and "
        f"the terminal summary name first): {md_code(r.family + '/' + r.name)} at scenario "
        f"{md_code(r.scenario or '?')}, position {md_code(r.position or '?')}: statistic "
        f"{c.fmt(r.statistic, '.4g')}, p={c.fmt(r.pvalue)}, adjusted p={c.fmt(r.adjusted_pvalue)}, "
        f"N={c.fmt_int(r.n)} ({md_text(r.method)}).",
        "",
    ]
    sc = ce.scenario
    if sc:
        config = [f"{md_text(k)}={_value(v)}" for k, v in sc.items() if not str(k).endswith("_preview")]
        lines += ["Scenario: " + ", ".join(config) + ".", ""]
        for key, label in (("target_probs_preview", "Target law p"), ("draft_probs_preview", "Draft law q")):
            if key in sc:
                shown = c.preview(sc[key])
                if isinstance(shown, list):
                    lines += [f"{label}:", ""] + [f"- {md_text(s)}" for s in shown] + [""]
                else:
                    lines += [f"{label}: {md_text(shown)}", ""]
    else:
        lines += [f"(No configuration recorded for scenario {md_code(r.scenario or '?')}.)", ""]
    details = r.details if isinstance(r.details, Mapping) else {}
    if details.get("tokens"):
        lines += [f"Emitted tokens with target probability 0: {_value(details['tokens'])}.", ""]
    if ce.rows:
        total = len(ce.counts[0])
        lines += [
            f"Observed vs expected counts ({len(ce.rows)} of {total} bins, largest standardised residual first):",
            "",
        ]
        lines += table(
            ["bin (tokens)", "observed", "expected", "obs - exp", "(obs - exp)/sqrt(exp)"],
            (
                [md_text(label), c.fmt(o, ".6g"), c.fmt(e, ".6g"), c.fmt(o - e, ".4g"), c.fmt(z, ".3g")]
                for label, o, e, z in ce.rows
            ),
            "lrrrr",
        )
        lines.append("")
    else:
        lines += ['This test recorded no per-bin counts (details keys "observed"/"expected").', ""]
    return lines


def acceptance_lines(report: Report) -> list[str]:
    sections = c.acceptance(report)
    if not sections:
        return []
    lines = ["## Acceptance vs its exact expectation", ""]
    for sc in sections:
        lines += [f"Scenario {md_code(sc.name)}:", ""]
        if sc.rows:
            rows = []
            for a in sc.rows:
                se = (a.expected * (1 - a.expected) / a.n) ** 0.5 if a.n else None
                z = (a.observed - a.expected) / se if se else None
                rows.append(
                    [
                        md_text(a.position),
                        c.fmt(a.observed, ".4f"),
                        c.fmt(a.expected, ".4f"),
                        c.fmt_int(a.n),
                        c.fmt(z, ".3g"),
                    ]
                )
            lines += table(["draft position", "observed rate", "expected rate", "N", "z"], rows, "lrrrr") + [""]
        if sc.length_counts:
            total = sum(sc.length_counts) or 1.0
            rows = [
                [str(i), c.fmt_int(o), c.fmt(o / total, ".4f"), c.fmt(p, ".4f")]
                for i, (o, p) in enumerate(zip(sc.length_counts, sc.length_probs))
            ]
            lines += table(["accepted drafts", "blocks", "observed fraction", "exact probability"], rows, "rrrr") + [""]
    return lines


def diagnosis_lines(report: Report) -> list[str]:
    diag = d.diagnosis(report)
    if diag is None:
        return []
    lines = [f"**Diagnosis: {md_text(diag.headline)}.** {md_text(diag.sentence)}", ""]
    failed = diag.unlisted_failures
    if failed:
        shown = ", ".join(md_code(t) for t in failed[: d.MAX_FAILED_LISTED])
        more = f" and {len(failed) - d.MAX_FAILED_LISTED} more" if len(failed) > d.MAX_FAILED_LISTED else ""
        lines += [f"Failing tests ({len(failed)}): {shown}{more}.", ""]
    return lines


def efficiency_lines(report: Report) -> list[str]:
    eff = d.efficiency(report)
    if eff is None:
        return []
    lines = ["## Efficiency", ""]
    lines += [f"- {md_text(item)}" for item in d.summary_items(eff)] + [""]
    sample = d.sample_sentence(eff)
    if sample:
        lines += [md_text(sample), ""]
    if eff.positions:
        header, rows = d.position_table(eff)
        lines += [
            "Acceptance per in-block position (Clopper-Pearson interval; the exact rate is the mean of the "
            "per-trial sum_x min(p, q)):",
            "",
        ]
        lines += table(header, [[md_text(x) for x in row] for row in rows], "rrrrrrl") + [""]
    if eff.metrics:
        header, rows = d.metric_table(eff)
        lines += table(header, [[md_text(x) for x in row] for row in rows], "lrrr") + [""]
    if eff.curves:
        header, rows, best = d.speedup_table(eff)
        cells = [
            [f"**{md_text(x)}**" if (i, j) in best else md_text(x) for j, x in enumerate(row)]
            for i, row in enumerate(rows)
        ]
        lines += [
            "Speedup over plain decoding (x) by draft length K (columns) for drafter cost c = drafter pass / "
            "target pass (rows); the best K in bold:",
            "",
        ]
        lines += table(header, cells, "l" + "r" * (len(header) - 1)) + [""]
        if eff.note:
            lines += [f"Model: {md_text(eff.note)}.", ""]
    latency = d.latency_sentence(eff)
    if latency:
        lines += [md_text(latency), ""]
    if eff.curves:
        lines += [f"- {md_text(s)}" for s in d.speedup_sentences(eff)] + [""]
    return lines


def mapping_lines(title: str, data: Any) -> list[str]:
    if not isinstance(data, Mapping) or not data:
        return []
    rows = [[md_code(path), md_text(text)] for path, text in c.readable_items(data)]
    return [f"## {title}", ""] + table(["key", "value"], rows) + [""]


def timings_lines(report: Report) -> list[str]:
    header, rows = c.timing_rows(report)
    if not rows:
        return []
    return (
        ["## Timings", ""]
        + table(header, [[md_code(r[0]), *r[1:]] for r in rows], "l" + "r" * (len(header) - 1))
        + [""]
    )


def _test_table(results: list[TestResult]) -> list[str]:
    return table(RESULT_HEADER, (result_row(i + 1, r) for i, r in enumerate(results)), RESULT_ALIGN)


def tests_lines(report: Report, *, max_rows: int = 40) -> list[str]:
    """The test table: flagged and worst tests listed, the rest folded in ``<details>`` (at most
    ``max_rows`` rows in each part; every test is in report.json and report.html)."""
    tests = c.tested(report)
    listed, folded = c.split_tests(tests)
    lines = [f"## Tests, flagged and worst first: {c.count_phrase(report)}; {c.grade_counts(tests)}", ""]
    if not listed:
        return lines + ["No statistical tests ran.", ""]
    shown = listed[:max_rows]
    lines += _test_table(shown)
    hidden = listed[len(shown) :] + folded
    if hidden:
        inside = hidden[:max_rows]
        rest = hidden[len(inside) :]
        lines += ["", f"<details><summary>{len(hidden)} more tests ({c.grade_counts(hidden)})</summary>", ""]
        lines += table(RESULT_HEADER, (result_row(len(shown) + i + 1, r) for i, r in enumerate(inside)), RESULT_ALIGN)
        if rest:
            lines += [
                "",
                f"... and {len(rest)} more tests ({c.grade_counts(rest)}); all are in report.json and report.html.",
            ]
        lines += ["", "</details>"]
    lines += [
        "",
        "Observed TV: the deviation the test saw, on the total-variation scale (binned TV from its counts, the "
        "acceptance-rate difference, or one token's frequency difference); tests of other kinds have none. "
        "Detectable TV: the binned total-variation distance this test detects with power 0.9 at its alpha.",
        "",
    ]
    return lines


def repro_lines(report: Report) -> list[str]:
    """The Reproduce section: the recorded command line (or Python snippet) and every seed."""
    python = c.repro_is_python(report)
    lines = ["## Reproduce", ""]
    if python:
        lines += ["This run was started from Python with plain objects; the snippet below says how to rerun it.", ""]
    lines += md_block(c.repro_command(report), "python" if python else "sh") + [""]
    lines += table(["seed", "value"], [[md_text(k), _value(v)] for k, v in c.seeds(report)]) + [""]
    return lines


def _effect(result: TestResult) -> str:
    effect = effect_size(result)
    return "" if effect is None else f", here {c.fmt(effect)}"


def scenario_lines(report: Report) -> list[str]:
    """The Scenarios section: one table row per scenario, one column per configuration key."""
    layout = c.scenario_table(report)
    if layout is None:
        return []
    lines = [f"## Scenarios ({len(report.scenarios)})", ""]
    if layout.common:
        lines += ["Every scenario has " + ", ".join(f"{md_text(k)}={md_code(v)}" for k, v in layout.common) + ".", ""]
    if layout.rows:
        with_notes = any(layout.notes)
        header = [md_text(k) for k in layout.columns] + (["notes"] if with_notes else [])
        rows = []
        for row, notes in zip(layout.rows, layout.notes):
            cells = [md_code(row[k]) if k == "name" and k in row else md_text(row.get(k, "")) for k in layout.columns]
            if with_notes:
                cells.append(
                    "; ".join(md_text(v) if k == "description" else f"{md_text(k)}: {md_text(v)}" for k, v in notes)
                )
            rows.append(cells)
        lines += table(header, rows) + [""]
    lines += [f"- {_value(sc)}" for sc in layout.others]
    return lines + ([""] if layout.others else [])


def render_markdown(report: Report, *, max_rows: int = 40) -> str:
    """Render ``report`` as Markdown (section order in the module docstring).

    ``max_rows`` caps the listed part of the test table and, separately, its folded part.
    """
    total_time = report.timings.get("total") if isinstance(report.timings, Mapping) else None
    lines = [
        f"# specverify {md_text(report.kind)} audit: {md_text(str(report.verdict).upper())}",
        "",
        f"Implementation {md_code(report.implementation)} · tier {md_code(report.tier)} · seed "
        f"{md_code(report.seed)} · alpha {c.fmt(report.alpha)} · {c.count_phrase(report)} · time "
        f"{c.fmt(total_time, '.1f', 'n/a')} s",
        "",
        md_text(c.verdict_paragraph(report)),
        "",
    ]
    rule = c.conformance_sentence(report)
    lines += [md_text(c.sentence_start(rule)), ""] if rule else []
    lines += diagnosis_lines(report)
    lines += efficiency_lines(report)
    if report.errors:
        lines += [f"## {c.errors_heading(report)}", ""]
        for group in error_groups(report):
            lines += (
                [md_text(c.sentence_start(group.where(limit=len(group.scenarios)))) + ":", ""]
                if group.scenarios
                else []
            )
            lines += md_block(group.message) + [""]
    items = endpoint_items(report)
    lines += (["## Endpoint", ""] + [f"- {md_text(item)}" for item in items] + [""]) if items else []
    lines += counterexample_lines(report)
    lines += repro_lines(report)
    lines += ["## Plots", "", "Plots are embedded in report.html.", ""]
    lines += tests_lines(report, max_rows=max_rows)
    lines += acceptance_lines(report)
    lines += scenario_lines(report)
    lines += timings_lines(report)
    lines += mapping_lines("Environment", report.environment)
    rendered = d.rendered_extra_keys(report) | endpoint_keys(report)
    lines += mapping_lines("Other sections", c.other_extra(report, exclude=rendered))
    return "\n".join(lines).rstrip("\n") + "\n"

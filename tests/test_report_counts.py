"""One count of tests everywhere, numbers rounded to what they mean, sections for a reader, legends off the data.

A verifier audit's committed report holds tests of the law and rule-conformance tests: the
terminal, the JSON, the Markdown header, the HTML header and the p-value plot's title must state
the same counts in the same words.  Timings read to the 10 ms, nested sections as rows (never a
JSON dump), and no plot's legend may overlap its axes' data area.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specverify.core.results import Report
from specverify.report import render_html, render_markdown
from specverify.report.plots import render_plots

REPORTS = Path(__file__).resolve().parents[1] / "reports"


@pytest.fixture(scope="module")
def verifier_report() -> Report:
    data = json.loads((REPORTS / "reference-verifier" / "report.json").read_text())
    return Report.from_dict(data)


def test_every_rendering_counts_the_tests_the_same_way(verifier_report):
    report = verifier_report
    data = report.to_dict()
    counts = data["test_counts"]
    assert counts["rule_conformance"] > 0 and counts["law"] + counts["rule_conformance"] == counts["total"]
    phrase = (
        f"{counts['total']:,} tests ({counts['law']:,} of the law, {counts['rule_conformance']:,} of rule conformance)"
    )
    assert data["conformance"]["tests"] == counts["rule_conformance"]
    assert phrase in report.summary().splitlines()[1]
    markdown, page = render_markdown(report), render_html(report, plots=False)
    assert phrase in markdown.splitlines()[2] and f"Tests, flagged and worst first: {phrase}" in markdown
    assert phrase in page and f"Tests, flagged and worst first: {phrase}" in page
    assert f"All {counts['law']:,} tests of the law passed" in markdown


def test_timings_and_nested_sections_are_written_for_a_reader(verifier_report):
    markdown = render_markdown(verifier_report)
    timings = markdown.split("## Timings")[1].split("\n## ")[0]
    assert "| part | wall s | CPU s |" in timings
    numbers = re.findall(r"\| ([\d,]+\.\d+) \|", timings)
    assert numbers and all(re.fullmatch(r"[\d,]+\.\d\d", n) for n in numbers)
    other = markdown.split("## Other sections")[1] if "## Other sections" in markdown else ""
    assert "{" not in other and "cpu_seconds" not in other  # rows, not a JSON dump; CPU time is in Timings


def test_no_legend_covers_the_data_of_its_plot(verifier_report, monkeypatch):
    from matplotlib.figure import Figure

    checked = []
    save = Figure.savefig

    def checking_savefig(fig, *args, **kwargs):
        fig.canvas.draw()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                box, area = legend.get_window_extent(), ax.get_window_extent()
                assert not box.overlaps(area), f"the legend of {ax.get_title()!r} covers its data"
                checked.append(ax.get_title())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checking_savefig)
    plots = render_plots(verifier_report)
    assert plots.plots and len(checked) >= 3  # histograms, p-values, detectable TV (and acceptance)

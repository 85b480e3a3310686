"""Committed reports are what the current code renders from their recorded results.

``tools/reports/rerender.py --check`` reads every ``report.json`` and ``sweep.json`` under
``reports/``, recomputes each verdict from the recorded results and errors and renders the
Markdown again: a renderer or verdict-rule change without the reports rendered again fails
here (``python tools/reports/rerender.py`` renders them).  The sweeps read back equal their JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specverify.measure.sweep import SweepResult

ROOT = Path(__file__).resolve().parents[1]


def test_committed_reports_are_rendered_by_the_current_code():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "reports" / "rerender.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "reports").rglob("sweep.json")), ids=lambda p: p.parent.name)
def test_a_sweep_reads_back_as_it_was_written(path):
    data = json.loads(path.read_text())
    sweep = SweepResult.from_dict(data)
    assert sweep.to_dict() == data
    assert all(isinstance(p.value, (int, float, str, tuple, type(None))) for p in sweep.points)


def test_compare_reads_a_report_against_itself_and_sees_a_moved_number_and_verdict(tmp_path):
    """``tools.reports.compare``: what a fresh regeneration is checked with (verdict, tests, numbers)."""
    from tools.reports import compare

    source = next(iter(sorted((ROOT / "reports" / "llama-cpp").glob("*/report.json"))))
    old = json.loads(source.read_text())
    same = compare.compare_report(old, old)
    assert same == {"verdicts": (old["verdict"],) * 2, "same_tests": True, "max_rel": 0.0, "where": ""}
    moved = json.loads(source.read_text())
    statistic = float(moved["results"][0]["statistic"])
    moved["results"][0]["statistic"] = statistic + 2e-3 * max(abs(statistic), 1.0)
    moved["verdict"] = "fail"
    c = compare.compare_report(old, moved)
    assert c["verdicts"] == (old["verdict"], "fail") and c["max_rel"] > 1e-3 and "statistic" in c["where"]
    for directory, data in (("a", old), ("b", moved)):
        (tmp_path / directory / "x").mkdir(parents=True)
        (tmp_path / directory / "x" / "report.json").write_text(json.dumps(data))
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "a")]) == 0
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1

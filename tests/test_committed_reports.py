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

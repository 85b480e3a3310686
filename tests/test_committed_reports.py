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


def test_a_configuration_without_a_report_says_how_it_ended():
    """HTTP 4xx is a refusal; a server that stopped answering crashed (with its logged cause); HTTP 5xx is a
    server error; the options cell keeps what the server was asked, not how the audit ran."""
    from tools.reports.matrix import _asked, _failure

    url = "EndpointError: POST http://127.0.0.1:8000/v1/completions: "
    assert _failure({"error": url + "HTTP 400: min_p is not supported"}) == (
        "refused",
        "HTTP 400: min_p is not supported",
    )
    crashed = {"error": url + "unreachable after 7 attempts", "server_error": "RuntimeError: index -288 out of bounds"}
    assert _failure(crashed) == ("crashed", "the server died: RuntimeError: index -288 out of bounds")
    assert _failure({"error": url + "HTTP 500: Internal", "server_error": "grammar rejected [0]"}) == (
        "server error", "HTTP 500: Internal; it logged: grammar rejected [0]")  # fmt: skip
    assert _failure({"error": "ServerError: exited with code 1"}) == ("not run", "ServerError: exited with code 1")
    assert _failure({"error": None, "not_audited": "no dialect"}) == ("not audited", "no dialect")
    command = ("specverify audit --endpoint http://127.0.0.1:8000 --model m --samples-per-request 50 --top-k 12 "
               "--json-schema '{\"type\": \"object\"}' --skip-determinism --tier smoke --seed 0 --out x --no-plots")  # fmt: skip
    assert _asked(command) == '--top-k 12 --json-schema \'{"type": "object"}\''


def test_the_engine_matrix_opens_the_reports_readme_and_is_current(tmp_path):
    """``reports/README.md`` opens with the matrix of every engine report, as the reports say now."""
    import shutil

    from tools.reports.matrix import END, START, matrix_rows, render_matrix, update_readme

    text = (ROOT / "reports" / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# Reports\n\n" + START)
    rows = matrix_rows(ROOT / "reports")
    assert text[text.index(START) : text.index(END) + len(END)] == render_matrix(rows)
    assert {r["engine"] for r in rows} >= {"vLLM", "transformers", "llama-cpp-python", "OpenVINO GenAI"}
    reports = [r for r in rows if r["verdict"] not in ("refused", "crashed", "server error", "not run", "not audited")]
    bench = sum(1 for _ in (ROOT / "reports" / "bench").rglob("report.json"))  # the bench table cites these
    assert len(reports) == sum(1 for _ in (ROOT / "reports").rglob("report.json")) - bench - sum(
        1 for p in (ROOT / "reports").glob("*/report.json")
    )  # every engine report; the example reports (one level down) and the bench's have their own index
    refusals = [p for p in (ROOT / "reports").rglob("run.json")
                if (json.loads(p.read_text()).get("error") or json.loads(p.read_text()).get("not_audited"))
                and not (p.parent / "report.json").exists()]  # fmt: skip
    assert len(rows) - len(reports) == len(refusals)  # and every recorded refusal, failed start and unaudited run
    # a verdict that changes changes the matrix
    copy = tmp_path / "reports"
    shutil.copytree(ROOT / "reports" / "mistralrs", copy / "mistralrs")
    shutil.copy(ROOT / "reports" / "README.md", copy / "README.md")
    first = sorted((copy / "mistralrs").rglob("report.json"))[0]
    data = json.loads(first.read_text())
    data["verdict"] = "fail" if data["verdict"] != "fail" else "pass"
    first.write_text(json.dumps(data))
    update_readme(copy)
    changed = (copy / "README.md").read_text(encoding="utf-8")
    assert f"**{data['verdict']}**" in changed.split(first.parent.name, 1)[1].split("\n", 1)[0]
    assert changed.count("| mistral.rs |") == 5 and "| vLLM |" not in changed

"""The thousand-run calibration report's bookkeeping (``tools.reports.calibration``): resuming, regrading, tails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

calibration = pytest.importorskip("tools.reports.calibration")


def _raw(seed: int, pvalues, families=None) -> dict:
    families = families or ["gof"] * len(pvalues)
    labels = [f"{'gof' if f == 'gof' else 'pairs_lag128'}|scen|abs=1" for f in families]
    return {"seed": seed, "grades": {"pass": len(pvalues)}, "flagged": [], "seconds": 1.0, "families": families,
            "labels": labels, "pvalues": list(pvalues), "errors": []}  # fmt: skip


def test_tails_keep_the_small_pvalues_and_count_every_test_kind():
    record = _raw(0, [0.5, 0.004, 0.0004, 2e-5], ["gof", "gof", "dependence", "dependence"])
    t = calibration.tails(record)
    assert t["counts"] == {"gof/gof": 2, "dependence/pairs_lag128": 2}
    assert [p for _, _, p in t["small"]] == [0.004, 0.0004, 2e-5]
    graded = {"seed": 0, "tails": t}  # a committed record returns what it kept; an old one None
    assert calibration.tails(graded) == t and calibration.tails({"seed": 1}) is None


def test_tail_table_counts_levels_and_screens_an_excess():
    records = [_raw(s, [0.5] * 999 + [0.0005]) for s in range(3)]  # 3 of 3000 at <= 1e-3: 3 expected
    row = calibration.tail_table(records)["kinds"]["gof/gof"]
    assert (row["tests"], row["0.01"], row["0.001"], row["0.0001"]) == (3000, 3, 3, 0)
    assert 0.3 < row["excess_p"] < 0.7  # P(Poisson(3) >= 3)
    heavy = [_raw(s, [0.5] * 99 + [5e-5]) for s in range(10)]  # 10 of 1000 at <= 1e-3: 1 expected
    assert calibration.tail_table(heavy)["kinds"]["gof/gof"]["excess_p"] < 1e-6


def test_records_resume_from_the_committed_graded_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "calibration").mkdir(parents=True)
    committed = {"seed": 0, "grades": {"pass": 2}, "flagged": [], "seconds": 1.0, "verdict": "pass",
                 "min_law_adjusted": 1.0, "conformance": None, "law_families": []}  # fmt: skip
    (tmp_path / "reports" / "calibration" / "chain.jsonl").write_text(json.dumps(committed) + "\n")
    (tmp_path / "build" / "calibration").mkdir(parents=True)
    (tmp_path / "build" / "calibration" / "chain.jsonl").write_text(json.dumps(_raw(1, [0.5, 0.5])) + "\n")
    assert calibration._done("chain") == {0, 1}
    records = calibration.load("chain")
    assert [r["seed"] for r in records] == [0, 1]
    assert calibration.regrade(records[0])["verdict"] == "pass"  # as it was graded
    summary = calibration.summarise(records)
    assert summary["runs"] == 2 and summary["tests_per_run"] == 2 and summary["tails"]["runs"] == 1


def test_seed_ranges_compress_consecutive_seeds():
    assert calibration.seed_ranges([0, 1, 2, 5, 7, 8]) == [[0, 2], [5, 5], [7, 8]]
    assert calibration.seed_ranges([]) == []


def test_a_frozen_series_is_not_extended_by_another_implementation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    revision, _ = calibration.FROZEN["decoder"]
    with pytest.raises(SystemExit, match=revision):
        calibration.run(["chain", "decoder"], range(0, 1), workers=1)
    assert not (tmp_path / "build").exists()  # refused before anything ran or was written
    calibration.refuse_frozen(["chain", "tree"])  # the other series go on


def test_a_screened_kind_links_its_follow_up_page_while_it_is_flagged():
    summary = json.loads(Path("reports/calibration/summary.json").read_text())["batteries"]
    (line,) = calibration.follow_up_lines(summary)  # the committed screen flags the tree's lag-128 test
    assert "[lag128.md](lag128.md)" in line and "pairs_lag128" in line
    assert Path("reports/calibration/lag128.md").exists()
    summary["tree"]["tails"]["kinds"]["dependence/pairs_lag128"]["excess_p"] = 0.5
    assert calibration.follow_up_lines(summary) == []

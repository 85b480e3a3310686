"""Tests of specverify.report: files, atomicity, JSON round trip, Markdown/HTML content, no-matplotlib mode.

Reports here are synthetic (built by hand, no sampling); the only randomness is a
fixed-seed numpy generator that makes plausible p-values and counts.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from specverify.errors import InvalidArgument
from specverify.report import load_report, render_html, render_markdown, write_report
from specverify.report import io as report_io
from specverify.results import Report, TestResult

EVIL = '<script>alert("x")</script>'


def _gof(scenario, position, pvalue, grade, *, n=4000, details=True, seed=0, alpha=1e-4):
    rng = np.random.default_rng(seed)
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    expected = n * probs
    observed = rng.multinomial(n, probs).astype(float)
    if grade == "fail":
        observed[0] += 300
        observed[1] -= 300
    extra = {"observed": observed.tolist(), "expected": expected.tolist(),
             "bin_tokens": [[0], [3], [1], [5], [2], [4, 6, 7]]} if details else {}
    return TestResult(
        statistic=float(rng.chisquare(5)), pvalue=pvalue, name="gof", family="gof",
        method="Cressie-Read lambda=2/3 vs chi2(5)", n=n, df=5.0, bins=6, multi_token_mass=0.04,
        mde_tv=float(np.sqrt(30.0 / (4 * n))), alpha=alpha, adjusted_pvalue=min(1.0, pvalue * 20),
        grade=grade, scenario=scenario, position=position, details=extra,
    )


def _passing_results(count=12, seed=1):
    rng = np.random.default_rng(seed)
    return [
        _gof(f"cat_v{8 * (1 + i % 3)}", f"abs={i % 5 + 1}", float(p), "pass", n=2000 * (1 + i % 4), seed=i)
        for i, p in enumerate(rng.uniform(0.01, 1.0, size=count))
    ]


def _scenarios():
    return (
        {"name": "cat_v8", "vocab_size": 8, "k": 2, "n": 4000, "seed": 11,
         "target_probs_preview": [0.4, 0.15, 0.06, 0.25, 0.04, 0.1, 0.0, 0.0],
         "draft_probs_preview": [[0.1] * 8, [0.2, 0.2, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05]]},
        {"name": "cat_v16", "vocab_size": 16, "k": 4, "n": 8000, "seed": 12},
        {"name": "cat_v24", "vocab_size": 24, "k": 4, "n": 8000, "sampling_seed": 13},
    )


def _acceptance():
    return {
        "cat_v8": [{"position": i + 1, "observed_rate": 0.61 - 0.02 * i, "expected_rate": 0.6 - 0.02 * i,
                    "n": 4000 - 1000 * i} for i in range(2)],
        "cat_v16": {"positions": [{"position": 1, "observed_rate": 0.7, "expected_rate": 0.7, "n": 8000}],
                    "length_counts": [2400, 1800, 1300, 900, 1600],
                    "length_probs": [0.3, 0.22, 0.16, 0.12, 0.2]},
    }


def make_report(verdict="pass", *, errors=(), details=True, implementation="mypkg.mod:verify", results=None,
                command=""):
    results = list(results if results is not None else _passing_results())
    if verdict == "suspicious":
        results.append(_gof("cat_v16", "abs=2", 2e-5, "suspicious", details=details, seed=99))
    if verdict == "fail":
        results.append(_gof("cat_v24", "abs=1", 1e-30, "fail", n=8000, details=details, seed=98))
        results.append(_gof("cat_v8", "abs=3", 1e-12, "fail", n=3000, details=details, seed=97))
        results.append(TestResult(0.0, 0.0, "support", "support", "zero-probability tokens emitted", 3000,
                                  alpha=1e-4, adjusted_pvalue=0.0, grade="fail", scenario="cat_v8",
                                  position="abs=2", details={"tokens": [6, 7]}))
    return Report(
        kind="verifier", implementation=implementation, tier="smoke", seed=1234, alpha=1e-3, verdict=verdict,
        results=tuple(results), errors=tuple(errors), scenarios=_scenarios(),
        timings={"cat_v8": 1.25, "total": 7.5}, environment={"specverify": "0.1.0", "python": "3.11"},
        extra={"acceptance": _acceptance(), "efficiency": {"tokens_per_pass": 2.4}}, command=command,
    )


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


# ----------------------------------------------------------------------------- files and atomicity


def test_write_report_writes_three_files_and_no_temp_files(tmp_path):
    report = make_report("fail", errors=("verify raised RuntimeError: boom",))
    paths = write_report(report, tmp_path / "out", plots=False)
    assert set(paths) == {"json", "markdown", "html"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.json", "report.md"]
    assert paths["json"].read_text() == report.to_json() + "\n"
    assert paths["markdown"].read_text() == render_markdown(report)
    assert paths["html"].read_text() == render_html(report, plots=False)


def test_json_round_trip_through_load_report(tmp_path):
    report = make_report("fail", errors=("bad shape",))
    write_report(report, tmp_path, plots=False)
    loaded = load_report(tmp_path)
    assert loaded == load_report(tmp_path / "report.json")
    assert loaded.to_json() == report.to_json()
    assert render_markdown(loaded) == render_markdown(report)


def test_load_report_rejects_non_reports(tmp_path):
    (tmp_path / "report.json").write_text("not json")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        load_report(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps({"schema": "other/9"}))
    with pytest.raises(InvalidArgument, match="schema"):
        load_report(tmp_path)
    with pytest.raises(InvalidArgument, match="is not a report.json"):
        load_report(tmp_path / "missing.json")


def test_write_report_validates_arguments(tmp_path):
    with pytest.raises(InvalidArgument, match="report"):
        write_report({"verdict": "pass"}, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgument, match="out_dir"):
        write_report(make_report(), tmp_path / "file")


@pytest.mark.parametrize("failing", ["os.replace", "os.fsync", "render"])
def test_failed_write_leaves_previous_files_intact(tmp_path, monkeypatch, failing):
    old = make_report("pass")
    write_report(old, tmp_path, plots=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if failing == "render":
        monkeypatch.setattr(report_io, "render_html", boom)
    else:
        monkeypatch.setattr(report_io.os, failing.split(".")[1], boom)
    with pytest.raises(OSError, match="disk full"):
        write_report(make_report("fail", errors=("x",)), tmp_path, plots=False)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files, old contents


def test_output_is_deterministic(tmp_path):
    report = make_report("fail")
    a = write_report(report, tmp_path / "a")
    b = write_report(report, tmp_path / "b")
    for key in a:
        assert a[key].read_bytes() == b[key].read_bytes(), key


# ----------------------------------------------------------------------------- Markdown content


def test_markdown_pass_states_verdict_and_detectable_tv():
    report = make_report("pass")
    md = render_markdown(report)
    tvs = sorted(r.mde_tv for r in report.results)
    assert "PASS: no test detected a deviation" in md
    assert f"{tvs[-1]:.3g}" in md  # the largest detectable TV is quoted
    assert f"{float(np.median(tvs)):.3g}" in md
    assert "specverify audit --verifier mypkg.mod:verify --tier smoke --seed 1234" in md
    assert "Minimal counterexample" not in md
    assert md.count("| pass |") == len(report.results)


def test_markdown_lists_seeds_and_uses_report_command():
    md = render_markdown(make_report("pass", command="python -m specverify audit --verifier x:y --seed 1234"))
    assert "python -m specverify audit --verifier x:y --seed 1234" in md
    assert "specverify audit --verifier mypkg" not in md
    for seed_line in ("| root (--seed) | `1234` |", "| cat_v8: seed | `11` |", "| cat_v24: sampling_seed | `13` |"):
        assert seed_line in md


def test_markdown_suspicious_warns_without_failing():
    md = render_markdown(make_report("suspicious"))
    assert "SUSPICIOUS: no test crossed its allocated alpha, so the gate passes" in md
    assert "cat_v16/abs=2" in md
    assert md.index("**suspicious**") < md.index("| pass |")  # worst first


def test_markdown_fail_leads_with_errors_and_minimal_counterexample():
    report = make_report("fail", errors=("verify returned token 9 >= vocab_size 8 (row 3)",))
    md = render_markdown(report)
    verdict = md.index("FAIL: the implementation does not emit")
    errors = md.index("## Implementation errors (1)")
    counter = md.index("## Minimal counterexample")
    table = md.index("## Tests, worst first")
    assert verdict < errors < counter < md.index("## Reproduce") < table
    assert "verify returned token 9 >= vocab_size 8 (row 3)" in md
    section = md[counter:table]
    # smallest scenario (V*K = 16) wins over the more significant failure in cat_v24 (V*K = 96)
    assert "scenario `cat_v8`, position `abs=3`" in section
    assert "Target law p: \\[0.4, 0.15, 0.06, 0.25, 0.04, 0.1, 0, 0\\] (V=8)" in section
    assert "row 1: \\[0.2, 0.2, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05\\] (V=8)" in section
    first_row = section[section.index("| bin (tokens)"):].splitlines()[2]
    assert first_row.startswith("| 3 |")  # the planted -300 on token 3 (expected 750) is the largest residual
    failing_rows = [line for line in md[table:].splitlines() if "**FAIL**" in line]
    assert len(failing_rows) == 3 and md[table:].index("**FAIL**") < md[table:].index("| pass |")


def test_markdown_counterexample_without_details():
    md = render_markdown(make_report("fail", details=False))
    section = md[md.index("## Minimal counterexample"):md.index("## Reproduce")]
    assert "recorded no per-bin counts" in section
    assert "`support/support` at scenario `cat_v8`" in section  # same scenario size and N: smallest p wins
    assert "Emitted tokens with target probability 0: `[6, 7]`" in section


def test_markdown_caps_large_tables():
    results = _passing_results(count=130, seed=5)
    md = render_markdown(make_report("pass", results=results), max_rows=40)
    assert md.count("| pass |") == 40
    assert "... and 90 more tests (90 pass); all are in report.json and report.html." in md


def test_markdown_escapes_and_handles_empty_report():
    report = Report("verifier", EVIL + "|x", "smoke", 0, 1e-3, "fail", errors=("raised `<b>` | oops",))
    md = render_markdown(report)
    outside_code = re.sub(r"```.*?```", "", md, flags=re.S)
    outside_code = re.sub(r"`[^`]*`", "", outside_code)
    assert "<" not in outside_code.replace("\\<", "")  # raw HTML only inside code spans/blocks
    assert "raised `<b>` | oops" in md  # errors verbatim in a fenced block
    assert "No statistical tests ran." in md
    assert "1 implementation error(s)" in md and "The gate fails." in md
    assert "specverify audit --verifier '<script>" in md  # shell-quoted in the repro command


def test_rendering_tolerates_nonfinite_and_malformed_fields():
    r = _gof("s", "p", float("nan"), "pass").replace(adjusted_pvalue="nan", mde_tv="inf",
                                                     details={"observed": [1, 2], "expected": [1]})
    report = Report("verifier", "x", "smoke", 0, 1e-3, "pass", results=(r, _gof("s", "q", 0.5, "pass")),
                    scenarios=("not a dict",), extra={"acceptance": {"s": "garbage"}})
    assert "nan" in render_markdown(report)
    assert "<!DOCTYPE html>" in render_html(report, plots=True)


# ----------------------------------------------------------------------------- HTML


@pytest.fixture(scope="module")
def fail_html():
    report = make_report("fail", errors=("verify raised RuntimeError: boom",), implementation=EVIL)
    return report, render_html(report, plots=True)


def test_html_is_self_contained_with_inline_plots(fail_html):
    _, page = fail_html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower()
    assert page.count('<img src="data:image/png;base64,') >= 4  # histograms, QQ, acceptance, detectable TV
    assert "<style>" in page and "<link" not in page


def test_html_escapes_malicious_names(fail_html):
    _, page = fail_html
    assert EVIL not in page
    assert html_escaped(EVIL) in page


def html_escaped(text):
    import html

    return html.escape(text, quote=True)


def test_html_content_order_and_all_rows(fail_html):
    report, page = fail_html
    order = [page.index(h) for h in ("Implementation errors (1)", "Minimal counterexample", "Tests, worst first")]
    assert order == sorted(order)
    assert page.count("<tr class=\"g-fail\">") == 3
    assert page.count("<td>gof</td>") + page.count("<td>support</td>") >= len(report.results)


def test_html_puts_extra_rows_in_details():
    page = render_html(make_report("pass", results=_passing_results(count=70, seed=3)), plots=False)
    assert "<details><summary>20 more tests</summary>" in page
    assert "Plots were not requested" in page


def test_html_handles_many_bins_and_many_tests():
    rng = np.random.default_rng(7)
    expected = rng.dirichlet(np.ones(3000)) * 1e6
    observed = rng.poisson(expected).astype(float)
    big = _gof("big_v3000", "abs=1", 1e-9, "fail", n=10**6).replace(
        details={"observed": observed.tolist(), "expected": expected.tolist()})
    results = _passing_results(count=400, seed=8) + [big]
    page = render_html(make_report("fail", results=results), plots=True)
    assert 'alt="Counts: gof at big_v3000/abs=1"' in page  # its histogram was drawn (line mode)
    assert page.count('<img src="data:image/png;base64,') >= 4


def test_works_without_matplotlib(tmp_path, no_matplotlib):
    import specverify.report.plots as plots_module

    assert plots_module.render_plots(make_report("pass")).unavailable
    paths = write_report(make_report("fail", errors=("e",)), tmp_path)
    page = paths["html"].read_text()
    assert "Plots are unavailable: matplotlib is not installed" in page
    assert "data:image/png" not in page
    assert "Minimal counterexample" in paths["markdown"].read_text()


def test_importing_specverify_report_does_not_import_matplotlib():
    import subprocess

    code = "import sys, specverify.report; print('matplotlib' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_noncentrality_matches_scipy_power():
    from scipy import stats

    from specverify.report.plots import noncentrality_for_power

    lam = noncentrality_for_power(5.0, 1e-3)
    assert stats.ncx2.sf(stats.chi2.isf(1e-3, 5.0), 5.0, lam) == pytest.approx(0.9, abs=1e-8)
    assert noncentrality_for_power(5.0, 1e-6) > lam

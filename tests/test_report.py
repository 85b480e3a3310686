"""Tests of specverify.report: files, atomicity, JSON round trip, Markdown/HTML content, no-matplotlib mode.

Reports here are synthetic (built by hand, no sampling); the only randomness is a
fixed-seed numpy generator that makes plausible p-values and counts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import numpy as np
import pytest

from specverify.core.errors import InvalidArgument
from specverify.core.results import Report, TestResult
from specverify.report import io as report_io
from specverify.report import load_report, render_html, render_markdown, write_report

EVIL = '<script>alert("x")</script>'


def _gof(scenario, position, pvalue, grade, *, n=4000, details=True, seed=0, alpha=1e-4):
    rng = np.random.default_rng(seed)
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    expected = n * probs
    observed = rng.multinomial(n, probs).astype(float)
    if grade == "fail":
        observed[0] += 300
        observed[1] -= 300
    extra = (
        {
            "observed": observed.tolist(),
            "expected": expected.tolist(),
            "bin_tokens": [[0], [3], [1], [5], [2], [4, 6, 7]],
        }
        if details
        else {}
    )
    return TestResult(
        statistic=float(rng.chisquare(5)),
        pvalue=pvalue,
        name="gof",
        family="gof",
        method="Cressie-Read lambda=2/3 vs chi2(5)",
        n=n,
        df=5.0,
        bins=6,
        multi_token_mass=0.04,
        mde_tv=float(np.sqrt(30.0 / (4 * n))),
        alpha=alpha,
        adjusted_pvalue=min(1.0, pvalue * 20),
        grade=grade,
        scenario=scenario,
        position=position,
        details=extra,
    )


def _passing_results(count=12, seed=1):
    rng = np.random.default_rng(seed)
    return [
        _gof(f"cat_v{8 * (1 + i % 3)}", f"abs={i % 5 + 1}", float(p), "pass", n=2000 * (1 + i % 4), seed=i)
        for i, p in enumerate(rng.uniform(0.01, 1.0, size=count))
    ]


def _scenarios():
    return (
        {
            "name": "cat_v8",
            "vocab_size": 8,
            "k": 2,
            "n": 4000,
            "seed": 11,
            "target_probs_preview": [0.4, 0.15, 0.06, 0.25, 0.04, 0.1, 0.0, 0.0],
            "draft_probs_preview": [[0.1] * 8, [0.2, 0.2, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05]],
        },
        {"name": "cat_v16", "vocab_size": 16, "k": 4, "n": 8000, "seed": 12},
        {"name": "cat_v24", "vocab_size": 24, "k": 4, "n": 8000, "sampling_seed": 13},
    )


def _acceptance():
    return {
        "cat_v8": [
            {"position": i + 1, "observed_rate": 0.61 - 0.02 * i, "expected_rate": 0.6 - 0.02 * i, "n": 4000 - 1000 * i}
            for i in range(2)
        ],
        "cat_v16": {
            "positions": [{"position": 1, "observed_rate": 0.7, "expected_rate": 0.7, "n": 8000}],
            "length_counts": [2400, 1800, 1300, 900, 1600],
            "length_probs": [0.3, 0.22, 0.16, 0.12, 0.2],
        },
    }


def make_report(
    verdict="pass", *, errors=(), details=True, implementation="mypkg.mod:verify", results=None, command=""
):
    results = list(results if results is not None else _passing_results())
    if verdict == "suspicious":
        results.append(_gof("cat_v16", "abs=2", 2e-5, "suspicious", details=details, seed=99))
    if verdict == "fail":
        results.append(_gof("cat_v24", "abs=1", 1e-30, "fail", n=8000, details=details, seed=98))
        results.append(_gof("cat_v8", "abs=3", 1e-12, "fail", n=3000, details=details, seed=97))
        results.append(
            TestResult(
                0.0,
                0.0,
                "support",
                "support",
                "zero-probability tokens emitted",
                3000,
                alpha=1e-4,
                adjusted_pvalue=0.0,
                grade="fail",
                scenario="cat_v8",
                position="abs=2",
                details={"tokens": [6, 7]},
            )
        )
    return Report(
        kind="verifier",
        implementation=implementation,
        tier="smoke",
        seed=1234,
        alpha=1e-3,
        verdict=verdict,
        results=tuple(results),
        errors=tuple(errors),
        scenarios=_scenarios(),
        timings={"cat_v8": 1.25, "total": 7.5},
        environment={"specverify": "0.1.0", "python": "3.11"},
        extra={"acceptance": _acceptance(), "efficiency": {"tokens_per_pass": 2.4}},
        command=command,
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
        from specverify.core import files

        monkeypatch.setattr(files.os, failing.split(".")[1], boom)  # the atomic write's own os calls
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
    # a report built without a command says so in a Python comment (never a made-up command line)
    assert "# Python: how this verifier run was started was not recorded" in md
    assert "mypkg.mod:verify at tier='smoke', seed=1234" in md and "specverify audit" not in md
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
    table = md.index("## Tests, flagged and worst first")
    assert verdict < errors < counter < md.index("## Reproduce") < table
    assert "verify returned token 9 >= vocab_size 8 (row 3)" in md
    section = md[counter:table]
    # the first failure of the one ordering (rank_key): the support violation, adjusted p = 0
    assert "`support/support` at scenario `cat_v8`, position `abs=2`" in section
    assert "Target law p: \\[0.4, 0.15, 0.06, 0.25, 0.04, 0.1, 0, 0\\] (V=8)" in section
    assert "row 1: \\[0.2, 0.2, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05\\] (V=8)" in section
    assert "Emitted tokens with target probability 0: `[6, 7]`" in section
    failing_rows = [line for line in md[table:].splitlines() if "**FAIL**" in line]
    assert len(failing_rows) == 3 and md[table:].index("**FAIL**") < md[table:].index("| pass |")
    # without it, the lowest adjusted p (cat_v24, 2e-29) wins over the smaller scenario (cat_v8, 2e-11)
    others = tuple(r for r in report.results if r.family != "support")
    section = render_markdown(dataclasses.replace(report, results=others))
    section = section[section.index("## Minimal counterexample") : section.index("## Reproduce")]
    assert "`gof/gof` at scenario `cat_v24`, position `abs=1`" in section
    first_row = section[section.index("| bin (tokens)") :].splitlines()[2]
    assert first_row.startswith("| 3 |")  # the planted -300 on token 3 (expected 2000) is the largest residual


def test_markdown_counterexample_without_details():
    md = render_markdown(make_report("fail", details=False))
    section = md[md.index("## Minimal counterexample") : md.index("## Reproduce")]
    assert "recorded no per-bin counts" in section
    assert "`support/support` at scenario `cat_v8`" in section  # same scenario size and N: smallest p wins
    assert "Emitted tokens with target probability 0: `[6, 7]`" in section


def test_markdown_caps_large_tables():
    results = _passing_results(count=130, seed=5)
    md = render_markdown(make_report("pass", results=results), max_rows=40)
    # the 10 worst listed, the next 40 folded in <details>, the rest counted
    assert md.count("| pass |") == 50
    assert "<details><summary>120 more tests (120 passed)</summary>" in md
    assert md.index("| 10 | pass |") < md.index("<details>") < md.index("| 11 | pass |")
    assert "... and 80 more tests (80 passed); all are in report.json and report.html." in md


def test_markdown_escapes_and_handles_empty_report():
    report = Report("verifier", EVIL + "|x", "smoke", 0, 1e-3, "fail", errors=("raised `<b>` | oops",))
    md = render_markdown(report)
    outside_code = re.sub(r"```.*?```", "", md, flags=re.S)
    outside_code = re.sub(r"`[^`]*`", "", outside_code)
    assert "<" not in outside_code.replace("\\<", "")  # raw HTML only inside code spans/blocks
    assert "raised `<b>` | oops" in md  # errors verbatim in a fenced block
    assert "No statistical tests ran." in md
    assert "1 implementation error(s)" in md and "The gate fails." in md
    assert "# Python: how this verifier run was started was not recorded" in md  # no made-up command line


def test_rendering_tolerates_nonfinite_and_malformed_fields():
    r = _gof("s", "p", float("nan"), "pass").replace(
        adjusted_pvalue="nan", mde_tv="inf", details={"observed": [1, 2], "expected": [1]}
    )
    report = Report(
        "verifier",
        "x",
        "smoke",
        0,
        1e-3,
        "pass",
        results=(r, _gof("s", "q", 0.5, "pass")),
        scenarios=("not a dict",),
        extra={"acceptance": {"s": "garbage"}},
    )
    assert "nan" in render_markdown(report)
    assert "<!DOCTYPE html>" in render_html(report, plots=True)


# ----------------------------------------------------------------------------- HTML


@pytest.fixture(scope="module")
def fail_html():
    report = make_report("fail", errors=("verify raised RuntimeError: boom",), implementation=EVIL)
    return report, render_html(report, plots=True)


def test_html_is_self_contained_with_inline_plots(fail_html):
    pytest.importorskip("matplotlib")  # the plots extra
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
    order = [
        page.index(h) for h in ("Implementation errors (1)", "Minimal counterexample", "<h2>Plots", "Tests, flagged")
    ]
    assert order == sorted(order)
    assert page.count('<tr class="g-fail">') == 3
    assert page.count("<td>gof</td>") + page.count("<td>support</td>") >= len(report.results)


def test_html_puts_extra_rows_in_details():
    page = render_html(make_report("pass", results=_passing_results(count=70, seed=3)), plots=False)
    assert "<details><summary>60 more tests (60 passed)</summary>" in page
    assert page.index('<td class="num">10</td>') < page.index("<details>") < page.index('<td class="num">11</td>')
    assert "Plots were not requested" in page


def test_html_handles_many_bins_and_many_tests():
    pytest.importorskip("matplotlib")  # the plots extra
    rng = np.random.default_rng(7)
    expected = rng.dirichlet(np.ones(3000)) * 1e6
    observed = rng.poisson(expected).astype(float)
    big = _gof("big_v3000", "abs=1", 1e-9, "fail", n=10**6).replace(
        details={"observed": observed.tolist(), "expected": expected.tolist()}
    )
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


# ----------------------------------------------------------------------------- drafter-audit sections


def _efficiency_extra(draft_costs=(0.05,), latency=True):
    """``extra["efficiency"]`` shaped as :func:`specverify.drafter.acceptance.efficiency_section` writes it."""
    rates = [0.9085, 0.9081, 0.9092, 0.9074]
    drafted = [17453, 15856, 14399, 13092]
    positions = [
        {
            "position": i + 1,
            "drafted": drafted[i],
            "accepted": round(drafted[i] * rates[i]),
            "observed_rate": rates[i],
            "ci_low": rates[i] - 0.0044,
            "ci_high": rates[i] + 0.0043,
            "expected_rate": 0.9112 if i == 0 else 0.9077,
        }
        for i in range(4)
    ]
    curve = [
        1.8176,
        2.4850,
        3.0293,
        3.4703,
        3.8256,
        4.1096,
        4.3341,
        4.5090,
        4.6423,
        4.7409,
        4.8105,
        4.8557,
        4.8807,
        4.8887,
        4.8826,
        4.8649,
    ]
    speedup = []
    for cost in draft_costs:
        block = {
            "draft_cost": cost,
            "best_k": 14,
            "best_speedup": 4.8887,
            "speedup_at_audited_k": 3.4703,
            "speedups": curve,
        }
        if latency:
            block.update(seconds_per_token_at_best_k=0.000977, seconds_per_token_at_audited_k=0.0013763)
        speedup.append(block)
    section = {
        "k": 4,
        "ci_level": 0.95,
        "rounds": 17453,
        "tokens_generated": 72680,
        "tokens_kept": 64000,
        "positions": positions,
        "mean_accepted": 3.164327,
        "mean_accepted_ci": [3.143952, 3.184702],
        "expected_mean_accepted": 3.165786,
        "tokens_per_target_pass": 4.164327,
        "expected_tokens_per_target_pass": 4.165786,
        "target_passes_per_token": 1 / 4.164327,
        "target_passes_per_kept_token": 0.272703,
        "length_counts": [1597, 1457, 1307, 1212, 11880],
        "length_probs": [0.0891, 0.0833, 0.0766, 0.0695, 0.6815],
        "model_note": "speedup = E[tokens] / (c K + 1)",
        "speedup": speedup,
    }
    if latency:
        section["latency"] = {
            "model_params": 8e9,
            "bytes_per_param": 2.0,
            "bandwidth_bytes_per_s": 3.35e12,
            "target_pass_seconds": 0.0047761,
            "plain_decoding_seconds_per_token": 0.0047761,
            "note": "memory-bound lower bound: one target pass reads every weight once",
        }
    return section


def make_drafter_report(*, efficiency=None, diagnosis=None, verdict="pass", **extra):
    eff = _efficiency_extra() if efficiency is None else efficiency
    diag = {"culprit": None, "message": "no failure"} if diagnosis is None else diagnosis
    return Report(
        kind="drafter",
        implementation="pkg:my_drafter",
        tier="smoke",
        seed=0,
        alpha=1e-3,
        verdict=verdict,
        results=tuple(_passing_results(count=6)),
        scenarios=_scenarios(),
        timings={"total": 3.0},
        extra={"k": 4, "tier_plan": {"num_prompts": 2}, "efficiency": eff, "diagnosis": diag, **extra},
    )


DRAFTER_CULPRIT = {
    "culprit": "drafter",
    "failed_tests": ["consistency_gof@draft=1", "consistency_pit@draft=2"],
    "message": "the drafter's samples do not follow its reported q (failed: consistency_gof@draft=1, "
    "consistency_pit@draft=2); speculative sampling is lossless only when q is the law the drafts "
    "were drawn from",
}


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_drafter_report_leads_with_diagnosis_after_the_verdict(fmt):
    report = make_drafter_report(diagnosis=DRAFTER_CULPRIT, verdict="fail")
    page = render_markdown(report) if fmt == "markdown" else render_html(report, plots=False)
    verdict, diag = page.index("FAIL: the implementation"), page.index("Diagnosis: the culprit is the drafter.")
    assert verdict < diag < page.index("Reproduce") < page.index("Tests, flagged and worst first")
    assert "The drafter" in page[diag:] and "do not follow its reported q" in page[diag : page.index("Reproduce")]
    assert "Failing tests" not in page  # the message already names both failing tests


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_drafter_report_renders_efficiency_section(fmt):
    report = make_drafter_report(efficiency=_efficiency_extra(draft_costs=(0.01, 0.05)))
    page = render_markdown(report) if fmt == "markdown" else render_html(report, plots=False)
    start, end = page.index("Efficiency"), page.index("Scenarios")
    section = page[start:end]
    assert "Diagnosis: no culprit." in page and "No test failed" in page
    # per-position acceptance with its interval and exact rate
    for text in (
        "17,453",
        "0.9085",
        "[0.9041, 0.9128]" if fmt == "html" else r"\[0.9041, 0.9128\]",
        "0.9112",
        "95% CI",
        "exact inside CI",
    ):
        assert text in section, text
    # accepted length, tokens per pass, passes per token, each with CI and exact value
    for text in (
        "mean accepted length",
        "3.164",
        "3.144",
        "3.185",
        "3.166",
        "tokens per target pass",
        "4.164",
        "4.166",
        "target passes per token",
        "0.2401",
        "target passes per kept token",
    ):
        assert text in section, text
    # the speedup curve for both costs, best K marked, audited K labelled; latency
    assert "c=0.01" in section and "c=0.05" in section and "4 (audited)" in section
    assert section.count("<b>4.89</b>" if fmt == "html" else "**4.89**") == 2
    assert "best K=14 (4.889x, 977 µs per token)" in section
    assert "at the audited K=4: 3.470x, 1.38 ms per token" in section
    assert "plain decoding 4.78 ms" in section and "8B parameters" in section
    # rendered keys are not repeated; other extra keys still are, as rows
    other = page[page.index("Other sections") :].replace("<wbr>", "")
    assert "tier_plan.num_prompts" in other
    assert "efficiency" not in other and "diagnosis" not in other and "mean_accepted" not in other


def test_efficiency_section_without_latency_or_positions():
    eff = _efficiency_extra(latency=False)
    del eff["positions"]
    md = render_markdown(make_drafter_report(efficiency=eff))
    section = md[md.index("## Efficiency") : md.index("## Scenarios")]
    assert "Memory-bound" not in section and "per token)" not in section
    assert "Acceptance per in-block position" not in section
    assert "best K=14 (4.889x)" in section and "mean accepted length" in section


BAD_EFFICIENCY = [
    "garbage",
    3.5,
    [],
    {},
    {"tokens_per_pass": 2.4},
    {"positions": "x", "speedup": "y", "latency": 7},
    {
        "positions": [None, {"observed_rate": "nan"}, {"observed_rate": None}],
        "mean_accepted": "inf",
        "speedup": [{"draft_cost": "x", "speedups": [1.0]}, {"draft_cost": 0.1, "speedups": "no"}],
        "latency": {"target_pass_seconds": -1.0},
    },
]


@pytest.mark.parametrize("bad", BAD_EFFICIENCY, ids=range(len(BAD_EFFICIENCY)))
def test_malformed_efficiency_skips_the_section_and_keeps_the_json(bad):
    report = make_drafter_report(efficiency=bad)
    md, page = render_markdown(report), render_html(report, plots=True)
    assert "## Efficiency" not in md and "<h2>Efficiency</h2>" not in page
    assert "| `efficiency" in md and "<td>efficiency" in page  # shown among the other sections, as rows


def test_partly_malformed_efficiency_renders_what_it_can():
    eff = _efficiency_extra()
    eff["positions"][1] = "junk"
    eff["positions"][2]["ci_low"] = "nan"
    eff["mean_accepted_ci"] = [3.2, 3.1]  # not an interval
    eff["speedup"].append({"draft_cost": 0.5, "best_k": "x", "speedups": [1.2, 1.1]})
    eff["latency"]["model_params"] = "big"
    md = render_markdown(make_drafter_report(efficiency=eff))
    section = md[md.index("## Efficiency") : md.index("## Scenarios")]
    assert "| 1 | 17,453 |" in section and "| 2 | 15,856 |" not in section
    assert "| 3 | 14,399 | 13,092 | 0.9092 | — | 0.9077 | — |" in section
    assert "| mean accepted length (drafts accepted per block) | 3.164 | — | 3.166 |" in section
    assert "| c=0.5 | 1.20 | 1.10 | — |" in section
    assert "Memory-bound latency per token (2 bytes each, 3.35 TB/s)" in section


BAD_DIAGNOSIS = [
    "drafter",
    7,
    [],
    {},
    {"culprit": 3, "message": "x"},
    {"culprit": "drafter", "message": None},
    {"culprit": None, "message": ""},
]


@pytest.mark.parametrize("bad", BAD_DIAGNOSIS, ids=range(len(BAD_DIAGNOSIS)))
def test_malformed_diagnosis_is_skipped(bad):
    report = make_drafter_report(diagnosis=bad)
    md, page = render_markdown(report), render_html(report, plots=False)
    assert "Diagnosis" not in md and "Diagnosis" not in page
    assert "| `diagnosis" in md and "<td>diagnosis" in page


def test_reports_without_drafter_keys_are_unchanged():
    md = render_markdown(make_report("pass"))
    assert "Diagnosis" not in md and "## Efficiency" not in md


def test_diagnosis_lists_failures_its_message_does_not_name():
    tests = [f"gof@pipeline:prompt{i}/node=d1:{j}" for i in range(2) for j in range(10)]
    diag = {
        "culprit": "verifier",
        "message": "the drafter is consistent but the pipeline's output law is not the "
        "target's: the verifier (or its wiring) is lossy",
        "failed_tests": tests,
    }
    md = render_markdown(make_drafter_report(diagnosis=diag, verdict="fail"))
    assert "**Diagnosis: the culprit is the verifier (or its wiring).** The drafter is consistent" in md
    assert "Failing tests (20):" in md and "`gof@pipeline:prompt0/node=d1:0`" in md and "and 8 more." in md
    # a test whose name is only a prefix of one in the message is still listed
    diag = {"culprit": "drafter", "message": "failed: pit@draft=10", "failed_tests": ["pit@draft=1", "pit@draft=10"]}
    assert "Failing tests (2):" in render_markdown(make_drafter_report(diagnosis=diag, verdict="fail"))


def test_drafter_sections_escape_everything():
    eff = _efficiency_extra()
    eff["model_note"] = EVIL
    eff["latency"]["note"] = EVIL + " | `tick`"
    eff["positions"][0]["position"] = EVIL
    diag = {"culprit": EVIL, "message": EVIL + " **bold** [link](x)", "failed_tests": [EVIL, "a|b`c"]}
    report = make_drafter_report(efficiency=eff, diagnosis=diag, verdict="fail")
    page = render_html(report, plots=False)
    assert EVIL not in page and "<script" not in page.lower()
    assert page.count(html_escaped(EVIL)) >= 5
    md = render_markdown(report)
    outside_code = re.sub(r"```.*?```", "", md, flags=re.S)
    outside_code = re.sub(r"`[^`]*`", "", outside_code)
    assert "<" not in outside_code.replace("\\<", "")
    assert "\\*\\*bold\\*\\* \\[link\\](x)" in md


def test_duration_and_count_formatting():
    from specverify.report.drafter import fmt_count, fmt_seconds

    assert [fmt_seconds(x) for x in (2.5, 0.0047761, 0.000977, 3e-9, "nan", None)] == [
        "2.5 s",
        "4.78 ms",
        "977 µs",
        "3 ns",
        "nan",
        "—",
    ]
    assert [fmt_count(x) for x in (8e9, 1.3e8, 7e12, 1234, None)] == ["8B", "130M", "7T", "1,234", "—"]


@pytest.mark.slow
def test_real_drafter_audit_renders_its_sections(tmp_path):
    from specverify.cli.factories import table_target, zoo_drafter
    from specverify.drafter import audit_drafter

    report = audit_drafter(zoo_drafter(name="noisy"), table_target(), draft_cost=0.05, model_params=8e9)
    md = render_markdown(report)
    assert "**Diagnosis: no culprit.**" in md
    section = md[md.index("## Efficiency") : md.index("## Acceptance vs its exact expectation")]
    assert "| 4 (audited) |" in section and "Memory-bound latency per token (8B parameters" in section
    assert "best K=" in section and "95% CI" in section
    assert "<h2>Efficiency</h2>" in render_html(report, plots=False)


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_drafter_report_answers_efficiency_first_and_shows_plots_before_the_table(fmt):
    """Issue 17: the efficiency summary sits right under the verdict, the plots before the test table."""
    if fmt == "html":
        pytest.importorskip("matplotlib")  # the plots extra
    report = make_drafter_report(efficiency=_efficiency_extra(draft_costs=(0.05,)))
    page = render_markdown(report) if fmt == "markdown" else render_html(report, plots=True)
    verdict, diagnosis = page.index("PASS: no test detected"), page.index("Diagnosis: no culprit.")
    efficiency = page.index("Efficiency")
    summary = page[efficiency : page.index("Measured over")]
    for text in (
        "Acceptance per in-block position, observed (exact): 1: 0.908 (0.911), 2: 0.908 (0.908)",
        "Tokens per target pass at K=4: 4.164 (exact 4.166)",
        "best K=14",
        "Memory-bound latency per token: plain decoding 4.78 ms",
    ):
        assert text in summary, text
    plots, tests = page.index("Plots"), page.index("Tests, flagged and worst first")
    assert verdict < diagnosis < efficiency < page.index("Reproduce") < plots < tests
    if fmt == "html":
        assert page.index('<img src="data:image/png;base64,') < tests  # the images themselves, not a pointer


def test_every_flagged_test_is_listed_and_passing_ones_fold():
    results = _passing_results(count=30, seed=4)
    report = make_report("fail", results=results)  # + 3 failing tests
    md, page = render_markdown(report), render_html(report, plots=False)
    listed_md = md[md.index("## Tests") : md.index("<details>")]
    assert listed_md.count("**FAIL**") == 3 and listed_md.count("| pass |") == 10
    listed_html = page[page.index("Tests, flagged") : page.index("<details>")]
    assert listed_html.count('<tr class="g-fail">') == 3
    assert "<details><summary>20 more tests (20 passed)</summary>" in page

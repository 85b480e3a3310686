"""Reports answer the question they were asked: layout and wording of the sweep, audit, drafter and measure output.

Synthetic inputs (built by hand, no sampling) except the one drafter audit run through the
command line, which takes about a second at tier smoke.
"""

from __future__ import annotations

import re

import pytest

from specverify.core.results import Report, TestResult, effect_size, rank_flagged
from specverify.measure.chain import MeasureResult, OverallTV, StratumDivergence
from specverify.measure.sweep import SweepPoint, SweepResult
from specverify.report import content as c
from specverify.report import render_html, render_markdown
from specverify.report.plots import bin_axis_label
from specverify.report.sweep import render_sweep_html, render_sweep_markdown
from specverify.stats.divergence import DivergenceEstimate, clip_to_interval

# ----------------------------------------------------------------------------- builders


def _estimate(raw: float, lower: float, upper: float, *, kl: float = 0.1, n: int = 1000) -> DivergenceEstimate:
    """An estimate whose bias-corrected value is ``raw``, reported clipped to [lower, upper] as divergence() does."""
    tv, clipped = clip_to_interval(raw, lower, upper)
    return DivergenceEstimate(
        tv=tv,
        tv_lower=lower,
        tv_upper=upper,
        tv_plugin=raw + 0.01,
        tv_null_bias=0.01,
        tv_bias_corrected=raw,
        tv_clipped=clipped,
        upper_method="mcdiarmid",
        coarse=None,
        kl=kl,
        kl_plugin=kl + 0.001,
        support_failure=False,
        zero_prob_tokens=(),
        over_emitted=(),
        under_emitted=(),
        n=n,
        vocab_size=8,
        num_contexts=1,
        level=0.95,
    )


def _measure(tv: float, verdict: str | None, *, negative: bool = False) -> MeasureResult:
    blocks = (
        # bias-corrected value below its interval (a lossy law: the correction over-subtracts), reported clipped
        StratumDivergence("block=2", _estimate(tv - 0.002, tv, tv + 0.03), declared_tv=tv),
        StratumDivergence("block=3", _estimate(-0.003 if negative else 0.001, 0.0, 0.012, kl=-0.0002), 0.0),
    )
    positions = tuple(StratumDivergence(f"abs={i}", _estimate(tv, tv - 0.01, tv + 0.02), tv) for i in (0, 1, 2))
    return MeasureResult(
        scenario="pos8_uniform_k2",
        k=2,
        tier="smoke",
        seed=0,
        level=0.95,
        by_block=blocks,
        by_position=positions,
        acceptance_by_block=(0.8, 0.7),
        mean_accepted=1.3,
        tokens_per_pass=2.3,
        num_calls=10,
        row_calls=100,
        num_tokens=230,
        seconds=0.1,
        conformance_verdict=verdict,
        overall=OverallTV(tv, tv - 0.01, tv + 0.02, tv, 3, 0.95, None),
    )


def _sweep(verdicts=("pass", "suspicious", "pass")) -> SweepResult:
    weights = (0.1, 0.5, 0.9)
    points = tuple(
        SweepPoint(w, 3.0 - 2 * w, 3.0 - 2 * w, 2.5 - 1.5 * w, _measure(0.5 * (1 - w), v, negative=w > 0.8))
        for w, v in zip(weights, verdicts)
    )
    return SweepResult(
        knob="weight",
        subject="reference.lossy:ensemble",
        scenario="pos8_uniform_k2",
        k=2,
        tier="smoke",
        seed=0,
        level=0.95,
        draft_cost=0.05,
        points=points,
        command="specverify measure --verifier reference.lossy:ensemble --sweep weight=0.1,0.5,0.9",
    )


def _visible_text(page: str) -> str:
    """The text a reader sees in an HTML page (styles, images and preformatted blocks left out)."""
    page = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    page = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    page = re.sub(r"src=['\"]data:[^'\"]*['\"]", "", page)
    return re.sub(r"<[^>]+>", "", page)


# ----------------------------------------------------------------------------- sweep


def test_sweep_reports_open_with_the_verdict_line():
    result = _sweep()
    line = result.verdict_line()
    assert line.startswith("CONFORMS to the declared law at 3/3 settings; 1 SUSPICIOUS (weight=0.5")
    assert "Best modelled speedup" in line
    md = render_sweep_markdown(result)
    body = [x for x in md.splitlines() if x.strip()]
    assert body[0].startswith("# Trade-off:")
    assert body[1].startswith("**CONFORMS** to the declared law at 3/3 settings; 1 SUSPICIOUS")
    assert body[2].startswith("| weight | conformance | speedup |")  # then the table
    page = render_sweep_html(result, plots=False)
    after_title = page[page.index("</h1>") + len("</h1>") :].lstrip()
    assert after_title.startswith('<div class="verdict v-suspicious"><b>CONFORMS</b> to the declared law at 3/3')
    assert page.index("verdict v-") < page.index("Trade-off table") < page.index("How to read the numbers")
    assert result.summary().splitlines()[0] == line  # the terminal says it first too


def test_sweep_verdict_line_failing_and_without_declared_law():
    failing = _sweep(("pass", "fail", None))
    assert failing.verdict_line().startswith(
        "DOES NOT CONFORM to the declared law at 1/2 settings (weight=0.5); no declared law at weight=0.9."
    )
    assert '<div class="verdict v-fail"><b>DOES NOT CONFORM</b>' in render_sweep_html(failing, plots=False)
    none = _sweep((None, None, None))
    assert none.verdict_line().startswith("NO DECLARED LAW: conformance is not graded at any of the 3 settings")
    assert render_sweep_markdown(none).splitlines()[2].startswith("**NO DECLARED LAW**")


def test_sweep_table_keeps_the_answer_columns_first_and_marks_odd_estimates():
    md = render_sweep_markdown(_sweep())
    header = next(x for x in md.splitlines() if x.startswith("| weight | conformance"))
    assert header == "| weight | conformance | speedup | tokens/pass | mean TV/token | 95% interval | declared TV |"
    assert "| 0.5 | SUSPICIOUS | 1.75x |" in md
    # a negative bias-corrected value is reported clipped to its interval, marked and explained
    assert "| 0.9 | 0.0500^ [0.0500, 0.0800] | 0.0000^ [0.0000, 0.0120] |" in md and "-0.0030" not in md
    assert "^ TV clipped to its interval: the bias-corrected value" in md
    assert "TV per in-block position (position 1 is absolute position 0)" in md
    assert "TV per absolute position (from 0)" in md and "| abs=0 |" in md


def test_sweep_html_has_no_raw_markdown():
    for result in (_sweep(), _sweep(("pass", "fail", None))):
        page = render_sweep_html(result, plots=False)
        text = _visible_text(page)
        assert "`" not in text and "**" not in text, text
        assert "<code>weight</code>" in page and "<code>pos8_uniform_k2</code>" in page


def test_sweep_plot_has_two_different_panels():
    pytest.importorskip("matplotlib")
    import io

    from matplotlib import image

    from specverify.report.sweep import render_sweep_plot

    png = render_sweep_plot(_sweep())
    width = image.imread(io.BytesIO(png)).shape[1]
    assert width == 1100  # two panels (11 in at 100 dpi): speedup trade-off and TV per position


# ----------------------------------------------------------------------------- one ordering of failures


def _gof_fail(scenario, position, adjusted, shift, n=4000):
    expected = [0.5 * n, 0.3 * n, 0.2 * n]
    observed = [expected[0] + shift, expected[1] - shift, expected[2]]
    return TestResult(
        statistic=float(shift),
        pvalue=adjusted / 10,
        name="gof",
        family="gof",
        method="Cressie-Read",
        n=n,
        adjusted_pvalue=adjusted,
        grade="fail",
        scenario=scenario,
        position=position,
        details={"observed": observed, "expected": expected, "bin_tokens": {"0": [2], "1": [0], "2": [1]}},
    )


def _ordering_report() -> Report:
    results = (
        # listed first and from the smallest scenario: the old terminal, banner and counterexample picks
        TestResult(
            9.0,
            0.0,
            "acceptance",
            "acceptance",
            "acceptance count",
            5000,
            adjusted_pvalue=0.0,
            grade="fail",
            scenario="tiny_v2",
            position="block=1",
            details={"observed_rate": 0.55, "expected_rate": 0.5},
        ),
        _gof_fail("big_v64", "abs=1", 0.0, 200),  # adjusted p 0, observed TV 0.05
        _gof_fail("big_v64", "abs=2", 0.0, 800),  # adjusted p 0, observed TV 0.2: the first failure
        _gof_fail("tiny_v2", "abs=1", 1e-20, 1600),  # larger TV, but a larger adjusted p
        TestResult(1.0, 1e-4, "gof", "gof", "m", 100, adjusted_pvalue=2e-3, grade="suspicious", scenario="tiny_v2"),
    )
    scenarios = ({"name": "tiny_v2", "vocab_size": 2, "k": 1}, {"name": "big_v64", "vocab_size": 64, "k": 4})
    return Report("verifier", "mypkg:verify", "smoke", 0, 1e-3, "fail", results=results, scenarios=scenarios)


def test_effect_size_is_the_observed_tv():
    report = _ordering_report()
    acceptance, small, large, tiny, suspicious = report.results
    assert effect_size(acceptance) == pytest.approx(0.05)
    assert effect_size(small) == pytest.approx(0.05) and effect_size(large) == pytest.approx(0.2)
    assert effect_size(suspicious) is None
    ranked = rank_flagged(report.results)
    assert ranked[:3] == [large, acceptance, small]  # adjusted p 0, then observed TV (ties: raw p, names)
    assert ranked[3:] == [tiny, suspicious]


def test_terminal_banner_and_counterexample_name_the_same_first_failure():
    report = _ordering_report()
    first = rank_flagged(report.results)[0]
    assert (first.scenario, first.position) == ("big_v64", "abs=2")
    # terminal: the first flagged line
    flagged = [x for x in report.summary().splitlines() if x.strip().startswith("[FAIL]")]
    assert flagged[0].strip().startswith("[FAIL] gof/gof big_v64/abs=2:") and "observed TV 0.2" in flagged[0]
    # HTML banner (verdict paragraph): the first test it lists
    page = render_html(report, plots=False)
    banner = re.search(r'<div class="verdict v-fail">(.*?)</div>', page, re.S).group(1)
    assert banner.split(": ", 2)[2].startswith("gof at big_v64/abs=2 (p=0, adjusted p=0, observed TV 0.2)")
    # the counterexample, in both formats
    assert c.counterexample(report).result is first
    section = page[page.index("<h2>Minimal counterexample") : page.index("<h2>Reproduce")]
    assert "<code>gof/gof</code> at scenario <code>big_v64</code>, position <code>abs=2</code>" in section
    md = render_markdown(report)
    section = md[md.index("## Minimal counterexample") : md.index("## Reproduce")]
    assert "`gof/gof` at scenario `big_v64`, position `abs=2`" in section
    assert "rejected it at family-wise alpha 0.001: gof at big_v64/abs=2 (p=0, adjusted p=0, observed TV 0.2)" in md
    # and the test table's first row
    first_row = next(x for x in md.splitlines() if x.startswith("| 1 | **FAIL**"))
    assert "`big_v64` | `abs=2`" in first_row


# ----------------------------------------------------------------------------- failing report layout


def test_scenarios_section_is_a_table():
    report = _ordering_report()
    md = render_markdown(report)
    section = md[md.index("## Scenarios") :].split("\n## ")[0]
    lines = [x for x in section.splitlines() if x.startswith("|")]
    assert lines[0] == "| name | vocab_size | k |" and len(lines) == 2 + len(report.scenarios)
    assert "| `tiny_v2` | 2 | 1 |" in lines
    assert "=`" not in section  # no key=value dump
    page = render_html(report, plots=False)
    section = page[page.index("<h2>Scenarios") :]
    assert '<table class="scenarios">' in section and "<li>" not in section.split("</table>")[0]


def test_scenarios_table_factors_out_shared_values_and_long_ones():
    scenarios = tuple(
        {"name": f"s{i}", "vocab_size": 8 * (i + 1), "positions": 0, "description": f"scenario {i} " + "x" * 40}
        for i in range(3)
    )
    layout = c.scenario_table(Report("verifier", "x", "smoke", 0, 1e-3, "pass", scenarios=scenarios))
    assert layout.columns == ["name", "vocab_size"] and layout.common == [("positions", "0")]
    assert layout.notes[1][0][0] == "description" and layout.rows[2] == {"name": "s2", "vocab_size": "24"}


def test_test_table_is_contained_in_its_column():
    page = render_html(_ordering_report(), plots=False)
    assert '<div class="wide"><table class="tests">' in page
    css = page[page.index("<style>") : page.index("</style>")]
    assert ".wide{max-width:100%;overflow-x:auto" in css and "table.tests{width:100%}" in css


def test_bins_are_labelled_with_what_they_show():
    report = _ordering_report()
    observed, expected, tokens = c.counts_of(report.results[2])
    assert tokens == [[2], [0], [1]]  # a {bin: tokens} mapping (as specverify.stats.gof records it) is read
    rows = c.counterexample(report).rows
    assert {label for label, *_ in rows} == {"2", "0", "1"}
    assert bin_axis_label(tokens, expected) == "token ids in each bin (most probable first)"
    assert bin_axis_label([None] * 3, expected) == "bin number (bins most probable first; token ids not recorded)"
    assert bin_axis_label([[2], None, [1]], [1.0, 3.0, 2.0]).startswith("token ids in each bin, else bin number")
    assert bin_axis_label([None] * 40, [1.0] * 40) == "bin number (40 bins, most probable first)"
    assert c.bin_label(None, 4, size=37) == "bin 4 (37 tokens)"


# ----------------------------------------------------------------------------- drafter audit terminal summary

_EFFICIENCY = {
    "k": 4,
    "mean_accepted": 3.16,
    "mean_accepted_ci": [3.14, 3.18],
    "expected_mean_accepted": 3.17,
    "tokens_per_target_pass": 4.16,
    "expected_tokens_per_target_pass": 4.17,
    "latency": {"model_params": 8e9, "bytes_per_param": 2.0, "bandwidth_bytes_per_s": 3.35e12,
                "target_pass_seconds": 0.00478},
    "speedup": [{"draft_cost": 0.05, "best_k": 6, "best_speedup": 4.1, "speedup_at_audited_k": 3.47,
                 "speedups": [1.8, 2.5, 3.0, 3.47, 3.8, 4.1, 4.0],
                 "seconds_per_token_at_best_k": 0.00117, "seconds_per_token_at_audited_k": 0.00138}],
}  # fmt: skip


def test_drafter_summary_answers_the_efficiency_question():
    from specverify.report import terminal_summary

    report = Report("drafter", "zoo", "smoke", 0, 1e-3, "pass", extra={"efficiency": _EFFICIENCY})
    text = terminal_summary(report)
    assert (
        "efficiency at K=4: 4.160 tokens per target pass (exact 4.170); speedup 3.470x at drafter cost c=0.05" in text
    )
    assert "best K=6 at drafter cost c=0.05: speedup 4.100x (K > 4 assumes the last observed acceptance rate)" in text
    assert "memory-bound latency per token (8B parameters): plain decoding 4.78 ms" in text
    assert "efficiency" not in terminal_summary(Report("drafter", "zoo", "smoke", 0, 1e-3, "pass"))


def test_cli_drafter_audit_prints_best_k_and_speedup(tmp_path, capsys):
    from specverify.cli.commands import main

    argv = [
        "audit", "--drafter", "specverify.cli.factories:zoo_drafter", "--drafter-option", "name=oracle",
        "--target", "specverify.cli.factories:table_target", "--draft-cost", "0.05", "--model-params", "8e9",
        "--out", str(tmp_path / "out"), "--no-plots",
    ]  # fmt: skip
    main(argv)
    printed = capsys.readouterr().out
    assert re.search(r"efficiency at K=\d+: [\d.]+ tokens per target pass", printed), printed
    assert re.search(r"best K=\d+ at drafter cost c=0.05: speedup [\d.]+x", printed), printed
    assert "memory-bound latency per token (8B parameters)" in printed


# ----------------------------------------------------------------------------- measure terminal output


def test_measure_summary_explains_estimates_outside_their_interval():
    text = _measure(0.2, "pass", negative=True).summary()
    lines = text.splitlines()
    negative = next(x for x in lines if x.strip().startswith("block=3"))
    assert "0.0000^ [0.0000, 0.0120]" in negative and negative.rstrip().endswith("-0.0002*")
    below = next(x for x in lines if x.strip().startswith("block=2"))
    assert "0.2000^ [0.2000, 0.2300]" in below  # the estimate is never printed outside its interval
    assert any(x.startswith("^ TV clipped to its interval: the bias-corrected value") for x in lines)
    assert any(x.startswith("* KL below 0: Miller-Madow corrected") for x in lines)
    plain = _measure(0.2, "pass").summary()
    inside = next(x for x in plain.splitlines() if x.strip().startswith("block=3"))
    assert "0.0010  [0.0000, 0.0120]" in inside  # inside its interval: no mark
    unclipped = _measure(0.2, "pass").summary().replace("^ TV clipped", "")
    assert "^" not in "".join(x for x in unclipped.splitlines() if x.strip().startswith("abs="))

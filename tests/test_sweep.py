"""The trade-off sweep (specverify.measure.sweep), its renderer and ``specverify measure --sweep``.

On the reference ensemble rule (``reference.lossy.ensemble``) the declared law is exact,
``TV = (1 - w) TV(p, q)`` per draft position: the sweep must order the values (TV
decreasing in w, tokens per pass too), and every reported interval at level 0.99 must
contain the exact value with the fixed seeds used here.
"""

from __future__ import annotations

import json

import pytest

from specverify.cli.commands import main
from specverify.core.errors import InvalidArgument
from specverify.measure.costmodel import expected_tokens_per_round
from specverify.measure.sweep import SweepResult, sweep
from specverify.report.sweep import render_sweep_html, render_sweep_markdown, write_sweep
from specverify_reference import lossy

LEVEL = 0.99
WEIGHTS = (0.2, 0.6, 1.0)


@pytest.fixture(scope="module")
def ensemble_sweep() -> SweepResult:
    return sweep(
        lossy.ensemble, WEIGHTS, scenario="pos8_uniform_k4", seed=0, level=LEVEL, knob="weight", batch_size=1024
    )


def test_ensemble_sweep_is_monotone_and_covers_the_exact_values(ensemble_sweep):
    points = ensemble_sweep.points
    assert [p.value for p in points] == list(WEIGHTS)
    overall = [p.measure.overall for p in points]
    tv = [o.tv for o in overall]
    assert tv[0] > tv[1] > tv[2], f"mean TV per token not decreasing in the weight: {tv}"
    tokens = [p.tokens_per_pass for p in points]
    assert tokens[0] > tokens[1] > tokens[2], f"tokens per pass not decreasing in the weight: {tokens}"
    assert overall[2].declared_tv == pytest.approx(0.0, abs=1e-12)
    for p, o in zip(points, overall):
        assert o.tv_lower <= o.declared_tv <= o.tv_upper, f"w={p.value}: overall {o}"
        for s in p.measure.by_block + p.measure.by_position:
            e = s.estimate
            assert e.tv_lower <= s.declared_tv <= e.tv_upper, (
                f"w={p.value} {s.stratum}: exact TV {s.declared_tv:.4f} outside [{e.tv_lower:.4f}, {e.tv_upper:.4f}] "
                f"(n={e.n}, seed 0)"
            )
        assert p.measure.conformance_verdict in ("pass", "suspicious")
        rates = p.measure.acceptance_by_block
        assert p.expected_tokens_per_round == pytest.approx(expected_tokens_per_round(rates, 4))
        assert p.speedup == pytest.approx(p.expected_tokens_per_round / (0.05 * 4 + 1))
        assert p.expected_tokens_per_round == pytest.approx(p.tokens_per_pass, rel=0.03)
    assert ensemble_sweep.verdicts.count("fail") == 0
    data = json.loads(json.dumps(ensemble_sweep.to_dict()))
    assert data["knob"] == "weight" and [p["label"] for p in data["points"]] == ["0.2", "0.6", "1"]
    summary = ensemble_sweep.summary()
    assert "tok/pass" in summary and summary.splitlines()[0].startswith("CONFORMS to the declared law at 3/3")
    table = summary.splitlines()[1 : 3 + len(WEIGHTS)]  # verdict line, head, header, one row per weight, notes
    assert table[0].startswith(ensemble_sweep.subject) and len(table) == 2 + len(WEIGHTS)


def test_sweep_declared_law_argument_overrides():
    # a mis-declared law (always w = 0.9) must fail conformance at w = 0.3
    result = sweep(
        lossy.ensemble,
        [0.3],
        scenario="pos8_uniform_k4",
        declared_law=lambda w: lossy.ensemble(0.9).declared_law,
        batch_size=1024,
    )
    assert result.verdicts == ("fail",)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(make_verify=None, values=[0.5]), "make_verify"),
        (dict(make_verify=lossy.ensemble, values=[]), "values"),
        (dict(make_verify=lossy.ensemble, values="0.5"), "values"),
        (dict(make_verify=lossy.ensemble, values=[0.5], draft_cost=-1.0), "draft_cost"),
        (dict(make_verify=lossy.ensemble, values=[0.5], draft_cost=float("nan")), "draft_cost"),
        (dict(make_verify=lossy.ensemble, values=[0.5], declared_law=3), "declared_law"),
        (dict(make_verify=lossy.ensemble, values=[0.5], knob=""), "knob"),
        (dict(make_verify=lambda v: 3, values=[0.5]), "make_verify"),
        (dict(make_verify=lossy.ensemble, values=[1.5]), "weight"),
    ],
)
def test_sweep_bad_arguments(kwargs, match):
    make_verify, values = kwargs.pop("make_verify"), kwargs.pop("values")
    with pytest.raises(InvalidArgument, match=match):
        sweep(make_verify, values, **kwargs)


def test_renderer_writes_valid_files(ensemble_sweep, tmp_path):
    paths = write_sweep(ensemble_sweep, tmp_path / "out")
    assert sorted(p.name for p in paths.values()) == ["sweep.html", "sweep.json", "sweep.md"]
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]
    data = json.loads(paths["json"].read_text())
    assert len(data["points"]) == len(WEIGHTS)
    md = paths["markdown"].read_text()
    assert md == render_sweep_markdown(ensemble_sweep)
    rows = [line for line in md.splitlines() if line.startswith("| 0.2 ") or line.startswith("| 1 ")]
    assert len(rows) == 6  # the trade-off table and the per-in-block and per-absolute-position tables
    html = paths["html"].read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    pytest.importorskip("matplotlib")
    assert "data:image/png;base64," in html
    plain = render_sweep_html(ensemble_sweep, plots=False)
    assert "data:image/png" not in plain and "Plot not drawn" in plain
    with pytest.raises(InvalidArgument, match="SweepResult"):
        write_sweep({"points": []}, tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgument, match="not a directory"):
        write_sweep(ensemble_sweep, tmp_path / "file")


def test_cli_sweep_writes_the_three_files(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["measure", "--verifier", "reference.lossy:ensemble", "--sweep", "weight=0.5,1.0", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "weight swept on pos8_uniform_k4" in printed
    data = json.loads((out / "sweep.json").read_text())
    assert [p["value"] for p in data["points"]] == [0.5, 1.0]
    assert data["command"].startswith("specverify measure --verifier reference.lossy:ensemble")
    assert "--sweep weight=0.5,1.0" in data["command"]
    assert (out / "sweep.md").read_text().count("| 0.5 |") == 3
    assert (out / "sweep.html").is_file()


def test_cli_sweep_nonconformant_exit_status(capsys):
    argv = ["measure", "--verifier", "reference.lossy:ensemble", "--sweep", "weight=0.3",
            "--declared-law", "reference.lossy:ensemble_declared_law", "--declared-option", "weight=0.9", "--json"]  # fmt: skip
    assert main(argv) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["points"][0]["measure"]["conformance_verdict"] == "fail"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sweep", "weight"], "--sweep must look like KEY=V1,V2"),
        (["--sweep", "weight=0.5,,1"], "--sweep must look like KEY=V1,V2"),
        (["--sweep", "weight=0.5", "--verifier-option", "weight=0.2"], "both set weight"),
        (["--sweep", "weight=0.5", "--declared-sweep-key", "weight"], "needs --declared-law"),
        (["--sweep", "weight=0.5", "--draft-cost", "-1"], "--draft-cost: must be a finite number >= 0"),
    ],
)
def test_cli_sweep_bad_usage(extra, message, capsys):
    try:  # argparse's own checks (the argument types) exit; the later ones return the status
        status = main(["measure", "--verifier", "reference.lossy:ensemble", *extra])
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    assert message in capsys.readouterr().err

"""Tests of ``specverify selftest`` (mutation matrix, exit status, renderings) and of the LR limit.

The matrix logic runs once per module on a small subset: two real mutants
(``always_accept``, ``residual_is_p``), one correct variant (``accept_le``), a planted
"mutant" that is really the canonical rule (must be reported as SURVIVED) and a planted
"variant" that is really lossy (must be reported as a FALSE ALARM), on the single
scenario ``pos8_uniform_k4``.  Outcomes are deterministic (fixed seeds); the planted
deviations are gross, so their verdicts hold with overwhelming probability at the
run's alpha = 1e-3 (the canonical rule's pass is itself the calibrated event: the
battery's family-wise rate is 1e-3 and the seed is fixed).

The LR limit is checked against an exact binomial power calculation (two Bernoullis,
where the LR test is the one-sided binomial test) and by simulation.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math

import numpy as np
import pytest
from scipy import stats as st

import specverify.selftest as selftest
from specverify import mutants
from specverify.core.errors import InvalidArgument
from specverify.mutants import CatalogueEntry
from specverify.selftest.calibration import clopper_pearson
from specverify.selftest.entry_scenarios import MUTANT_SCENARIOS, equivalent_scenarios, mutant_scenarios
from specverify.selftest.lr_limit import MC_MAX_ENTRIES, bernoulli_lr_samples_needed, lr_samples_needed, mc_rows
from specverify.selftest.render import MATRIX_COLUMNS, render_markdown, render_text
from specverify.selftest.verifiers import scaled_scenario
from specverify.verifier.scenarios import get_scenarios

SCENARIO = "pos8_uniform_k4"


def _planted():
    canonical = mutants.by_name("canonical").fn
    lossy = mutants.by_name("always_accept").fn
    fake_mutant = CatalogueEntry(
        "planted_correct", "verifier", canonical, "the canonical rule posing as a mutant", "test", needs="any"
    )
    fake_variant = CatalogueEntry("planted_lossy", "equivalent", lossy, "always_accept posing as a variant", "test")
    return fake_mutant, fake_variant


def _planted_below_tier():
    """The canonical rule posing as a mutant that needs more tokens than any tier runs: not scored."""
    return CatalogueEntry(
        "planted_below", "verifier", mutants.by_name("canonical").fn, "canonical, posing as a subtle mutant", "test",
        needs="any", tokens_to_detect=10**12, effect="planted: needs 1e12 tokens",
    )  # fmt: skip


def _small_selftest(workers: int = 1):
    fake_mutant, fake_variant = _planted()
    return selftest.run_selftest(
        "smoke",
        0,
        verifiers=[
            mutants.by_name("always_accept"),
            mutants.by_name("residual_is_p"),
            fake_mutant,
            _planted_below_tier(),
        ],
        equivalents=[mutants.by_name("accept_le"), fake_variant],
        scenarios=[SCENARIO],
        decoders=False,
        drafters=False,
        trees=False,
        lr=True,
        lr_rows=2048,
        calibration_options=dict(seeds=2, rows=256, scenarios=[SCENARIO]),
        workers=workers,
    )


@pytest.fixture(scope="module")
def small_result():
    return _small_selftest()


def _row(result, name):
    (row,) = [r for r in result.rows if r["name"] == name]
    return row


def _without_times(value):
    """``value`` with every wall-time field (a key ending in "seconds") dropped, at any depth."""
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not k.endswith("seconds")}
    if isinstance(value, (list, tuple)):
        return [_without_times(v) for v in value]
    return value


def test_worker_processes_give_the_same_rows(small_result):
    """Two spawned workers run the same parts (entries, calibration) and return the same rows in the same order."""
    parallel = _small_selftest(workers=2)
    assert _without_times(parallel.rows) == _without_times(small_result.rows)
    assert _without_times(parallel.calibration) == _without_times(small_result.calibration)


def test_workers_need_picklable_entries():
    local = CatalogueEntry("local", "verifier", lambda *a, **k: None, "a lambda cannot travel", "test", needs="any")
    with pytest.raises(InvalidArgument, match="workers > 1 needs picklable selftest parts; 'verifier local'"):
        selftest.run_selftest("smoke", 0, verifiers=[local, mutants.by_name("always_accept")], equivalents=[],
                              decoders=False, drafters=False, trees=False, calibration=False, workers=2)  # fmt: skip
    with pytest.raises(InvalidArgument, match="workers"):
        selftest.run_selftest("smoke", 0, workers=0)


# ------------------------------------------------------------------ matrix bookkeeping
def test_killed_and_survived_bookkeeping(small_result):
    r = small_result
    for name in ("always_accept", "residual_is_p"):
        row = _row(r, name)
        assert row["killed"] and row["ok"] and row["verdict"] == "fail", row
        kill = row["killing_test"]
        assert kill["scenario"] == SCENARIO and kill["adjusted_pvalue"] <= r.alpha and kill["family"]
        assert 0 < row["samples_needed"] <= row["samples_run"], row
        assert row["doubling"][-1]["killed"] and not any(t["killed"] for t in row["doubling"][:-1])
    assert _row(r, "accept_le")["ok"] and not _row(r, "accept_le")["killed"]
    assert not _row(r, "planted_correct")["killed"] and not _row(r, "planted_correct")["ok"]
    assert _row(r, "planted_lossy")["killed"] and not _row(r, "planted_lossy")["ok"]
    assert [x["name"] for x in r.survivors] == ["planted_correct"]
    assert [x["name"] for x in r.false_alarms] == ["planted_lossy"]
    assert r.mutation_score == (2, 3) and not r.passed
    # a mutant below the tier's detectable deviation runs, is reported, and is not scored
    below = _row(r, "planted_below")
    assert below["expected"] == "below tier" and below["ok"] and not below["killed"]
    assert below["tokens_to_detect"] == 10**12 and "below tier (needs > 1,000,000,000,000 tokens)" in render_text(r)
    # a survivor reports how close the battery came
    assert _row(r, "planted_correct")["closest_test"]["adjusted_pvalue"] > r.alpha


def test_samples_needed_is_monotone_in_the_deviation(small_result):
    # always_accept (output = q, TV ~0.5) dies with fewer samples than residual_is_p
    assert (
        _row(small_result, "always_accept")["samples_needed"] <= _row(small_result, "residual_is_p")["samples_needed"]
    )


def test_lr_limit_rows(small_result):
    for name in ("always_accept", "residual_is_p"):
        row = _row(small_result, name)
        lr = row["lr"]
        assert (
            lr["n_lr_tokens"] > 0
            and lr["stratum"]
            and row["lr_ratio"] == pytest.approx(row["samples_needed"] / lr["n_lr_tokens"])
        )
    assert _row(small_result, "accept_le")["lr"] is None


def test_calibration_summary(small_result):
    cal = small_result.calibration
    assert cal["trials"] == 2 and cal["implementations"]["canonical"]["trials"] == 2
    lo, hi = cal["ci95"]
    assert 0 <= lo <= cal["rate"] <= hi <= 1


def _ok_only(result):
    rows = tuple(r for r in result.rows if r["ok"])
    return dataclasses.replace(result, rows=rows)


@pytest.mark.parametrize("which, code", [("as_is", 1), ("ok_only", 0)])
def test_exit_status(small_result, monkeypatch, which, code):
    result = small_result if which == "as_is" else _ok_only(small_result)
    monkeypatch.setattr(selftest.run, "run_selftest", lambda **kw: result)
    out = io.StringIO()
    assert selftest.main(tier="smoke", seed=0, as_json=False, matrix_path=None, stream=out) == code
    text = out.getvalue()
    assert "mutation score" in text and "calibration" in text
    if code:
        assert "SURVIVED" in text and "FALSE ALARM" in text


def test_exit_status_when_only_a_variant_fails(small_result, monkeypatch):
    rows = tuple(r for r in small_result.rows if r["ok"] or r["name"] == "planted_lossy")
    result = dataclasses.replace(small_result, rows=rows)
    monkeypatch.setattr(selftest.run, "run_selftest", lambda **kw: result)
    assert selftest.main(stream=io.StringIO()) == 1


def test_json_output_parses(small_result, monkeypatch):
    monkeypatch.setattr(selftest.run, "run_selftest", lambda **kw: small_result)
    out = io.StringIO()
    selftest.main(as_json=True, stream=out)
    data = json.loads(out.getvalue())
    assert data["mutation_score"] == {"killed": 2, "total": 3}
    assert data["survivors"] == ["planted_correct"] and data["false_alarms"] == ["planted_lossy"]
    assert {r["name"] for r in data["rows"]} >= {"always_accept", "accept_le"}
    assert data["calibration"]["alpha"] == 0.05


def test_markdown_matrix_has_the_columns(small_result, monkeypatch, tmp_path):
    peers = tuple(
        {
            "name": r["name"],
            "kind": r["kind"],
            "caught": {"chi2_10sigma": r["killed"]},
            "results": {"chi2_10sigma": {"passed": not r["killed"], "samples": 400000, "seconds": 1.0}},
        }
        for r in small_result.rows
    )
    result = dataclasses.replace(small_result, peers=peers)
    monkeypatch.setattr(selftest.run, "run_selftest", lambda **kw: result)
    path = tmp_path / "matrix.md"
    selftest.main(matrix_path=str(path), stream=io.StringIO())
    text = path.read_text()
    assert text.startswith("# specverify mutation matrix") and "Generated by `specverify selftest" in text
    header = next(line for line in text.splitlines() if line.startswith("| entry | kind"))
    for col in MATRIX_COLUMNS + ("peer chi2_10sigma",):
        assert f" {col} |" in header, col
    assert "| peer chi2_10sigma | 2/3 | 1/2 |" in text  # totals: the fake peer mirrors specverify
    assert "Not in the totals (below this tier's detectable deviation): planted_below." in text
    assert "`always_accept`" in text and "## Calibration" in text
    assert render_markdown(small_result).count("\n") > 10 and "LR ratio" in render_text(small_result)


def test_peer_totals_count_tree_entries_run_as_chains(small_result):
    """The peers run every tree entry as a chain verifier (``tree:<name>``): such rows are scored,
    below-tier chain mutants are not."""
    peers = tuple(
        {"name": r["name"], "kind": r["kind"], "caught": {"chi2_10sigma": r["killed"]}} for r in small_result.rows
    ) + ({"name": "tree:planted_tree", "kind": "verifier", "caught": {"chi2_10sigma": True}},)
    result = dataclasses.replace(small_result, peers=peers)
    scored = [r for r in peers if r["kind"] == "verifier" and r["name"] != "planted_below"]
    line = next(x for x in render_text(result).splitlines() if "peer chi2_10sigma" in x)
    assert f"{sum(r['caught']['chi2_10sigma'] for r in scored)}/{len(scored)} verifier mutants caught" in line
    assert "tree:planted_tree" in {r["name"] for r in scored} and len(scored) >= 2


# ------------------------------------------------------------------ plan
def test_plan_covers_the_catalogue_with_known_scenarios():
    known = {s.name for s in get_scenarios()}
    for entry in mutants.entries("verifier"):
        assert entry.name in MUTANT_SCENARIOS, entry.name
        assert set(mutant_scenarios(entry.name, "smoke")) <= known
        assert mutant_scenarios(entry.name, "standard") is None
    for entry in mutants.entries("equivalent"):
        chosen = get_scenarios(equivalent_scenarios(entry.requires, "smoke"))
        if "one-hot" in entry.requires:
            assert all(s.drafter in ("least_likely", "argmax") for s in chosen)


def test_scaled_scenario_keeps_the_tables():
    (sc,) = get_scenarios([SCENARIO])
    small, big = scaled_scenario(sc, 100), scaled_scenario(sc, 3 * sc.batch_size)
    assert small.batch_size == 100 and small.num_groups("smoke") == 1
    assert big.batch_size == sc.batch_size and big.num_groups("smoke") == 3
    assert np.array_equal(small.build()[0].table.numpy(), sc.build()[0].table.numpy())


def test_clopper_pearson():
    assert clopper_pearson(0, 30) == (0.0, pytest.approx(0.1157, abs=1e-4))
    lo, hi = clopper_pearson(5, 100)
    assert lo < 0.05 < hi


# ------------------------------------------------------------------ LR limit
def _exact_binomial_n(p0, p1, alpha, power=0.9):
    """Smallest n at which the one-sided level-alpha binomial test (the LR test for p1 > p0) has the power."""
    for n in range(1, 20000):
        c = int(st.binom.isf(alpha, n, p0)) + 1  # reject iff X >= c, P0(X >= c) <= alpha
        while st.binom.sf(c - 1, n, p0) > alpha:
            c += 1
        if st.binom.sf(c - 1, n, p1) >= power:
            return n
    raise AssertionError("not reached")


@pytest.mark.parametrize("p0, p1, alpha", [(0.3, 0.4, 1e-3), (0.1, 0.15, 0.05), (0.2, 0.3, 0.01), (0.5, 0.6, 1e-3)])
def test_lr_limit_matches_exact_binomial_power(p0, p1, alpha):
    exact = _exact_binomial_n(p0, p1, alpha)
    approx = bernoulli_lr_samples_needed(p0, p1, alpha=alpha).n
    assert abs(approx - exact) / exact < 0.1, (p0, p1, alpha, exact, approx)


def test_lr_limit_closed_form_moments():
    p0, p1 = 0.3, 0.4
    lim = bernoulli_lr_samples_needed(p0, p1, alpha=1e-3)
    kl_mp = p1 * math.log(p1 / p0) + (1 - p1) * math.log((1 - p1) / (1 - p0))
    kl_pm = p0 * math.log(p0 / p1) + (1 - p0) * math.log((1 - p0) / (1 - p1))
    d = math.log(p1 / p0) - math.log((1 - p1) / (1 - p0))  # the LLR jumps by d per success
    assert lim.mu1 == pytest.approx(kl_mp) and lim.mu0 == pytest.approx(-kl_pm)
    assert lim.sigma0 == pytest.approx(d * math.sqrt(p0 * (1 - p0)))
    assert lim.sigma1 == pytest.approx(d * math.sqrt(p1 * (1 - p1)))
    z = st.norm.isf(1e-3) * lim.sigma0 + st.norm.isf(0.1) * lim.sigma1
    assert lim.n == pytest.approx((z / (kl_mp + kl_pm)) ** 2)


def test_lr_limit_by_simulation():
    rng = np.random.default_rng(12345)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    m = np.array([0.3, 0.3, 0.25, 0.15])
    alpha = 0.05
    lim = lr_samples_needed(p, m, alpha=alpha)
    n = int(round(lim.n))
    llr = np.log(m / p)
    crit = n * lim.mu0 + st.norm.isf(alpha) * lim.sigma0 * math.sqrt(n)
    reps = 4000
    under_m = llr[rng.choice(4, size=(reps, n), p=m)].sum(1)
    under_p = llr[rng.choice(4, size=(reps, n), p=p)].sum(1)
    power, size = float(np.mean(under_m > crit)), float(np.mean(under_p > crit))
    # binomial sd ~0.005 / 0.0035 at 4000 reps; the rest is the normal approximation's error
    assert 0.86 < power < 0.94, power
    assert 0.035 < size < 0.065, size


def test_lr_limit_stratified_and_support():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
    same = lr_samples_needed(p, p, weights=[1, 3])
    assert math.isinf(same.n) and same.support_mass == 0
    m = np.array([[0.5, 0.4, 0.1], [0.2, 0.8, 0.0]])
    lim = lr_samples_needed(p, m, weights=[1, 1])
    assert lim.support_mass == pytest.approx(0.05)
    assert lim.n_support == pytest.approx(math.log(0.1) / math.log(0.95))
    assert lim.n <= lim.n_support


def test_lr_monte_carlo_rows_fit_the_law_entry_cap():
    # toy vocabularies keep every row asked for; a real one is cut to whole batches within the cap
    assert mc_rows(1 << 16, length=8, vocab_size=1000, batch_size=64) == 1 << 16
    cut = mc_rows(1 << 16, length=3, vocab_size=151936, batch_size=32)
    assert cut % 32 == 0 and cut * 3 * 151936 <= MC_MAX_ENTRIES < (cut + 32) * 3 * 151936
    # never below one batch, never above the request
    assert mc_rows(1 << 16, length=64, vocab_size=1 << 30, batch_size=32) == 32
    assert mc_rows(8, length=64, vocab_size=1 << 30, batch_size=32) == 8
    with pytest.raises(InvalidArgument, match="vocab_size"):
        mc_rows(8, length=3, vocab_size=0, batch_size=32)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(null_probs=[0.5, 0.5], alt_probs=[0.2, 0.3, 0.5]),
        dict(null_probs=[-0.1, 1.1], alt_probs=[0.5, 0.5]),
        dict(null_probs=[0.5, 0.5], alt_probs=[0.5, 0.5], alpha=0.0),
        dict(null_probs=[[0.5, 0.5]], alt_probs=[[0.5, 0.5]], weights=[1, 2]),
    ],
)
def test_lr_limit_rejects_bad_input(kwargs):
    with pytest.raises(InvalidArgument):
        lr_samples_needed(**kwargs)


def test_run_selftest_rejects_bad_tier():
    with pytest.raises(InvalidArgument, match="tier"):
        selftest.run_selftest("huge")


# ------------------------------------------------------------------ the real thing
@pytest.mark.slow
def test_full_smoke_selftest_passes():
    out = io.StringIO()
    code = selftest.main(tier="smoke", seed=0, as_json=True, matrix_path=None, stream=out)
    data = json.loads(out.getvalue())
    assert code == 0, (data["survivors"], data["false_alarms"])
    assert data["mutation_score"]["killed"] == data["mutation_score"]["total"] >= 26

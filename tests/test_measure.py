"""measure_divergence and ``specverify measure``: per-position TV intervals of lossy rules.

The HF ensemble rule (reference.lossy) declares the per-position law ``w p + (1 - w) q``;
its exact TV from the target is ``(1 - w) TV(p, q)`` at every draft position (0 at the
bonus position), averaged over the observed contexts.  Every reported interval must
contain it, the samples must conform to the declared law, and a mis-declared weight must
fail the conformance check.  Strata: ``abs=t`` from 0 (as the verifier battery labels
positions) and ``block=i`` from 2 (in-block position 1 is ``abs=0``), each tested once.
"""

from __future__ import annotations

import argparse
import json

import pytest

from specverify.cli import measure as measure_cli
from specverify.core.errors import InvalidArgument
from specverify.measure.chain import measure_divergence
from specverify.verifier.scenarios import get_scenarios
from specverify_reference import lossy
from specverify_reference.rules import verify as canonical_verify

LEVEL = 0.99


def _strata(result):
    return result.by_block + result.by_position


def test_ensemble_intervals_contain_exact_tv():
    w = 0.5
    v = lossy.ensemble(w)
    result = measure_divergence(
        v, scenario="pos8_uniform_k4", seed=0, level=LEVEL, declared_law=v.declared_law, batch_size=2048
    )
    target, drafter = get_scenarios(["pos8_uniform_k4"])[0].build()
    # abs=0 is always the first draft position: one context, the closed form itself
    first = result.by_position[0]
    assert first.stratum == "abs=0"
    closed = (1 - w) * 0.5 * float((target.table[0] - drafter.table[0]).abs().sum())
    assert first.declared_tv == pytest.approx(closed, abs=1e-12)
    for s in _strata(result):
        e = s.estimate
        assert e.tv_lower <= s.declared_tv <= e.tv_upper, (
            f"{s.stratum}: exact TV {s.declared_tv:.4f} outside [{e.tv_lower:.4f}, {e.tv_upper:.4f}] (n={e.n}, seed 0)"
        )
        assert e.tv_upper - e.tv_lower < 0.08  # informative at V = 8
    bonus = result.by_block[-1]
    assert bonus.declared_tv == pytest.approx(0.0, abs=1e-12) and bonus.estimate.tv_lower == 0.0
    assert result.conformance_verdict in ("pass", "suspicious")
    assert 1.0 < result.tokens_per_pass < 5.0


def test_ensemble_with_context_dependent_target():
    v = lossy.ensemble(0.3)
    result = measure_divergence(v, scenario="markov8_temperature_k2", level=LEVEL, declared_law=v.declared_law)
    for s in _strata(result):
        e = s.estimate
        assert e.num_contexts > 1 or s.stratum == "abs=0"
        assert e.tv_lower <= s.declared_tv <= e.tv_upper, f"{s.stratum}: {s.declared_tv} vs {e}"


def test_lossless_reference_measures_zero():
    result = measure_divergence(canonical_verify, scenario="pos16_noisy_k1", level=LEVEL, batch_size=2048)
    for s in _strata(result):
        assert s.declared_tv is None
        assert abs(s.estimate.tv) < 0.02 and s.estimate.tv_lower == 0.0 and not s.estimate.support_failure


def test_misdeclared_weight_fails_conformance():
    result = measure_divergence(
        lossy.ensemble(0.3), scenario="pos8_uniform_k4", declared_law=lossy.ensemble(0.5).declared_law, batch_size=1024
    )
    assert result.conformance_verdict == "fail"
    assert any(r.grade == "fail" and r.name == "declared_gof" for r in result.conformance)


def _parser():
    parser = argparse.ArgumentParser(prog="specverify")
    measure_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_measure_writes_results(tmp_path, capsys):
    args = _parser().parse_args(
        ["measure", "--verifier", "reference.lossy:ensemble", "--verifier-option", "weight=0.5",
         "--scenario", "pos2_least_likely_k2", "--level", "0.99", "--out", str(tmp_path)]
    )  # fmt: skip
    assert measure_cli.run(args) == 0
    data = json.loads((tmp_path / "measure.json").read_text())
    assert data["scenario"] == "pos2_least_likely_k2" and data["conformance_verdict"] in ("pass", "suspicious")
    for s in data["by_block"] + data["by_position"]:
        assert s["estimate"]["tv_lower"] <= s["declared_tv"] <= s["estimate"]["tv_upper"]
    assert "tokens per target pass" in (tmp_path / "measure.txt").read_text()
    out = capsys.readouterr().out
    assert "abs=0" in out and "block=2" in out and "block=1" not in out


def test_cli_measure_exit_status(capsys):
    parser = _parser()
    bad = parser.parse_args(["measure", "--verifier", "reference.lossy:ensemble", "--verifier-option", "wt=1"])
    assert measure_cli.run(bad) == 2
    assert "wt" in capsys.readouterr().err
    wrong = parser.parse_args(
        ["measure", "--verifier", "reference.lossy:ensemble", "--verifier-option", "weight=0.2",
         "--declared-law", "reference.lossy:ensemble_declared_law", "--declared-option", "weight=0.6",
         "--scenario", "pos2_least_likely_k2"]
    )  # fmt: skip
    assert measure_cli.run(wrong) == 1


def test_bad_arguments():
    target, drafter = get_scenarios(["pos8_uniform_k4"])[0].build()
    with pytest.raises(InvalidArgument, match="scenario"):
        measure_divergence(canonical_verify, scenario="pos8_uniform_k4", target=target, drafter=drafter, k=2)
    with pytest.raises(InvalidArgument, match="tier"):
        measure_divergence(canonical_verify, tier="huge")
    with pytest.raises(InvalidArgument, match="declared_law"):
        measure_divergence(canonical_verify, declared_law=3)
    with pytest.raises(InvalidArgument, match="unknown scenario"):
        measure_divergence(canonical_verify, scenario="nope")


@pytest.mark.slow
def test_harness_coverage_over_seeds():
    """Over 40 seeds x 13 strata, the 95% intervals of the ensemble rule miss the exact TV
    on each side at most at their nominal 2.5% rate (exact binomial bound at 1e-6)."""
    from scipy import stats

    target, drafter = get_scenarios(["pos8_uniform_k4"])[0].build()
    v = lossy.ensemble(0.25)
    low = high = total = 0
    for seed in range(40):
        result = measure_divergence(
            v, target=target, drafter=drafter, k=4, seed=seed, declared_law=v.declared_law, length=8
        )
        for s in _strata(result):
            total += 1
            low += s.estimate.tv_lower > s.declared_tv
            high += s.estimate.tv_upper < s.declared_tv
    bound = int(stats.binom.isf(1e-6, total, 0.025))
    assert low <= bound and high <= bound, f"misses: lower {low}, upper {high} of {total} (bound {bound})"


def _hf_kernel():
    pytest.importorskip("transformers")
    hf_kernel = pytest.importorskip("specverify.adapters.hf.kernel")
    if hf_kernel.KERNEL_PROBLEM is not None or "assistant_ensemble_weight" not in hf_kernel.KERNEL_PARAMETERS:
        pytest.skip("this transformers' _speculative_sampling has no assistant_ensemble_weight")
    return hf_kernel


def test_hf_ensemble_control_intervals_contain_exact_tv():
    """The HF kernel itself with assistant_ensemble_weight = 0.5: TV = 0.5 TV(p, q) per position."""
    hf_kernel = _hf_kernel()
    verify = hf_kernel.SpeculativeSamplingVerifier(assistant_ensemble_weight=0.5).verify
    result = measure_divergence(
        verify, scenario="pos8_uniform_k4", level=LEVEL, batch_size=256, declared_law=lossy.ensemble(0.5).declared_law
    )
    for s in _strata(result):
        e = s.estimate
        assert e.tv_lower <= s.declared_tv <= e.tv_upper, (
            f"{s.stratum}: {s.declared_tv:.4f} vs [{e.tv_lower}, {e.tv_upper}]"
        )
    assert result.conformance_verdict in ("pass", "suspicious")


@pytest.mark.slow
def test_hf_ensemble_control_cli(tmp_path):
    _hf_kernel()
    args = _parser().parse_args(
        ["measure", "--verifier", "specverify.adapters.hf.kernel:SpeculativeSamplingVerifier",
         "--verifier-option", "assistant_ensemble_weight=0.5",
         "--declared-law", "reference.lossy:ensemble_declared_law", "--declared-option", "weight=0.5",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert measure_cli.run(args) == 0
    data = json.loads((tmp_path / "measure.json").read_text())
    for s in data["by_block"] + data["by_position"]:
        assert s["estimate"]["tv_lower"] <= s["declared_tv"] <= s["estimate"]["tv_upper"], s["stratum"]


def test_overall_tv_is_a_simultaneous_band_around_the_mean():
    v = lossy.ensemble(0.4)
    result = measure_divergence(
        v, scenario="pos8_uniform_k4", level=LEVEL, declared_law=v.declared_law, batch_size=1024
    )
    o = result.overall
    positions = result.by_position
    assert o.positions == len(positions) and o.level == LEVEL
    assert o.tv == pytest.approx(sum(s.estimate.tv for s in positions) / len(positions))
    assert o.declared_tv == pytest.approx(sum(s.declared_tv for s in positions) / len(positions))
    assert o.tv_lower <= o.declared_tv <= o.tv_upper
    # Bonferroni-widened: no narrower than the mean of the per-position intervals
    assert o.tv_upper - o.tv_lower >= sum(s.estimate.tv_upper - s.estimate.tv_lower for s in positions) / len(positions)
    assert "mean TV per token" in result.summary()
    assert json.loads(json.dumps(result.to_dict()))["overall"]["positions"] == len(positions)


def test_cli_calls_a_factory_with_its_defaults(capsys):
    # reference.lossy:ensemble needs no argument (weight=0.5): called, not used as the verify callable
    args = _parser().parse_args(
        ["measure", "--verifier", "reference.lossy:ensemble", "--scenario", "pos2_least_likely_k2"]
    )
    assert measure_cli.run(args) == 0
    assert "conformance to the declared law" in capsys.readouterr().out


def test_hf_generate_ensemble_conforms_at_draft_positions():
    """generate(assistant_ensemble_weight=0.5): positions 1..K emit w p + (1 - w) q at the generated prefix.

    With max_new_tokens = K + 1: transformers drafts at most (tokens left - 1) per round, so the last
    position can be a capped round's bonus (law p) and is not measured.
    """
    _hf_kernel()
    hf = pytest.importorskip("specverify.adapters.hf")
    import torch

    from specverify.measure.decoder import measure_decoder_divergence

    decoder = hf.tiny_assisted_decoder(k=2, assistant_ensemble_weight=0.5, seed=0)
    target = decoder.target()
    draft = hf.HFTarget(decoder.assistant, num_threads=1, suppress_tokens=decoder.options["suppress_tokens"])
    result = measure_decoder_divergence(
        decoder, target, draft=draft, prompt=torch.tensor([1, 2]), num_samples=600, max_new_tokens=3, seed=0,
        level=LEVEL, declared_law=lossy.ensemble(0.5).declared_law, positions=(1, 2),
    )  # fmt: skip
    first = result.by_position[0]
    assert first.estimate.num_contexts == 1 and first.declared_tv > 0.05
    assert first.estimate.tv_lower <= first.declared_tv <= first.estimate.tv_upper
    assert result.conformance_verdict in ("pass", "suspicious")
    assert len(result.by_position) == 2 and result.by_block == ()
    with pytest.raises(InvalidArgument, match="declared_law"):
        measure_decoder_divergence(decoder, target, prompt=torch.tensor([1]), num_samples=4, max_new_tokens=1,
                                   declared_law=lossy.ensemble(0.5).declared_law)  # fmt: skip


def test_tree_measure_sees_a_lossy_tree_rule_and_not_the_reference():
    """The reference tree rule measures 0 at every depth; the thresholds-below-one mutant (SGLang's lossy
    thresholds, planted) has a positive lower bound at depths 1 and 2 and accepts more per pass."""
    from specverify.measure.tree import measure_tree_divergence
    from specverify.mutants import by_name
    from specverify_reference.tree_rules import verify_tree

    exact = measure_tree_divergence(verify_tree, scenario="markov8_topk_3x2", level=LEVEL)
    lossy_rule = measure_tree_divergence(by_name("thresholds_below_one").fn, scenario="markov8_topk_3x2", level=LEVEL)
    assert [s.stratum for s in exact.by_block] == ["depth=2", "depth=3"]  # depth 1 is abs=0
    for s in _strata(exact):
        assert s.estimate.tv_lower == 0.0 and not s.estimate.support_failure, s
    assert lossy_rule.by_position[0].estimate.tv_lower > 0.1 and lossy_rule.by_block[0].estimate.tv_lower > 0.1
    assert lossy_rule.tokens_per_pass > exact.tokens_per_pass > 1.5
    assert len(exact.acceptance_by_block) == 2 and exact.overall is not None


def test_cli_measure_tree_verifier_and_decoder(tmp_path, capsys):
    parser = _parser()
    tree = parser.parse_args(
        ["measure", "--tree-verifier", "reference.tree_rules:verify_tree", "--scenario", "markov8_iid_2x2",
         "--out", str(tmp_path / "tree")]
    )  # fmt: skip
    assert measure_cli.run(tree) == 0
    assert json.loads((tmp_path / "tree" / "measure.json").read_text())["by_block"][0]["stratum"] == "depth=2"
    decoder = parser.parse_args(
        ["measure", "--decoder", "specverify.cli.factories:reference_decoder", "--decoder-option", "top_k=5",
         "--target", "specverify.cli.factories:reference_target", "--target-option", "top_k=5",
         "--num-samples", "300", "--max-new-tokens", "2", "--positions", "1,2", "--json"]
    )  # fmt: skip
    capsys.readouterr()
    assert measure_cli.run(decoder) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["stratum"] for s in data["by_position"]] == ["abs=1", "abs=2"]
    assert all(s["estimate"]["tv_lower"] == 0.0 for s in data["by_position"])
    for argv, message in (
        (["--decoder", "specverify.cli.factories:reference_decoder"], "--target"),
        (["--tree-verifier", "reference.tree_rules:verify_tree", "--declared-law", "x:y"], "--declared-law"),
        (["--decoder", "specverify.cli.factories:reference_decoder", "--target",
          "specverify.cli.factories:reference_target", "--prompt", "1,a"], "--prompt"),
        (["--decoder", "specverify.cli.factories:reference_decoder", "--sweep", "k=1,2"], "--sweep"),
    ):  # fmt: skip
        assert measure_cli.run(parser.parse_args(["measure", *argv])) == 2
        assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- issue 30, item 6: loose ends


def test_measure_divergence_takes_the_implementations_declared_law():
    """Like ``specverify measure`` and ``sweep``, the Python entry point checks ``verify.declared_law``
    when no declared law is given: the same result as passing it explicitly."""
    from specverify.measure.chain import declared_law_of

    v = lossy.ensemble(0.5)
    own = measure_divergence(v, scenario="pos8_uniform_k4", batch_size=512)
    given = measure_divergence(v, scenario="pos8_uniform_k4", batch_size=512, declared_law=v.declared_law)
    assert own.conformance_verdict in ("pass", "suspicious") and own.conformance
    assert own.to_dict() | {"seconds": 0} == given.to_dict() | {"seconds": 0}
    assert all(s.declared_tv is not None for s in _strata(own))

    class Rule:  # an object whose bound verify method is handed in
        def declared_law(self, target_probs, draft_probs=None):
            return v.declared_law(target_probs, draft_probs)

        def verify(self, *args, generator):
            return v(*args, generator=generator)

    rule = Rule()
    assert declared_law_of(rule.verify) == rule.declared_law and declared_law_of(v) is v.declared_law
    assert declared_law_of(v, canonical_verify) is canonical_verify and declared_law_of(canonical_verify) is None
    # an explicit law still wins over the implementation's own
    wrong = measure_divergence(v, scenario="pos8_uniform_k4", batch_size=1024,
                               declared_law=lossy.ensemble(0.9).declared_law)  # fmt: skip
    assert wrong.conformance_verdict == "fail"


def test_strata_are_labelled_like_check_verifier_and_tested_once():
    """Absolute positions are labelled from 0 exactly as the verifier battery labels its per-position tests,
    and in-block position 1 (the samples of abs=0) is not a second stratum: every stratum once, and its
    conformance tests (declared GOF, sparse, support) once in the error budget."""
    import torch

    from specverify.measure.chain import measure_run
    from specverify.verifier.battery import analyse_run
    from specverify.verifier.harness import run_harness

    target, drafter = get_scenarios(["pos8_uniform_k4"])[0].build()
    v = lossy.ensemble(0.5)
    run = run_harness(v, target, drafter, k=4, batch_size=512, length=8, generator=torch.Generator().manual_seed(3))
    battery = analyse_run(run, target, drafter, scenario="s", alpha=1e-3, seed=0)
    battery_abs = {r.position for r in battery if r.name == "gof" and r.position.startswith("abs=")}
    result = measure_run(run, target, drafter, name="s", tier="smoke", seed=0, level=0.95, declared_law=v.declared_law,
                         alpha=1e-3, mean_accepted=1.0, row_calls=1)  # fmt: skip
    assert {s.stratum for s in result.by_position} == battery_abs == {f"abs={t}" for t in range(8)}
    names = [s.stratum for s in _strata(result)]
    assert names == [f"block={i}" for i in range(2, 6)] + [f"abs={t}" for t in range(8)]
    first = run.block_positions[:, 0]
    assert bool((first == 1).all())  # why block=1 would be abs=0 again
    per_stratum = {}
    for r in result.conformance:
        per_stratum.setdefault(r.position, []).append(r.name)
    assert set(per_stratum) == set(names)
    assert all(
        sorted(tests) == ["declared_gof", "declared_sparse", "declared_support"] for tests in per_stratum.values()
    )
    assert result.overall.positions == 8


def test_reported_estimate_lies_inside_its_interval_over_strata_and_seeds():
    """Over 2 rules x 6 seeds x 12 strata (and the 12 overall bands) every reported TV estimate is inside its
    reported interval; the lossless rule's bias-corrected value is often below its lower bound (0), so some
    estimates must have been clipped, each flagged with why."""
    checked = clipped = 0
    for weight in (0.4, 1.0):
        v = lossy.ensemble(weight)
        for seed in range(6):
            result = measure_divergence(v, scenario="pos8_uniform_k4", seed=seed, batch_size=512)
            estimates = [s.estimate for s in _strata(result)] + [c for s in _strata(result) if (c := s.estimate.coarse)]
            for e in [*estimates, result.overall]:
                assert e.tv_lower <= e.tv <= e.tv_upper, (weight, seed, e)
                checked += 1
                clipped += e.tv_clipped is not None
            for e in estimates:
                assert (e.tv_clipped is None) == (e.tv == e.tv_bias_corrected)
                assert e.tv_clipped is None or "lower bound" in e.tv_clipped
    assert checked == 2 * 6 * 13 and clipped >= 5, f"{clipped} of {checked} clipped"
    last_clipped = any(s.estimate.tv_clipped for s in _strata(result)) or result.overall.tv_clipped
    assert ("^ TV clipped to its interval" in result.summary()) == bool(last_clipped)


def test_conformance_mde_point_mass_is_at_the_graded_share():
    from specverify.stats.sparse import point_mass_mde

    v = lossy.ensemble(0.5)
    result = measure_divergence(v, scenario="pos8_uniform_k4", batch_size=512, alpha=1e-3)
    sparse = [r for r in result.conformance if r.name == "declared_sparse"]
    assert len(sparse) == len(_strata(result))
    for r in sparse:
        d = r.details
        assert r.alpha < 1e-3 / 10  # the share of a budget split over many tests
        at_share = point_mass_mde(d["mde_n"], d["mde_top_prob"], d["mde_top_weight"], r.alpha, d["power"])
        at_nominal = point_mass_mde(d["mde_n"], d["mde_top_prob"], d["mde_top_weight"], 1e-3, d["power"])
        assert d["mde_point_mass"] == pytest.approx(at_share, rel=1e-12) and at_share > at_nominal


def test_split_is_seeded_from_the_run():
    """The lower bound's split comes from a generator seeded by (seed, scenario, stratum): same seed, same
    bounds; the split generators of two strata differ."""
    from specverify.measure.chain import split_generator

    v = lossy.ensemble(0.5)
    a = measure_divergence(v, scenario="pos2_least_likely_k2", seed=1)
    b = measure_divergence(v, scenario="pos2_least_likely_k2", seed=1)
    assert [s.estimate.tv_lower for s in _strata(a)] == [s.estimate.tv_lower for s in _strata(b)]
    first = split_generator(1, "pos2_least_likely_k2", "abs=0").initial_seed()
    assert first != split_generator(1, "pos2_least_likely_k2", "abs=1").initial_seed()
    assert first != split_generator(2, "pos2_least_likely_k2", "abs=0").initial_seed()

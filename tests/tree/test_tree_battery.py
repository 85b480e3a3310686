"""check_tree_verifier: the reference rules pass, every tree mutant is caught, misbehaviour is reported.

Seeds are fixed; every battery run is graded at alpha = 1e-3 family-wise, so a false alarm
on the reference rules has probability < 1e-3 per run (and is deterministic per seed).
"""

from __future__ import annotations

import pytest
import torch

from specverify import mutants
from specverify.core.errors import InvalidArgument
from specverify.protocols.tree import PAD, ROOT, TreeBatch, check_parents
from specverify.selftest.entry_scenarios import TREE_MUTANT_SCENARIOS, tree_entry_scenarios
from specverify.verifier.tree.battery import check_tree_verifier, list_tree_scenarios
from specverify.verifier.tree.chain import as_chain_verifier
from specverify.verifier.tree.drafting import TreeDrafting, draft_trees
from specverify.verifier.tree.harness import _AcceptProbs, run_tree_harness
from specverify.verifier.tree.scenarios import TREE_SCENARIOS, get_tree_scenarios
from specverify_reference.tree_rules import verify_tree

ALPHA = 1e-3
TREE_ENTRIES = mutants.entries(subject="tree")


def _describe(report) -> str:
    worst = sorted(report.results, key=lambda r: r.adjusted_pvalue if r.adjusted_pvalue is not None else 1.0)[:3]
    return report.summary() + "\n" + "\n".join(f"  {r.scenario} {r.name} {r.position} p={r.pvalue:.3g}" for r in worst)


def test_reference_rules_pass_every_tree_scenario():
    report = check_tree_verifier(verify_tree, tier="smoke", seed=0, alpha=ALPHA)
    assert report.verdict != "fail" and not report.errors, _describe(report)
    assert report.kind == "tree_verifier"
    ran = {r.scenario for r in report.results}
    assert ran == {s.name for s in TREE_SCENARIOS if not s.edge_coins}  # edge coins need a uniforms-in kernel
    trees = report.extra["trees"]
    assert trees["markov4_deep_narrow_iid"]["tokens_per_target_pass"] > 2.0
    assert {r.family for r in report.results} >= {"support", "gof", "acceptance", "directed", "protocol"}
    assert any(r.name == "accepted_length" for r in report.results)


def test_reference_uniforms_in_kernel_runs_the_edge_coin_scenario():
    from specverify.protocols.tree import uniforms_in
    from specverify_reference.tree_rules import verify_tree_coins

    report = check_tree_verifier(
        uniforms_in(verify_tree_coins), tier="smoke", seed=0, scenarios=["pos32_disjoint_edge_coins"]
    )
    assert report.verdict == "pass", _describe(report)
    assert {r.family for r in report.results} == {"protocol", "support"}


def test_only_skipped_scenarios_give_a_report_with_the_skip_note():
    from specverify.verifier.tree.battery import SKIP_NOTE

    calls = []
    report = check_tree_verifier(
        verify_tree, scenarios=["pos32_disjoint_edge_coins"], progress=lambda *a: calls.append(a)
    )
    assert report.results == [] and report.extra["trees"]["pos32_disjoint_edge_coins"]["note"] == SKIP_NOTE
    assert calls == []  # nothing ran, nothing to report progress on


@pytest.mark.parametrize("entry", [e for e in TREE_ENTRIES if e.lossy], ids=lambda e: e.name)
def test_every_tree_mutant_is_caught_on_its_witness(entry):
    report = check_tree_verifier(
        entry.fn, tier="smoke", seed=0, alpha=ALPHA, scenarios=TREE_MUTANT_SCENARIOS[entry.name]
    )
    assert report.verdict == "fail", f"{entry.name} ({entry.provenance}) survived:\n{_describe(report)}"
    assert not report.errors, report.errors


@pytest.mark.parametrize("entry", [e for e in TREE_ENTRIES if not e.lossy], ids=lambda e: e.name)
def test_tree_equivalents_pass(entry):
    report = check_tree_verifier(
        entry.fn, tier="smoke", seed=0, alpha=ALPHA, scenarios=tree_entry_scenarios(entry, "smoke")
    )
    assert report.verdict != "fail", f"{entry.name} is correct but failed:\n{_describe(report)}"


def test_every_mutant_has_a_witness_within_its_base_rule():
    names = {e.name for e in TREE_ENTRIES if e.lossy}
    assert names == set(TREE_MUTANT_SCENARIOS)
    for e in TREE_ENTRIES:
        allowed = tree_entry_scenarios(e, "standard")
        assert set(TREE_MUTANT_SCENARIOS.get(e.name, ())) <= set(allowed), e.name
        assert e.provenance and e.description


def test_a_broken_output_is_an_implementation_error_in_the_report():
    def no_path(target_probs, draft_probs, tokens, parents, *, mode, generator):
        emitted, num, path = verify_tree(target_probs, draft_probs, tokens, parents, mode=mode, generator=generator)
        return emitted, num, torch.full_like(path, -1)  # the path does not match num_emitted

    report = check_tree_verifier(no_path, tier="smoke", seed=0, scenarios=["markov8_iid_2x2"])
    assert report.verdict == "error" and report.errors and "path" in report.errors[0]


def test_a_verifier_ignoring_its_generator_is_reported():
    state = torch.Generator().manual_seed(1)

    def global_rng(target_probs, draft_probs, tokens, parents, *, mode, generator):
        return verify_tree(target_probs, draft_probs, tokens, parents, mode=mode, generator=state)

    report = check_tree_verifier(global_rng, tier="smoke", seed=0, scenarios=["markov8_topk_3x2"])
    assert report.verdict == "error" and "same seed" in report.errors[0]


def test_a_raising_verifier_is_reported_not_raised():
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    report = check_tree_verifier(boom, tier="smoke", seed=0, scenarios=["markov8_topk_3x2"])
    assert report.verdict == "error" and "kernel exploded" in report.errors[0]


def test_bad_arguments():
    with pytest.raises(InvalidArgument, match="verify_tree"):
        check_tree_verifier(42)
    with pytest.raises(InvalidArgument, match="not tree scenarios"):
        check_tree_verifier(verify_tree, scenarios=["nope"])
    with pytest.raises(InvalidArgument, match="modes"):
        get_tree_scenarios(modes=["beam"])
    with pytest.raises(InvalidArgument, match="mode"):
        TreeDrafting("beam")
    with pytest.raises(InvalidArgument, match="duplicate"):
        TreeDrafting("iid", duplicate=True)
    with pytest.raises(InvalidArgument, match="dynamic"):
        TreeDrafting("iid", dynamic=(2, 2, 2, 4))
    assert [s["name"] for s in list_tree_scenarios()] == [s.name for s in TREE_SCENARIOS]
    assert {s.drafting.mode for s in get_tree_scenarios(modes=["topk"])} == {"topk"}


@pytest.mark.parametrize(
    "spec",
    [
        TreeDrafting("iid", (3, 2)),
        TreeDrafting("wor", (3, 2)),
        TreeDrafting("topk", (3, 2), duplicate=True),
        TreeDrafting("topk", dynamic=(4, 3, 3, 10)),
        TreeDrafting("any", (2, 2), pad_every=2),
        TreeDrafting("iid", (3, 2), pad_random=3),
        TreeDrafting("wor", (3, 2), prune=0.3),
    ],
    ids=lambda s: s.describe(),
)
def test_drafted_trees_are_valid_protocol_inputs(spec):
    (scenario,) = get_tree_scenarios(["markov8_iid_2x2"])
    target, drafter = scenario.build()
    b = 512
    tctx = torch.arange(b) % target.num_contexts  # rows start from every context
    dctx = torch.arange(b) % drafter.num_contexts
    trees = draft_trees(target, drafter, spec, tctx, dctx, generator=torch.Generator().manual_seed(0))
    check_parents(trees.parents)
    assert trees.parents.shape == (b, spec.num_nodes)
    real = trees.parents != PAD
    # every real node's context is its parent's context advanced by its token
    slot_t = torch.cat([tctx[:, None], trees.target_contexts], 1)
    parent_ctx = slot_t.gather(1, (trees.parents + 1).clamp(min=0))
    assert torch.equal(target.next_context(parent_ctx, trees.tokens)[real], trees.target_contexts[real])
    if spec.mode in ("wor", "topk") and not spec.duplicate:  # distinct siblings
        for parent in range(-1, spec.num_nodes):
            sib = (trees.parents == parent) & real
            for r in range(0, b, 97):
                toks = trees.tokens[r][sib[r]]
                assert toks.unique().numel() == toks.numel()
    if spec.dynamic is not None:  # the shape differs from row to row, always N nodes, depth <= D
        assert len({tuple(p.tolist()) for p in trees.parents}) > 1
        assert int(TreeBatch(target.table32[slot_t], drafter.table32[torch.cat([dctx[:, None], trees.draft_contexts], 1)],
                             trees.tokens, trees.parents, "topk").max_depth()) <= spec.max_depth  # fmt: skip
    if spec.pad_every:
        assert torch.equal(trees.parents[0] == PAD, spec.template_parents() == PAD)


def test_template_parents():
    assert TreeDrafting("iid", (3, 2)).template_parents().tolist() == [ROOT] * 3 + [0, 0, 1, 1, 2, 2]
    assert TreeDrafting("iid", (2, 2), pad_every=2).template_parents().tolist() == [-1, -1, PAD, 0, 0, PAD, 1, 1, PAD]
    assert TreeDrafting("topk", dynamic=(2, 2, 2, 3)).template_parents() is None


def test_exact_acceptance_counts_a_duplicated_token_once_and_ignores_padding():
    (scenario,) = get_tree_scenarios(["markov8_topk_3x2"])
    target, drafter = scenario.build()
    probs = _AcceptProbs(target, drafter, "topk")
    tctx = torch.tensor([0, 0])
    tokens = torch.tensor([[3, 0, 0], [3, 3, 0]])  # row 0: tokens 3, 0 and a padded slot holding 0
    real = torch.tensor([[True, True, False], [True, True, False]])
    got = probs(tctx, tctx, tokens, real)
    p = target.table[0]
    assert torch.allclose(got, torch.stack([p[3] + p[0], p[3]]), rtol=0, atol=1e-15)


def test_harness_acceptance_matches_its_exact_probability():
    (scenario,) = get_tree_scenarios(["markov8_wor_3x2"])
    target, drafter = scenario.build()
    run = run_tree_harness(verify_tree, target, drafter, scenario.drafting, batch_size=4096, length=6,
                           generator=torch.Generator().manual_seed(3)).run  # fmt: skip
    for depth in (1, 2):
        sel = run.trial_positions == depth
        n = int(sel.sum())
        observed = float(run.trial_accepted[sel].double().sum())
        expected = float(run.trial_accept_probs[sel].sum())
        var = float((run.trial_accept_probs[sel] * (1 - run.trial_accept_probs[sel])).sum())
        assert abs(observed - expected) < 5 * var**0.5, (depth, n, observed, expected)  # z < 5: p < 6e-7


def test_a_tree_verifier_is_a_chain_verifier_on_one_path():
    from specverify import check_verifier

    report = check_verifier(as_chain_verifier(verify_tree, mode="iid"), tier="smoke", seed=0,
                            scenarios=["pos8_uniform_k4", "markov8_temperature_k2"])  # fmt: skip
    assert report.verdict != "fail", report.summary()
    lossy = as_chain_verifier(mutants.by_name("residual_zero_only_rejected").fn, mode="iid")
    assert check_verifier(lossy, tier="smoke", seed=0, scenarios=["pos8_uniform_k4"]).verdict == "fail"
    with pytest.raises(InvalidArgument, match="mode"):
        as_chain_verifier(verify_tree, mode="beam")


def test_selftest_tree_rows():
    from specverify.selftest.battery_runs import run_tree_entries

    rows = run_tree_entries(tier="smoke", seed=0, alpha=ALPHA, names=["greedy_fallback", "sglang_target_only"])
    by = {r["name"]: r for r in rows}
    assert by["greedy_fallback"]["killed"] and by["greedy_fallback"]["ok"] and by["greedy_fallback"]["group"] == "tree"
    assert not by["sglang_target_only"]["killed"] and by["sglang_target_only"]["group"] == "tree_equivalent"
    assert by["greedy_fallback"]["scenarios"] == ["markov8_topk_3x2"]


def test_cli_tree_audit(tmp_path, capsys):
    from specverify.cli.commands import main, parse_command

    out = tmp_path / "rep"
    argv = ["audit", "--tree-verifier", "specverify.mutants:greedy_fallback", "--scenario", "markov8_topk_3x2"]
    assert main([*argv, "--out", str(out)]) == 1
    import json

    command = json.loads((out / "report.json").read_text())["command"]
    args = parse_command(command)
    assert args.tree_verifier == "specverify.mutants:greedy_fallback" and args.scenario == ["markov8_topk_3x2"]
    assert main(["audit", "--tree-verifier", "reference.tree_rules:verify_tree", "--mode", "topk",
                 "--scenario", "markov8_topk_3x2", "--out", str(tmp_path / "ok")]) == 0  # fmt: skip
    assert main(["audit", "--verifier", "reference.rules:verify", "--mode", "topk", "--out", str(tmp_path / "x")]) == 2
    assert "--mode (tree-verifier audits)" in capsys.readouterr().err


def test_top_tokens_equals_a_stable_descending_sort():
    from specverify.verifier.tree.drafting import top_tokens

    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        V = int(torch.randint(1, 40, (1,), generator=gen))
        rows = torch.randint(0, 4, (7, V), generator=gen).double() / 4  # many ties
        k = int(torch.randint(1, V + 1, (1,), generator=gen))
        values, ids = top_tokens(rows, k)
        ref = torch.sort(rows, dim=-1, descending=True, stable=True)
        assert torch.equal(ids, ref.indices[:, :k]) and torch.equal(values, ref.values[:, :k]), (rows, k)

"""check_verifier end to end: correct variants pass, catalogued bugs fail, broken kernels are reported.

Correct variants (must pass):

* ``le``            -- accept iff ``u * q(x) <= p(x)`` (``u <= p/q``);
* ``sample_match``  -- sample-and-match: draw y ~ p_i and accept iff y == x_i, emitting y
  on a mismatch.  This is the canonical rule *only when q_i is a point mass at x_i*
  (then P(accept) = p(x) = min(p(x), 1) and y | y != x is exactly the residual
  (p - q)+ / (1 - p(x))).  For a stochastic q it is wrong in general (it accepts with
  probability p(x) instead of min(1, p(x)/q(x)); Leviathan et al. 2023, sec. 2.3, and
  Chen et al. 2023 need the ratio), so the variant applies the match rule at positions
  whose q row is one-hot and the canonical rule elsewhere.  The battery's one-hot-q
  scenarios (``pos2_least_likely_k2``, ``pos256_flat_argmax_k4``) exercise the match path;
* ``exp_race``      -- residual and bonus drawn as ``argmax(w / E)``, E ~ Exp(1) i.i.d.
  (the exponential race / Gumbel-max trick, as vLLM V1 does);
* ``no_bonus``      -- when all K drafts are accepted emit only them (num_emitted = K).

Mutants (must fail): residual = p, always accept, bonus from the residual row, one
uniform shared across the block, batch rows mixed (row i's replacement token written
into row i+1), continuing after the first rejection; and broken kernels (out-of-vocab
tokens, wrong shapes, raising, nondeterministic) that must be reported as
ImplementationError with verdict "error" (the implementation could not be tested).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from specverify.core.results import Report, error_groups
from specverify.core.sampling import sample, uniform
from specverify.core.seeds import scenario_seed
from specverify.verifier.battery import check_greedy_verifier, check_verifier
from specverify.verifier.scenarios import SCENARIOS, get_scenarios
from specverify_reference.rules import greedy_verify
from specverify_reference.rules import verify as reference_verify


# ---------------------------------------------------------------------------- variants
def _exp_race(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """argmax(w / E) with E ~ Exp(1): a draw from w / sum w (zero weights never win)."""
    expo = -torch.log1p(-uniform(weights.shape, generator=generator))  # (B, V) Exp(1)
    return (weights / expo).argmax(-1)


def make_variant(mode: str):
    """The chain rule with one change (see the module docstring)."""

    def variant(target_probs, draft_probs, draft_tokens, *, generator):
        B, K1, V = target_probs.shape
        K = K1 - 1
        rows = torch.arange(B)
        x = draft_tokens.long()
        p = target_probs.double()  # (B, K+1, V)
        q = draft_probs.double()  # (B, K, V)
        p_x = p[:, :K].gather(-1, x[..., None]).squeeze(-1)  # (B, K)
        q_x = q.gather(-1, x[..., None]).squeeze(-1)  # (B, K)
        u = uniform((B, 1) if mode == "shared_uniform" else (B, K), generator=generator)
        accepted = (u * q_x <= p_x) if mode == "le" else (u * q_x < p_x)  # (B, K)
        if mode == "sample_match":
            y = sample(p[:, :K], generator=generator, check=False)  # (B, K)
            one_hot = q_x == 1.0
            accepted = torch.where(one_hot, y == x, accepted)
        if mode == "always_accept":
            accepted = torch.ones_like(accepted)
        if mode == "continue_after_reject":
            num_acc = accepted.long().sum(-1)  # counts every accepted draft, not the prefix
        else:
            num_acc = accepted.long().cumprod(-1).sum(-1)  # (B,)
        all_acc = num_acc == K
        p_row = p[rows, num_acc]  # (B, V)
        q_row = q[rows, num_acc.clamp(max=K - 1)]  # (B, V)
        residual = (p_row - q_row).clamp_min(0.0)
        if mode == "residual_is_p":
            residual = p_row
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, p_row, residual)
        bonus_row = p_row
        if mode == "bonus_from_residual":
            last_p, last_q = p[:, K - 1], q[:, K - 1]
            bonus_row = (last_p - last_q).clamp_min(0.0)
            bonus_row = torch.where(bonus_row.sum(-1, keepdim=True) <= 0, last_p, bonus_row)
        weights = torch.where(all_acc[:, None], bonus_row, residual)  # (B, V)
        last = (
            _exp_race(weights, generator) if mode == "exp_race" else sample(weights, generator=generator, check=False)
        )
        if mode == "sample_match":
            at = num_acc.clamp(max=K - 1)
            match_last = y[rows, at]
            last = torch.where(~all_acc & one_hot[rows, at], match_last, last)
        if mode == "batch_row_mix":
            last = last.roll(1)  # row i emits the replacement token drawn for row i-1
        tokens = torch.cat([x, torch.zeros_like(x[:, :1])], 1)  # (B, K+1)
        tokens[rows, num_acc] = last
        num_emitted = num_acc + 1
        if mode == "no_bonus":
            num_emitted = torch.where(all_acc, num_acc, num_emitted)
        return tokens, num_emitted

    variant.__name__ = variant.__qualname__ = f"variant_{mode}"
    return variant


CORRECT = ["le", "sample_match", "exp_race", "no_bonus"]
#: mutant -> scenarios that expose it (run only those to keep the default selection fast)
MUTANTS = {
    "residual_is_p": ["pos16_noisy_k1"],
    "always_accept": ["pos8_uniform_k4"],
    "bonus_from_residual": ["pos16_noisy_k1"],
    "shared_uniform": ["pos8_uniform_k4"],
    "batch_row_mix": ["pos8_uniform_k4"],
    "continue_after_reject": ["pos8_uniform_k4"],
}


@pytest.fixture(scope="module")
def reference_report():
    start = time.perf_counter()
    cpu = time.process_time()
    report = check_verifier(reference_verify, tier="smoke", seed=0)
    return report, time.perf_counter() - start, time.process_time() - cpu


# ---------------------------------------------------------------------------- correct
def test_reference_passes_smoke(reference_report):
    report, wall, cpu = reference_report
    print(f"\nsmoke tier, reference.rules.verify: wall {wall:.1f} s, cpu {cpu:.1f} s, {len(report.results)} tests")
    assert report.passed, report.summary()
    assert report.verdict in ("pass", "suspicious")
    assert not report.errors
    assert report.tier == "smoke" and report.seed == 0 and report.kind == "verifier"
    assert len(report.scenarios) == len(SCENARIOS)
    assert all(isinstance(s, dict) and s["name"] for s in report.scenarios)
    assert set(report.timings) >= {s.name for s in SCENARIOS} | {"total"}
    assert {"torch", "numpy", "scipy", "python"} <= set(report.environment)


def test_every_result_carries_n_and_power(reference_report):
    report, _, _ = reference_report
    families = {r.family for r in report.results}
    assert {"gof", "support", "directed", "acceptance", "independence", "protocol"} <= families
    for r in report.results:
        assert r.grade in ("pass", "suspicious", "fail") and r.alpha is not None, r
        if r.family == "gof" and r.name == "sparse":  # power stated as the detectable point mass
            assert r.n > 0 and r.details["mde_point_mass"] > 0, r
        elif r.family == "gof":
            assert r.n > 0 and r.mde_tv is not None and r.mde_tv > 0, r
    gof = [r for r in report.results if r.family == "gof"]
    assert sum(r.name == "sparse" for r in gof) == sum(r.name == "gof" for r in gof)  # stats.gof_pair


def test_report_json_roundtrip(reference_report):
    report, _, _ = reference_report
    text = report.to_json()
    data = json.loads(text)
    assert data["passed"] is True and data["tier"] == "smoke"
    again = Report.from_json(text)
    assert again.verdict == report.verdict and len(again.results) == len(report.results)


@pytest.mark.parametrize("mode", CORRECT)
def test_correct_variants_pass(mode):
    # the scenarios where each variant departs from the canonical code path
    names = {
        "le": ["pos32_topk_disjoint_k4"],
        "sample_match": ["pos2_least_likely_k2", "pos256_flat_argmax_k4"],
        "exp_race": ["pos32_adversary_k4"],
        "no_bonus": ["markov4_oracle_k8", "pos16_noisy_k1"],
    }[mode]
    report = check_verifier(make_variant(mode), scenarios=names, seed=1)
    assert report.passed, report.summary()


@pytest.mark.slow
@pytest.mark.parametrize("mode", CORRECT)
def test_correct_variants_pass_full_smoke(mode):
    report = check_verifier(make_variant(mode), tier="smoke", seed=2)
    assert report.passed, report.summary()


def test_same_seed_same_verdict():
    names = ["pos2_least_likely_k2"]
    a = check_verifier(reference_verify, scenarios=names, seed=7)
    b = check_verifier(reference_verify, scenarios=names, seed=7)
    assert [r.pvalue for r in a.results] == [r.pvalue for r in b.results]
    assert a.verdict == b.verdict
    assert scenario_seed(7, "x") == scenario_seed(7, "x") != scenario_seed(8, "x")


def test_progress_callback():
    calls = []
    check_verifier(
        reference_verify,
        scenarios=["pos2_least_likely_k2", "markov4_oracle_k8"],
        progress=lambda done, total, name: calls.append((done, total, name)),
    )
    scenarios = get_scenarios(["pos2_least_likely_k2", "markov4_oracle_k8"])
    total = sum(s.num_groups("smoke") * s.batch_size * s.length for s in scenarios)  # emitted tokens
    assert calls[0] == (0, total, "pos2_least_likely_k2 (0/2 scenarios done)") and calls[-1] == (total, total, "")
    assert len(calls) == 2 + sum(s.num_groups("smoke") for s in scenarios)  # a call per group in between
    assert [d for d, _, _ in calls] == sorted(d for d, _, _ in calls)
    assert ("markov4_oracle_k8 (1/2 scenarios done)") in {name for _, _, name in calls}


# ---------------------------------------------------------------------------- mutants
@pytest.mark.parametrize("mode", sorted(MUTANTS))
def test_mutants_fail(mode):
    report = check_verifier(make_variant(mode), scenarios=MUTANTS[mode], seed=3)
    assert report.verdict == "fail", report.summary()
    assert not report.passed


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MUTANTS))
def test_mutants_fail_full_smoke(mode):
    report = check_verifier(make_variant(mode), tier="smoke", seed=4)
    assert report.verdict == "fail", report.summary()


# ---------------------------------------------------------------------------- broken kernels
def _out_of_vocab(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, num = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    tokens[3, num[3] - 1] = target_probs.shape[-1]  # one id == V in row 3
    return tokens, num


def _wrong_shape(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, num = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    return tokens[:, :-1], num


def _raises(target_probs, draft_probs, draft_tokens, *, generator):
    raise RuntimeError("CUDA error: device-side assert triggered")


def _nondeterministic(target_probs, draft_probs, draft_tokens, *, generator):
    return reference_verify(
        target_probs, draft_probs, draft_tokens, generator=torch.Generator().manual_seed(int(time.time_ns() % 2**31))
    )


def _float_tokens(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, num = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    return tokens.float(), num


def _zero_emitted(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, num = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    num[5] = 0
    return tokens, num


def _wrong_prefix(target_probs, draft_probs, draft_tokens, *, generator):
    tokens, num = reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)
    V = target_probs.shape[-1]
    two = (num >= 2).nonzero()
    if two.numel():
        b = int(two[0])
        tokens[b, 0] = (tokens[b, 0] + 1) % V
    return tokens, num


@pytest.mark.parametrize(
    "broken, fragment",
    [
        (_out_of_vocab, "row 3: emitted token"),
        (_wrong_shape, "shape"),
        (_raises, "RuntimeError: CUDA error"),
        (_nondeterministic, "same generator seed"),
        (_float_tokens, "dtype"),
        (_zero_emitted, "row 5: num_emitted = 0"),
        (_wrong_prefix, "differs from the accepted draft"),
    ],
)
def test_broken_kernels_are_reported(broken, fragment):
    report = check_verifier(broken, scenarios=["pos8_uniform_k4", "markov8_temperature_k2"], seed=0)
    assert report.verdict == "error" and not report.passed
    assert len(report.errors) == 2, report.errors
    assert all(fragment in e for e in report.errors), report.errors
    assert any(r.family == "protocol" and r.grade == "fail" for r in report.results)  # the record of each error
    groups = error_groups(report)  # each distinct error once, with the scenarios that met it
    assert sorted(n for g in groups for n in g.scenarios) == ["markov8_temperature_k2", "pos8_uniform_k4"]
    assert all(fragment in g.message and not g.message.startswith("pos8") for g in groups), groups
    assert "ERROR (the implementation could not be tested)" in report.summary()
    assert not any("[FAIL] protocol" in line for line in report.summary().splitlines())
    json.loads(report.to_json())


# ---------------------------------------------------------------------------- greedy
def _greedy(target_probs, draft_probs, draft_tokens, *, generator):
    return greedy_verify(target_probs, draft_tokens)


def _greedy_ties_high(target_probs, draft_probs, draft_tokens, *, generator):
    flipped = target_probs.flip(-1)
    V = target_probs.shape[-1]
    tokens, num = greedy_verify(target_probs, draft_tokens)
    target_argmax = V - 1 - flipped.argmax(-1)  # ties to the highest id
    matches = draft_tokens.long() == target_argmax[:, :-1]
    num = matches.long().cumprod(-1).sum(-1) + 1
    return target_argmax, num


def _greedy_sampling(target_probs, draft_probs, draft_tokens, *, generator):
    return reference_verify(target_probs, draft_probs, draft_tokens, generator=generator)


def test_greedy_reference_passes():
    report = check_greedy_verifier(_greedy, seed=0)
    assert report.passed and report.verdict == "pass", report.summary()
    assert report.extra["mode"] == "greedy"
    assert all(r.n > 0 for r in report.results if r.family == "greedy")


@pytest.mark.parametrize("wrong", [_greedy_ties_high, _greedy_sampling])
def test_greedy_mismatch_fails(wrong):
    report = check_verifier(wrong, greedy=True, seed=0)
    assert report.verdict == "fail", report.summary()
    assert any(r.family == "greedy" and r.grade == "fail" for r in report.results)


def test_bad_arguments():
    from specverify.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="tier"):
        check_verifier(reference_verify, tier="huge")
    with pytest.raises(InvalidArgument, match="alpha"):
        check_verifier(reference_verify, alpha=2.0)
    with pytest.raises(InvalidArgument, match="verify"):
        check_verifier(42)
    with pytest.raises(InvalidArgument, match="unknown scenario"):
        check_verifier(reference_verify, scenarios=["nope"])

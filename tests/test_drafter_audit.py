"""Tests of ``specverify.drafter.audit_drafter``.

Honest zoo drafters pass at the smoke tier (run alpha 1e-6); the planted deviations that
prove power at the same alpha are a lying drafter (culprit: the drafter, even with the
canonical verifier) and a lossy verifier (residual = p, Spec-RL #14; culprit: the
verifier).  Efficiency numbers are checked against exact values: the oracle drafter
accepts everything, the uniform drafter's rate is sum_x min(p(x), 1/V), the adversary's
1 - eps + eps p_min, tokens per pass (1 - a^(K+1)) / (1 - a) on a context-free target.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as _st

from specverify.core.errors import InvalidArgument
from specverify.core.results import Report
from specverify.core.sampling import sample, uniform
from specverify.core.tables import PositionalCategorical, markov
from specverify.drafter import AUDIT_PLANS, audit_drafter
from specverify.drafter.acceptance import clopper_pearson
from specverify.measure import costmodel
from specverify.mutants.drafter import greedy_sample_soft_q
from specverify.verifier import zoo

ALPHA = 1e-6
K = 4


@pytest.fixture(scope="module")
def table():
    return markov(16, "peaked", seed=1)


@pytest.fixture(scope="module")
def categorical():
    """A context-free target: one categorical law at every position."""
    gen = torch.Generator().manual_seed(5)
    law = torch.softmax(1.5 * torch.randn(1, 10, generator=gen, dtype=torch.float64), -1)
    return PositionalCategorical(law, name="categorical")


def residual_is_p(target_probs, draft_probs, draft_tokens, *, generator):
    """Lossy verifier (Spec-RL #14): canonical accept step, replacement token drawn from p."""
    B, K1, V = target_probs.shape
    k = K1 - 1
    p_x = target_probs[:, :k].double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    q_x = draft_probs.double().gather(-1, draft_tokens[..., None]).squeeze(-1)  # (B, K)
    n = (uniform((B, k), generator=generator) * q_x < p_x).long().cumprod(-1).sum(-1)  # (B,)
    last = sample(target_probs.double()[torch.arange(B), n], generator=generator)  # (B,)
    tokens = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], 1)  # (B, K+1)
    tokens = torch.where(torch.arange(K1)[None] < n[:, None], tokens, 0)
    tokens.scatter_(1, n[:, None], last[:, None])
    return tokens, n + 1


def _failed(report: Report) -> list[str]:
    return sorted({f"{r.family}/{r.name}" for r in report.results if r.grade == "fail"})


# ------------------------------------------------------------------ honest drafters pass
@pytest.mark.parametrize("name", ["oracle", "uniform", "adversary", "least_likely", "stale"])
def test_honest_zoo_drafters_pass(table, name):
    report = audit_drafter(zoo.make_drafter(name, table), table, tier="smoke", seed=0, alpha=ALPHA, k=K)
    assert report.verdict == "pass" and not report.errors, report.summary()
    assert report.kind == "drafter" and report.extra["diagnosis"]["culprit"] is None
    families = {r.family for r in report.results}
    assert {"consistency", "acceptance", "gof", "directed", "support", "protocol"} <= families, families
    names = {r.name for r in report.results if r.family == "consistency"}
    assert names == {
        "consistency_gof",
        "consistency_sparse",
        "consistency_pit",
        "consistency_support",
        "consistency_normalised",
    }
    assert any(r.scenario.startswith("pipeline:") for r in report.results)


# ------------------------------------------------------------------ planted deviations (power)
def test_lying_drafter_is_named_the_culprit_with_the_canonical_verifier(table):
    report = audit_drafter(greedy_sample_soft_q(table), table, tier="smoke", seed=0, alpha=ALPHA, k=K)
    assert report.verdict == "fail", report.summary()
    diagnosis = report.extra["diagnosis"]
    assert diagnosis["culprit"] == "drafter" and "do not follow its reported q" in diagnosis["message"]
    assert "consistency/consistency_gof" in _failed(report)


def test_wrong_verifier_fails_the_losslessness_part(table):
    report = audit_drafter(zoo.uniform(table), table, verifier=residual_is_p, tier="smoke", seed=0, alpha=ALPHA, k=K)
    assert report.verdict == "fail" and not report.errors, report.summary()
    assert report.extra["diagnosis"]["culprit"] == "verifier", report.extra["diagnosis"]
    assert not [r for r in report.results if r.family == "consistency" and r.grade == "fail"]
    assert any(r.grade == "fail" and r.scenario.startswith("pipeline:") for r in report.results)
    # the accept step itself is canonical: acceptance tests pass
    assert not [r for r in report.results if r.family == "acceptance" and r.grade == "fail"]


# ------------------------------------------------------------------ efficiency numbers vs exact values
def _rates_within(report, exact: float, level: float = 1 - 1e-6):
    for pos in report.extra["efficiency"]["positions"]:
        low, high = clopper_pearson(pos["accepted"], pos["drafted"], level)
        assert low <= exact <= high, (
            f"position {pos['position']}: observed {pos['observed_rate']:.4f} "
            f"({pos['accepted']}/{pos['drafted']}), exact {exact:.4f}, CI [{low:.4f}, {high:.4f}]"
        )
        assert pos["expected_rate"] == pytest.approx(exact, abs=1e-12)
        assert pos["ci_low"] <= pos["observed_rate"] <= pos["ci_high"]


def _tokens_per_pass_within(report, a: float):
    eff = report.extra["efficiency"]
    exact = sum(a**j for j in range(K + 1))
    counts = np.asarray(eff["length_counts"], dtype=float)
    lengths = np.arange(K + 1)
    law = np.array([a**j * (1 - a) for j in range(K)] + [a**K])
    sd = math.sqrt(float((law * (lengths - (law * lengths).sum()) ** 2).sum()) / counts.sum())
    z = float(_st.norm.isf(1e-6 / 2))
    assert abs(eff["tokens_per_target_pass"] - exact) <= z * sd + 1e-12, (eff["tokens_per_target_pass"], exact)
    assert eff["target_passes_per_token"] == pytest.approx(1 / eff["tokens_per_target_pass"])
    np.testing.assert_allclose(eff["length_probs"], law, atol=z * 0.01)  # exact given drafts, averaged
    return exact


def test_uniform_drafter_rate_is_sum_min_p_one_over_v(categorical):
    p = categorical.table[0]
    a = float(torch.minimum(p, torch.full_like(p, 1 / p.numel())).sum())
    report = audit_drafter(zoo.uniform(categorical), categorical, seed=2, alpha=ALPHA, k=K)
    assert report.verdict == "pass", report.summary()
    _rates_within(report, a)
    _tokens_per_pass_within(report, a)


def test_adversary_rate_is_one_minus_eps_plus_eps_pmin(categorical):
    eps = 0.1
    p = categorical.table[0]
    a = 1 - eps + eps * float(p.min())
    report = audit_drafter(zoo.adversary(categorical, eps), categorical, seed=3, alpha=ALPHA, k=K)
    assert report.verdict == "pass", report.summary()
    _rates_within(report, a)
    _tokens_per_pass_within(report, a)


def test_oracle_accepts_everything_and_speedup_model(table):
    report = audit_drafter(
        zoo.oracle(table),
        table,
        seed=0,
        alpha=ALPHA,
        k=K,
        draft_cost=0.05,
        model_params=8e9,
        bandwidth=3.35e12,
        bytes_per_param=2,
    )
    eff = report.extra["efficiency"]
    assert [p["observed_rate"] for p in eff["positions"]] == [1.0] * K
    assert eff["tokens_per_target_pass"] == K + 1 and eff["mean_accepted"] == K
    assert eff["length_counts"][:-1] == [0] * K
    [block] = eff["speedup"]
    plan = costmodel.best_draft_length([1.0] * K, 0.05, max_k=16)
    assert block["best_k"] == plan.best_k and block["best_speedup"] == pytest.approx(plan.best_speedup)
    assert block["speedup_at_audited_k"] == pytest.approx((K + 1) / (0.05 * K + 1))
    t = 8e9 * 2 / 3.35e12
    assert eff["latency"]["target_pass_seconds"] == pytest.approx(t)
    assert block["seconds_per_token_at_audited_k"] == pytest.approx(t * (0.05 * K + 1) / (K + 1))
    # the acceptance section in the report renderer's format
    entry = report.extra["acceptance"]["efficiency"]
    assert [r["position"] for r in entry["positions"]] == list(range(1, K + 1))
    assert len(entry["length_counts"]) == K + 1 and sum(entry["length_probs"]) == pytest.approx(1.0)
    assert any(s["name"] == "efficiency" for s in report.scenarios)


def test_speedup_curve_without_draft_cost(table):
    report = audit_drafter(zoo.adversary(table), table, seed=0, alpha=ALPHA, k=2)
    blocks = report.extra["efficiency"]["speedup"]
    assert len(blocks) >= 3 and all(len(b["speedups"]) == 16 for b in blocks)
    assert "latency" not in report.extra["efficiency"]
    best = [b["best_k"] for b in blocks]
    assert best == sorted(best, reverse=True), "cheaper drafters must not prefer shorter drafts"


# ------------------------------------------------------------------ reports, determinism, progress
def test_report_is_deterministic_json_and_renders(table, tmp_path):
    calls = []
    kwargs = dict(tier="smoke", seed=4, alpha=ALPHA, k=3)
    a = audit_drafter(zoo.noisy(table), table, progress=lambda *x: calls.append(x), **kwargs)
    b = audit_drafter(zoo.noisy(table), table, **kwargs)
    assert [r.pvalue for r in a.results] == [r.pvalue for r in b.results]
    assert calls and calls[-1][0] == calls[-1][1] and [c[0] for c in calls] == sorted(c[0] for c in calls)
    again = Report.from_json(a.to_json())
    assert again.kind == "drafter" and again.verdict == a.verdict
    from specverify.report import render_markdown, write_report

    assert "consistency" in render_markdown(a)
    paths = write_report(a, tmp_path, plots=False)
    assert all(p.exists() for p in paths.values())


# ------------------------------------------------------------------ bad usage and broken components
def test_bad_arguments(table):
    d = zoo.uniform(table)
    for kwargs, word in [
        (dict(tier="huge"), "tier"),
        (dict(k=0), "k"),
        (dict(draft_cost=-1.0), "draft_cost"),
        (dict(model_params=0), "model_params"),
        (dict(bandwidth=float("nan")), "bandwidth"),
        (dict(progress=3), "progress"),
        (dict(alpha=2.0), "alpha"),
        (dict(verifier=5), "verifier"),
    ]:
        with pytest.raises(InvalidArgument, match=word):
            audit_drafter(d, table, **kwargs)
    with pytest.raises(InvalidArgument, match="drafter"):
        audit_drafter(object(), table)
    with pytest.raises(InvalidArgument, match="target"):
        audit_drafter(d, object())


class Broken:
    def __init__(self, target, how):
        self.inner, self.how, self.calls = zoo.uniform(target), how, 0

    def draft(self, prefix, k, *, generator):
        self.calls += 1
        if self.how == "raises":
            raise RuntimeError("CUDA error: device-side assert triggered")
        if self.how == "nondeterministic":
            generator = torch.Generator().manual_seed(self.calls)
        tokens, probs = self.inner.draft(prefix, k, generator=generator)
        if self.how == "shape":
            return tokens, probs[..., :-1]
        return tokens, probs


@pytest.mark.parametrize("how", ["raises", "shape", "nondeterministic"])
def test_broken_drafter_is_an_implementation_error(table, how):
    report = audit_drafter(Broken(table, how), table, tier="smoke", seed=0, alpha=ALPHA, k=2)
    assert report.verdict == "error" and report.errors, report.summary()
    assert report.extra["diagnosis"]["culprit"] == "protocol"
    assert any(r.family == "protocol" and r.pvalue == 0.0 for r in report.results)


def test_tier_plans_grow():
    smoke, standard, deep = (AUDIT_PLANS[t] for t in ("smoke", "standard", "deep"))
    assert smoke.consistency_samples < standard.consistency_samples < deep.consistency_samples
    assert smoke.efficiency_samples < standard.efficiency_samples < deep.efficiency_samples


# ------------------------------------------------------------------ calibration (slow)
@pytest.mark.slow
def test_false_alarm_rate_of_honest_drafters_is_controlled(table):
    """20 seeds x 3 honest drafters at run alpha 1e-2: at most a few suspicious/failing runs."""
    fails = 0
    for seed in range(20):
        for name in ("uniform", "noisy", "adversary"):
            report = audit_drafter(zoo.make_drafter(name, table), table, seed=seed, alpha=1e-2, k=3)
            fails += report.verdict == "fail"
    # P(fail) <= 1e-2 per run (Holm, conservative GOF): 60 runs, P(>= 5 fails) < 2e-4
    assert fails <= 4, f"{fails} of 60 honest audits failed at alpha 1e-2"

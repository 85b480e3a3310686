"""Tests of ``specverify.decoder.check_decoder`` (whole-decoder audit) and the decoder mutants.

Decoders under test: exact autoregressive samplers of table targets (correct, at the
wrong temperature, conditioning on a stale token), the reference speculative decoder
(processors on and off, greedy) and its planted-bug subclasses from
``specverify.mutants.decoder``, and broken decoders (bad shapes, float tokens,
out-of-vocabulary tokens, non-determinism, exceptions).  Every run has a fixed seed,
so outcomes are deterministic; the run's family-wise alpha is ALPHA = 1e-6 and every
"passes" assertion is paired with a planted deviation that fails at the same alpha.
"""

from __future__ import annotations

import pytest
import torch
from _targets import WithConditionals
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify.core.results import Report
from specverify.core.sampling import sample
from specverify.core.seeds import derive_seed
from specverify.core.tables import markov
from specverify.decoder import TIER_PLANS, check_decoder
from specverify.decoder.conditionals import prefix_ids
from specverify.decoder.protocol import make_prompts
from specverify.mutants import entries
from specverify.mutants.decoder import PENALISED, make_decoder_mutant
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler, TargetAdapter
from specverify_reference.models import make_pair
from specverify_reference.processors import GREEDY, SamplingConfig

DECODER_MUTANTS = entries(subject="decoder")

ALPHA = 1e-6
V_TABLE = 16


def _describe(report: Report) -> str:
    return report.summary()


# ------------------------------------------------------------------ table decoders
class TableSampler:
    """Exact autoregressive sampling of a table target; planted bugs on request.

    ``temperature``: sample from p^(1/T) renormalised (T=1 is correct);
    ``stale_from``: from this 0-based new-token position on, condition on the prefix
    without its last token (a stale context).
    """

    def __init__(self, model, *, temperature: float = 1.0, stale_from: int | None = None):
        self.model, self.temperature, self.stale_from = model, temperature, stale_from
        self.vocab_size = model.vocab_size

    def generate(self, prompt, *, num_samples, max_new_tokens, seed):
        generator = torch.Generator().manual_seed(seed)
        seq = prompt.expand(num_samples, -1).clone()  # (N, T)
        for j in range(max_new_tokens):
            stale = self.stale_from is not None and j >= self.stale_from
            probs = self.model.next_token_probs(seq[:, :-1] if stale else seq)  # (N, V)
            if self.temperature != 1.0:
                probs = probs ** (1.0 / self.temperature)
            seq = torch.cat([seq, sample(probs, generator=generator)[:, None]], dim=1)
        return seq[:, prompt.numel() :]


@pytest.fixture(scope="module")
def table():
    return markov(V_TABLE, "peaked", seed=11)


def test_correct_table_decoder_passes_smoke_and_is_reproducible(table):
    report = check_decoder(TableSampler(table), table, tier="smoke", seed=3, alpha=ALPHA)
    assert report.verdict == "pass" and not report.errors, _describe(report)
    families = {r.family for r in report.results}
    assert {"gof", "directed", "support", "independence", "protocol"} <= families
    assert any(r.position.startswith("node=") for r in report.results), "no prefix-node test ran"
    plan = TIER_PLANS["smoke"]
    assert len(report.scenarios) == plan.num_prompts
    for scenario in report.scenarios:
        assert scenario["vocab_size"] == V_TABLE and scenario["n"] == plan.num_samples
        assert {"decoder_seed", "determinism_seed", "pit_seed"} <= set(scenario)
    again = check_decoder(TableSampler(table), table, tier="smoke", seed=3, alpha=ALPHA)
    assert [r.pvalue for r in again.results] == [r.pvalue for r in report.results], "same seed, different p-values"
    assert Report.from_json(report.to_json()).verdict == "pass"


def test_batched_conditionals_match_the_per_position_loop(table):
    kwargs = dict(tier="smoke", seed=5, alpha=ALPHA, num_samples=600, max_new_tokens=5)
    loop = check_decoder(TableSampler(table), table, **kwargs)
    batched = check_decoder(TableSampler(table), WithConditionals(table), **kwargs)
    assert [(r.name, r.position, r.pvalue) for r in loop.results] == [
        (r.name, r.position, r.pvalue) for r in batched.results
    ]


@pytest.mark.parametrize("bug", ["temperature_0.7", "stale_token_from_position_2"])
def test_buggy_table_decoders_fail(table, bug):
    decoder = (
        TableSampler(table, temperature=0.7) if bug.startswith("temperature") else TableSampler(table, stale_from=1)
    )
    report = check_decoder(decoder, table, tier="smoke", seed=3, alpha=ALPHA)
    assert report.verdict == "fail" and not report.errors, f"{bug} not detected:\n{_describe(report)}"


# ------------------------------------------------------------------ protocol violations
class Broken(TableSampler):
    """A correct sampler whose output is then broken in one way."""

    def __init__(self, model, how):
        super().__init__(model)
        self.how, self.calls = how, 0

    def generate(self, prompt, *, num_samples, max_new_tokens, seed):
        self.calls += 1
        if self.how == "raises":
            raise RuntimeError("CUDA error: device-side assert triggered")
        if self.how == "nondeterministic":
            seed = seed + self.calls
        out = super().generate(prompt, num_samples=num_samples, max_new_tokens=max_new_tokens, seed=seed)
        if self.how == "shape":
            return out[:, :-1]
        if self.how == "float":
            return out.double()
        if self.how == "out_of_vocab":
            out[min(5, num_samples - 1), 1] = self.vocab_size
        if self.how == "numpy":
            return out.numpy()
        return out


@pytest.mark.parametrize(
    "how,message",
    [
        ("raises", "raised RuntimeError"),
        ("shape", "shape"),
        ("float", "dtype"),
        ("out_of_vocab", "outside the vocabulary"),
        ("nondeterministic", "not deterministic"),
    ],
)
def test_protocol_violations_become_implementation_errors(table, how, message):
    report = check_decoder(Broken(table, how), table, seed=1, alpha=ALPHA, num_samples=64, max_new_tokens=4)
    assert report.verdict == "error" and not report.passed
    assert report.errors and all(message in e for e in report.errors), report.errors
    assert any(r.family == "protocol" and r.grade == "fail" for r in report.results)
    Report.from_json(report.to_json())  # the report stays serialisable


def test_numpy_output_is_accepted(table):
    report = check_decoder(Broken(table, "numpy"), table, seed=1, alpha=ALPHA, num_samples=300, max_new_tokens=3)
    assert report.verdict == "pass" and not report.errors, _describe(report)


class BadTarget:
    def __init__(self, model, how):
        self.model, self.how = model, how

    def next_token_probs(self, prefix):
        if self.how == "raises" and prefix.shape[1] > 4:
            raise ValueError("context too long")
        probs = self.model.next_token_probs(prefix)
        return probs * 2 if self.how == "unnormalised" else probs


@pytest.mark.parametrize("how", ["raises", "unnormalised"])
def test_target_errors_are_reported(table, how):
    report = check_decoder(
        TableSampler(table),
        BadTarget(table, how),
        seed=1,
        alpha=ALPHA,
        num_samples=64,
        max_new_tokens=3,
        prompts=[[1, 2, 3]],
    )
    assert report.verdict == "error" and report.errors and "target" in report.errors[0], report.errors


def test_invalid_arguments(table):
    dec = TableSampler(table)
    with pytest.raises(InvalidArgument, match="tier"):
        check_decoder(dec, table, tier="huge")
    with pytest.raises(InvalidArgument, match="alpha"):
        check_decoder(dec, table, alpha=2.0)
    with pytest.raises(InvalidArgument, match="seed"):
        check_decoder(dec, table, seed=-1)
    with pytest.raises(InvalidArgument, match="target"):
        check_decoder(dec, None)
    with pytest.raises(InvalidArgument, match="generate"):
        check_decoder(object(), table)
    with pytest.raises(InvalidArgument, match="prompts"):
        check_decoder(dec, table, prompts=[[1, 99]])
    with pytest.raises(InvalidArgument, match="greedy"):
        check_decoder(dec, table, greedy="yes")


def test_progress_and_prompt_override(table):
    calls = []
    report = check_decoder(
        TableSampler(table),
        table,
        seed=2,
        alpha=ALPHA,
        num_samples=300,
        max_new_tokens=3,
        prompts=[[1, 2], [3]],
        progress=lambda done, total, name: calls.append((done, total, name)),
    )
    assert [s["prompt"] for s in report.scenarios] == [[1, 2], [3]]
    assert calls and calls[-1][0] == calls[-1][1] == 6 and all(d <= t for d, t, _ in calls)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_prefix_ids_identify_prefixes(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    V = data.draw(st.integers(2, 5))
    N, L = data.draw(st.integers(1, 30)), data.draw(st.integers(1, 5))
    tokens = torch.randint(0, V, (N, L), generator=torch.Generator().manual_seed(seed))
    ids = prefix_ids(tokens, V)
    for d in range(L):
        for a in range(N):
            for b in range(N):
                same = torch.equal(tokens[a, :d], tokens[b, :d])
                assert (ids[a, d] == ids[b, d]).item() == same


def test_derived_seeds_and_prompts_are_stable():
    assert derive_seed(0, 1, 0) == derive_seed(0, 1, 0) != derive_seed(0, 1, 1)
    a, b = make_prompts(3, 50, seed=7), make_prompts(3, 50, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and all(int(x.max()) < 50 for x in a)


# ------------------------------------------------------------------ the reference speculative decoder
@pytest.fixture(scope="module")
def tiny_pair():
    return make_pair(vocab_size=32, seed=3, d_model=32, n_layers=2, n_heads=2, draft_layers=1)


PROCESSED = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05)


def test_reference_decoder_with_processors_passes_smoke(tiny_pair):
    target, drafter = tiny_pair
    report = check_decoder(
        SpeculativeDecoder(target, drafter, k=3, sampling=PROCESSED),
        TargetAdapter(target, PROCESSED),
        tier="smoke",
        seed=0,
        alpha=ALPHA,
    )
    assert report.verdict == "pass" and not report.errors, _describe(report)
    assert all(s["k"] == 3 for s in report.scenarios)


#: Each engine's penalties (and llama.cpp's window, bias and cuts before its temperature).
PENALISED_LAWS = {
    "vllm": PENALISED,
    "llama.cpp": SamplingConfig(temperature=0.8, top_k=12, top_p=0.95, min_p=0.05, engine="llama.cpp",
                                repetition_penalty=1.3, frequency_penalty=0.3, presence_penalty=0.2,
                                logit_bias={3: 2.0, 5: -1.0}, penalty_last_n=4),
    "hf": SamplingConfig(repetition_penalty=1.4),
}  # fmt: skip


@pytest.mark.parametrize("engine", [*("vllm", "llama.cpp"), pytest.param("hf", marks=pytest.mark.slow)])
def test_reference_decoder_with_each_engines_penalties_passes_smoke(tiny_pair, engine):
    """Drafts before a position count in its penalties, for the drafter and the verification pass alike."""
    target, drafter = tiny_pair
    sampling = PENALISED_LAWS[engine]
    report = check_decoder(
        SpeculativeDecoder(target, drafter, k=3, sampling=sampling),
        TargetAdapter(target, sampling),
        tier="smoke",
        seed=0,
        alpha=ALPHA,
        num_samples=1000,
    )
    assert report.verdict == "pass" and not report.errors, _describe(report)


def test_direct_sampling_under_penalties_matches_the_teacher_forced_laws(tiny_pair):
    target, _ = tiny_pair
    report = check_decoder(DirectSampler(target, PENALISED), TargetAdapter(target, PENALISED), seed=2, alpha=ALPHA,
                           num_samples=1000, max_new_tokens=6)  # fmt: skip
    assert report.verdict == "pass" and not report.errors, _describe(report)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.3, top_p=0.8)])
def test_reference_decoder_passes_smoke_more_configs(tiny_pair, sampling):
    target, drafter = tiny_pair
    report = check_decoder(
        SpeculativeDecoder(target, drafter, k=2, sampling=sampling),
        TargetAdapter(target, sampling),
        tier="smoke",
        seed=1,
        alpha=ALPHA,
    )
    assert report.verdict == "pass" and not report.errors, _describe(report)


@pytest.mark.parametrize("mutant", [m for m in DECODER_MUTANTS if m.lossy], ids=lambda m: m.name)
def test_decoder_mutants_fail_smoke(tiny_pair, mutant):
    target, drafter = tiny_pair
    decoder = make_decoder_mutant(mutant.name, target, drafter, k=3)
    report = check_decoder(decoder, TargetAdapter(target, mutant.config), tier="smoke", seed=0, alpha=ALPHA)
    assert report.verdict == "fail" and not report.errors, (
        f"decoder mutant {mutant.name} ({mutant.provenance}) not detected:\n{_describe(report)}"
    )


@pytest.mark.slow
def test_stale_context_drafter_is_lossless(tiny_pair):
    target, drafter = tiny_pair
    (mutant,) = [m for m in DECODER_MUTANTS if m.name == "stale_context"]
    report = check_decoder(
        make_decoder_mutant(mutant.name, target, drafter, k=3),
        TargetAdapter(target, mutant.config),
        tier="smoke",
        seed=0,
        alpha=ALPHA,
    )
    assert report.verdict == "pass", _describe(report)


def test_mutant_catalogue_entries():
    names = {m.name for m in DECODER_MUTANTS}
    assert {"kv_not_rolled_back", "topk_not_in_reported_q", "target_unprocessed", "stale_context"} <= names
    by = {m.name: m for m in DECODER_MUTANTS}
    assert by["target_unprocessed"].provenance == "vLLM #9834" and by["kv_not_rolled_back"].provenance == "classic"
    with pytest.raises(InvalidArgument, match="name"):
        make_decoder_mutant("nope", None, None, k=1)


class FlipOneToken:
    """Wraps a decoder and changes one token of row 3 (a planted greedy bug)."""

    def __init__(self, inner):
        self.inner, self.vocab_size = inner, inner.vocab_size

    def generate(self, prompt, **kwargs):
        out = self.inner.generate(prompt, **kwargs).clone()
        out[3, 2] = (out[3, 2] + 1) % self.vocab_size
        return out


def test_greedy_decoders_are_checked_exactly(tiny_pair):
    target, drafter = tiny_pair
    small = dict(seed=0, alpha=ALPHA, num_samples=64, max_new_tokens=10)
    # temperature 0 through the stochastic verifier: auto-detected one-hot laws -> support + greedy tests
    report = check_decoder(
        SpeculativeDecoder(target, drafter, k=3, sampling=GREEDY), TargetAdapter(target, GREEDY), **small
    )
    assert report.verdict == "pass" and {r.family for r in report.results} == {"protocol", "support", "greedy"}
    # greedy verification of a T=1 target: greedy=True compares with the argmax continuation
    dec = SpeculativeDecoder(target, drafter, k=3, greedy=True)
    report = check_decoder(dec, TargetAdapter(target), greedy=True, **small)
    assert report.verdict == "pass" and any(r.family == "greedy" for r in report.results), _describe(report)
    bad = check_decoder(FlipOneToken(dec), TargetAdapter(target), greedy=True, **small)
    failed = [r for r in bad.results if r.family == "greedy" and r.grade == "fail"]
    assert bad.verdict == "fail" and failed and failed[0].details["mismatched_rows"] == 1
    assert failed[0].details["first_row"] == 3 and failed[0].details["first_position"] == 3


# ------------------------------------------------------------------ two-sample mode
@pytest.mark.parametrize("planted", [False, True], ids=["direct_vs_direct", "temperature_mismatch"])
def test_two_sample_mode(tiny_pair, planted):
    target, _ = tiny_pair
    reference = DirectSampler(target, SamplingConfig(temperature=0.7))
    decoder = DirectSampler(target, SamplingConfig(temperature=1.0 if planted else 0.7))
    report = check_decoder(decoder, None, reference=reference, seed=4, alpha=ALPHA, num_samples=1500, max_new_tokens=4)
    assert not report.errors and {r.family for r in report.results} == {"two_sample", "protocol"}
    assert all(s["reference_n"] == 4 * s["n"] for s in report.scenarios)
    assert report.verdict == ("fail" if planted else "pass"), _describe(report)


# ------------------------------------------------------------------ command line (factories used by the CLI test)
def table_target():
    return markov(V_TABLE, "peaked", seed=11)


def table_decoder(how: str = ""):
    return Broken(table_target(), how) if how else TableSampler(table_target())


def test_cli_audit_decoder_writes_a_report(tmp_path):
    from specverify.cli import main
    from specverify.report import load_report

    common = ["--target", f"{__name__}:table_target", "--no-plots", "--seed", "2"]
    assert main(["audit", "--decoder", f"{__name__}:table_decoder", *common, "--out", str(tmp_path / "ok")]) == 0
    report = load_report(tmp_path / "ok")
    assert report.kind == "decoder" and report.verdict == "pass" and report.command.startswith("specverify audit")
    assert (tmp_path / "ok" / "report.md").read_text().strip()
    broken = [
        "audit",
        "--decoder",
        f"{__name__}:table_decoder",
        "--decoder-option",
        "how=out_of_vocab",
        *common,
        "--out",
        str(tmp_path / "bad"),
    ]
    assert main(broken) == 2
    assert "outside the vocabulary" in load_report(tmp_path / "bad").errors[0]

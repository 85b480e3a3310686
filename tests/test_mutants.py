"""The verifier mutation catalogue: every mutant is lossy where its ``needs`` says, every
equivalent variant is not.

Scenarios are order-1 Markov target/draft tables (``V`` tokens, start token 0): the
verifier gets, per row, the target conditionals along the drafted prefix, exactly as a
decoder would pass them.  Under a lossless verifier the token at emitted position j,
given the emitted prefix (and that position j is emitted), has law ``M[prev]`` with prev
the previous emitted token.  The check counts (prev, token) pairs per position over the
rows of ONE verifier call (100k for mutants, 200k for equivalent variants) and runs a
Pearson chi-square on cells pooled to expected counts >= 5 (p-sorted within each prev);
an emitted token with target probability 0 or an out-of-protocol ``num_emitted`` is a
certain failure.  Positions are combined with Bonferroni.  Mutants must fail at alpha
1e-9, equivalent variants pass at alpha 1e-7; all seeds are fixed, so the outcomes are
deterministic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from specverify import stats
from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.mutants import CATALOGUE, CatalogueEntry, by_name, entries
from specverify.mutants import steps as S
from specverify_reference.rules import verify as reference_verify

ALPHA_MUTANT = 1e-9
ALPHA_EQUIVALENT = 1e-7
B = 200_000  # rows per equivalence check (100k on the V = 32 scenario "tail")
B_MUTANT = 100_000  # rows per power check (every mutant's p-value is < 1e-15 at 50k)


# ---------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    target: torch.Tensor  # (V, V) float64: target[s] = p(. | prev = s)
    draft: torch.Tensor  # (V, V) float64: draft[s] = q(. | prev = s)
    K: int

    @property
    def V(self) -> int:
        return self.target.shape[0]


def _softmax_rows(logits):
    return torch.softmax(logits.double(), -1)


def _scenario(name: str) -> Scenario:
    g = torch.Generator().manual_seed(1234)
    V, K = 8, 3
    if name == "iid":  # context-free: the same p and q at every position
        p = _softmax_rows(torch.randn(V, generator=g)).expand(V, V).clone()
        q = _softmax_rows(torch.randn(V, generator=g)).expand(V, V).clone()
    elif name == "markov":  # context-dependent p, a drafter that roughly follows it
        logits = 1.5 * torch.randn(V, V, generator=g)
        p = _softmax_rows(logits)
        q = _softmax_rows(logits + 1.0 * torch.randn(V, V, generator=g))
    elif name == "truncated":  # top-4 target (zeros), full-support drafter
        logits = 1.5 * torch.randn(V, V, generator=g)
        keep = logits >= logits.topk(4, dim=-1).values[:, -1:]
        p = _softmax_rows(logits.masked_fill(~keep, -torch.inf))
        q = _softmax_rows(logits + 1.0 * torch.randn(V, V, generator=g))
    elif name == "onehot":  # deterministic drafter: q one-hot on a random token per context
        p = _softmax_rows(1.5 * torch.randn(V, V, generator=g))
        q = torch.nn.functional.one_hot(torch.randint(0, V, (V,), generator=g), V).double()
    elif name == "tail":  # V = 32, context-free, peaked: 15 target tokens of mass < 2e-3
        V = 32
        p = _softmax_rows(4.0 * torch.randn(V, generator=g)).expand(V, V).clone()
        q = _softmax_rows(4.0 * torch.randn(V, generator=g)).expand(V, V).clone()
    elif name == "padded":  # ids 6 and 7 are padding (p = 0 in every context), q has full support
        logits = 1.5 * torch.randn(V, V, generator=g)
        p = _softmax_rows(logits.index_fill(1, torch.tensor([6, 7]), -torch.inf))
        q = _softmax_rows(logits + 1.0 * torch.randn(V, V, generator=g))
    elif name == "subset":  # a reduced draft vocabulary: q only on the scattered ids 1, 3, 4, 6
        logits = 1.5 * torch.randn(V, V, generator=g)
        p = _softmax_rows(logits)
        cold = torch.tensor([0, 2, 5, 7])
        q = _softmax_rows((logits + 1.0 * torch.randn(V, V, generator=g)).index_fill(1, cold, -torch.inf))
    elif name == "iid_k1":
        p = _softmax_rows(torch.randn(V, generator=g)).expand(V, V).clone()
        q = _softmax_rows(torch.randn(V, generator=g)).expand(V, V).clone()
        K = 1
    else:
        raise KeyError(name)
    return Scenario(name, p, q, K)


SCENARIOS = {n: _scenario(n) for n in ("iid", "markov", "truncated", "onehot", "tail", "iid_k1", "padded", "subset")}


def make_inputs(sc: Scenario, n_rows: int, generator: torch.Generator):
    """Draft K tokens per row from the draft chain; target rows along the drafted prefix."""
    prev = torch.zeros(n_rows, dtype=torch.long)  # (B,) start token 0
    targets, drafts, tokens = [], [], []
    for _ in range(sc.K):
        q = sc.draft[prev]  # (B, V)
        x = sample(q, generator=generator, check=False)  # (B,)
        targets.append(sc.target[prev])
        drafts.append(q)
        tokens.append(x)
        prev = x
    targets.append(sc.target[prev])
    return torch.stack(targets, 1), torch.stack(drafts, 1), torch.stack(tokens, 1)  # (B,K+1,V) (B,K,V) (B,K)


def _pooled_chi2(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson statistic and df for one prev row: cells in decreasing expected order, pooled to E >= 5."""
    order = np.argsort(-expected, kind="stable")
    obs_bins, exp_bins, o_acc, e_acc = [], [], 0.0, 0.0
    for i in order:
        if expected[i] <= 0:
            continue
        o_acc += counts[i]
        e_acc += expected[i]
        if e_acc >= 5.0:
            obs_bins.append(o_acc)
            exp_bins.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc > 0:
        if exp_bins:
            obs_bins[-1] += o_acc
            exp_bins[-1] += e_acc
        else:
            obs_bins, exp_bins = [o_acc], [e_acc]
    o, e = np.asarray(obs_bins), np.asarray(exp_bins)
    return float(((o - e) ** 2 / e).sum()), len(o) - 1


@dataclass(frozen=True)
class LawCheck:
    pvalue: float  # Bonferroni-adjusted over positions; 0.0 on support/protocol violations
    per_position: tuple
    violation: str

    def __str__(self):
        return f"adjusted p={self.pvalue:.3g} per position={self.per_position} {self.violation}"


def law_check(sc: Scenario, tokens: torch.Tensor, num_emitted: torch.Tensor) -> LawCheck:
    """Test the emitted tokens' conditional laws at every block position against the target chain."""
    n_rows, K, V = tokens.shape[0], sc.K, sc.V
    if tokens.shape != (n_rows, K + 1) or num_emitted.shape != (n_rows,):
        return LawCheck(0.0, (), f"bad shapes {tuple(tokens.shape)} {tuple(num_emitted.shape)}")
    if bool(((num_emitted < 1) | (num_emitted > K + 1)).any()):
        return LawCheck(0.0, (), f"num_emitted outside [1, K+1]: {num_emitted.unique().tolist()}")
    if bool(((tokens < 0) | (tokens >= V)).any()):
        return LawCheck(0.0, (), "out-of-vocabulary token")
    target = sc.target.numpy()
    # counts[j, prev, tok] over the rows that emit position j, in one bincount.
    tokens = tokens.long()
    prev = torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], dim=1)  # (B, K+1)
    keys = torch.arange(K + 1) * V * V + prev * V + tokens  # (B, K+1)
    emitted = torch.arange(K + 1)[None] < num_emitted[:, None]  # (B, K+1)
    counts = torch.bincount(keys[emitted], minlength=(K + 1) * V * V).reshape(K + 1, V, V).numpy().astype(float)
    pvalues = []
    for j in range(K + 1):
        if (counts[j][target == 0] > 0).any():
            return LawCheck(0.0, tuple(pvalues), f"support violation at position {j}")
        stat, df = 0.0, 0
        for s_prev in range(V):
            n_s = counts[j, s_prev].sum()
            if n_s == 0:
                continue
            s_stat, s_df = _pooled_chi2(counts[j, s_prev], n_s * target[s_prev])
            stat, df = stat + s_stat, df + s_df
        pvalues.append(float(sps.chi2.sf(stat, df)) if df > 0 else 1.0)
    return LawCheck(min(1.0, min(pvalues) * (K + 1)), tuple(f"{p:.2g}" for p in pvalues), "")


@functools.lru_cache(maxsize=8)
def cached_inputs(scenario: str, seed: int, n_rows: int):
    """Inputs shared by every check of one (scenario, seed); verifiers never modify their inputs."""
    return make_inputs(SCENARIOS[scenario], n_rows, torch.Generator().manual_seed(seed))


def run_check(entry: CatalogueEntry, scenario: str, seed: int = 0, n_rows: int = B) -> LawCheck:
    target, draft, tokens = cached_inputs(scenario, seed, n_rows)
    out, n = entry.fn(target, draft, tokens, generator=torch.Generator().manual_seed(10_000 + seed))
    return law_check(SCENARIOS[scenario], out, n)


# The scenario on which each catalogued mutant is shown lossy (matching its ``needs``).
WITNESS = {
    "q_unscattered": "subset",
    "padding_unmasked": "padded",
    "always_accept": "iid",
    "inverted_ratio": "iid",
    "residual_softmax": "iid",
    "residual_is_p": "iid",
    "residual_unnormalised_icdf": "iid",
    "pointmass_accept": "iid",
    "argmax_match": "iid",
    "bonus_from_residual": "iid",
    "bonus_wrong_row": "markov",
    "shared_uniform": "iid",
    "first_unverified": "iid",
    "late_rejection": "markov",
    "continue_after_reject": "iid",
    "batch_row_mix": "iid",
    "typical_accept": "iid",
    "ensemble": "iid",
    "residual_next_row": "markov",
    "target_row_shift": "markov",
    "resample_and_continue": "markov",
    "residual_bf16_cdf": "tail",
    "uniform_bf16_le": "truncated",
    "residual_overflow_first": "iid",
    "reuse_accept_uniform": "iid",
    "rows_share_uniforms": "iid",
    "emitted_plus_one": "iid",
    "emitted_drop_last": "iid",
    "uniforms_reuse_rejected": "iid",
    "tile_wrapped_rng": "iid",  # 100k rows share 64 sets of uniforms: one call's histogram is overdispersed
    "rejection_index_wrong_row": "iid",
    "batch_over_64": "iid",
}

# Mutants whose every row is marginally exact: shown by the joint law of pairs of rows of one call
# (first tokens, laws p_1 of the start context), the pair class that sees them.
# Mutants whose effect lives only in a real vocabulary's tail (CatalogueEntry.tokens_to_detect):
# their mechanism and measured effect are tested in tests/test_mutants_vocab.py, not here.
BELOW_TIER_WITNESSED = {"residual_fp32_running_cdf", "residual_fp32_exponential"}
PAIR_WITNESS = {"neighbour_scratch": ("iid", "adjacent"), "tile_wrapped_rng": ("iid", "lag64")}

# Scenarios on which each equivalent variant must be indistinguishable from the target.
EQUIVALENT_ON = {
    "canonical": ("markov", "tail"),
    "uniforms_in_canonical": ("markov", "tail"),
    "accept_le": ("truncated", "onehot"),  # p(x) = 0 drafts, p(x) = q(x) = 1 drafts
    "sample_and_match": ("onehot", "markov"),  # law exact for any q (acceptance differs, see below)
    "pointmass_fallback": ("onehot", "markov"),  # idem
    "exponential_race": ("markov", "truncated", "tail"),
    "residual_over_overlap": ("iid", "truncated"),
    "no_bonus": ("markov",),
    "permuted_rows": ("markov", "tail"),
    "tiled_rows": ("markov", "tail"),
}

# Scenarios outside a mutant's ``needs`` on which it is (provably) lossless: the needs are necessary.
LOSSLESS_OUTSIDE_NEEDS = [
    ("bonus_wrong_row", "iid"),  # p_K == p_{K+1} when p is position-independent
    ("residual_next_row", "iid"),
    ("target_row_shift", "iid"),
    ("resample_and_continue", "iid"),  # later targets do not depend on the replaced draft
    ("pointmass_accept", "onehot"),  # the point-mass assumption is true (q = onehot(x): both steps agree)
    ("shared_uniform", "iid_k1"),  # one position: nothing to share
    ("continue_after_reject", "iid_k1"),
    ("emitted_drop_last", "iid_k1"),  # K = 1: position 0 is always right, position 1 is never emitted
]


# ---------------------------------------------------------------- catalogue structure


VERIFIER_ENTRIES = entries(subject="verifier")


def test_catalogue_is_complete_and_well_formed():
    names = [e.name for e in CATALOGUE]
    assert len(names) == len(set(names))
    mutants = {e.name for e in entries("verifier")}
    equivalents = {e.name for e in entries("equivalent")}
    witnessed = set(WITNESS) | set(PAIR_WITNESS) | BELOW_TIER_WITNESSED
    assert mutants == witnessed, f"mutants without a witness scenario here: {mutants ^ witnessed}"
    assert BELOW_TIER_WITNESSED == {e.name for e in entries("verifier") if e.tokens_to_detect}
    assert equivalents == set(EQUIVALENT_ON)
    bugs_md = {
        "always_accept",
        "inverted_ratio",
        "residual_softmax",
        "residual_is_p",
        "residual_unnormalised_icdf",
        "pointmass_accept",
        "argmax_match",
        "bonus_from_residual",
        "bonus_wrong_row",
        "shared_uniform",
        "first_unverified",
        "late_rejection",
        "continue_after_reject",
        "batch_row_mix",
        "typical_accept",
        "ensemble",
    }
    assert bugs_md <= mutants
    for e in CATALOGUE:
        assert e.description and e.provenance and callable(e.fn), e
    for e in VERIFIER_ENTRIES:
        assert (e.kind == "verifier") == bool(e.needs) == e.lossy, e.name
    assert {e.subject for e in CATALOGUE} == {"verifier", "drafter", "decoder", "tree"}
    assert entries(subject="verifier") == entries("verifier") + entries("equivalent")
    assert by_name("ensemble").kind == "verifier"
    with pytest.raises(InvalidArgument, match="nope"):
        by_name("nope")
    with pytest.raises(InvalidArgument, match="kind"):
        entries("drafter?")
    with pytest.raises(InvalidArgument, match="kind"):
        CatalogueEntry("x", "bogus", lambda: None, "d", "p")


def assert_same_blocks(a, b):
    """Equal num_emitted and equal tokens up to num_emitted (entries past it are ignored by the protocol)."""
    assert torch.equal(a[1], b[1])
    valid = torch.arange(a[0].shape[1])[None] < a[1][:, None]  # (B, K+1)
    assert torch.equal(a[0][valid], b[0][valid])


def test_default_chain_is_the_reference_token_for_token():
    sc = SCENARIOS["markov"]
    g = torch.Generator().manual_seed(7)
    target, draft, tokens = make_inputs(sc, 5000, g)
    a = S.chain(target, draft, tokens, generator=torch.Generator().manual_seed(3))
    b = reference_verify(target, draft, tokens, generator=torch.Generator().manual_seed(3))
    assert_same_blocks(a, b)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_default_chain_matches_reference_on_random_shapes(data):
    seed = data.draw(st.integers(0, 2**32 - 1))
    n_rows, K, V = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 9))
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(3 * torch.randn(n_rows, K + 1, V, generator=g), -1)
    draft = torch.softmax(3 * torch.randn(n_rows, K, V, generator=g), -1)
    tokens = sample(draft, generator=g)
    a = S.chain(target, draft, tokens, generator=torch.Generator().manual_seed(seed))
    b = reference_verify(target, draft, tokens, generator=torch.Generator().manual_seed(seed))
    assert_same_blocks(a, b)


@pytest.mark.parametrize("entry", entries(subject="verifier"), ids=lambda e: e.name)
def test_protocol_shapes_and_determinism(entry):
    sc = SCENARIOS["markov"]
    target, draft, tokens = make_inputs(sc, 64, torch.Generator().manual_seed(11))
    out1 = entry.fn(target.float(), draft.float(), tokens, generator=torch.Generator().manual_seed(5))
    out2 = entry.fn(target.float(), draft.float(), tokens, generator=torch.Generator().manual_seed(5))
    for out in (out1, out2):
        assert out[0].shape == (64, sc.K + 1) and out[0].dtype == torch.long
        assert out[1].shape == (64,) and out[1].dtype == torch.long
        assert bool(((out[0] >= 0) & (out[0] < sc.V)).all())
    assert torch.equal(out1[0], out2[0]) and torch.equal(out1[1], out2[1])
    with pytest.raises(InvalidArgument):
        entry.fn(target, draft[:, :1], tokens, generator=torch.Generator())
    with pytest.raises(InvalidArgument, match="generator"):
        entry.fn(target, draft, tokens, generator=None)


# ---------------------------------------------------------------- power and equivalence


@pytest.mark.parametrize("name", sorted(WITNESS))
def test_mutant_is_lossy_on_its_witness_scenario(name):
    scenario, n_rows = WITNESS[name], B_MUTANT
    result = run_check(by_name(name), scenario, n_rows=n_rows)
    assert result.pvalue < ALPHA_MUTANT, (
        f"mutant {name} not distinguishable from the target on scenario {scenario!r} "
        f"(needs: {by_name(name).needs}); {result}; N={n_rows}, seed=0"
    )


def pair_check(entry: CatalogueEntry, scenario: str, pairs: str, seed: int = 0, n_rows: int = B_MUTANT):
    """The dependence test on one call's first tokens, for the pairs of rows of class ``pairs``."""
    target, draft, tokens = cached_inputs(scenario, seed, n_rows)
    out, _ = entry.fn(target, draft, tokens, generator=torch.Generator().manual_seed(10_000 + seed))
    first_law = SCENARIOS[scenario].target[:1]  # (1, V): every row starts from token 0
    a, b = stats.call_pairs(n_rows, generator=torch.Generator().manual_seed(seed))[pairs]
    zeros = np.zeros(a.size, dtype=np.int64)
    return stats.pair_dependence_test(first_law, zeros, out[a, 0], zeros, out[b, 0], alpha=ALPHA_MUTANT)


@pytest.mark.parametrize("name", sorted(PAIR_WITNESS))
def test_row_dependence_mutant_is_seen_by_its_pairs(name):
    scenario, pairs = PAIR_WITNESS[name]
    result = pair_check(by_name(name), scenario, pairs)
    assert result.pvalue < ALPHA_MUTANT, f"{name}: rows not seen dependent by pairs {pairs!r}: {result}"


@pytest.mark.parametrize("name", ["canonical", "permuted_rows", "tiled_rows"])
def test_row_pairs_of_a_correct_verifier_are_independent(name):
    for pairs in ("adjacent", "lag64", "random"):
        result = pair_check(by_name(name), "markov", pairs, seed=1)
        assert result.pvalue > ALPHA_EQUIVALENT, f"{name}: pairs {pairs!r} look dependent: {result}"


@pytest.mark.parametrize("name,scenario", [(n, s) for n, ss in EQUIVALENT_ON.items() for s in ss])
def test_equivalent_variant_is_indistinguishable(name, scenario):
    n_rows = B_MUTANT if scenario == "tail" else B
    result = run_check(by_name(name), scenario, seed=1, n_rows=n_rows)
    assert result.pvalue > ALPHA_EQUIVALENT, (
        f"equivalent variant {name} rejected on scenario {scenario!r}: {result}; N={n_rows}, seed=1"
    )


@pytest.mark.parametrize("name,scenario", LOSSLESS_OUTSIDE_NEEDS)
def test_mutant_is_lossless_outside_its_needs(name, scenario):
    result = run_check(by_name(name), scenario, seed=2, n_rows=B_MUTANT)
    assert result.pvalue > ALPHA_EQUIVALENT, (
        f"{name} was expected lossless on {scenario!r} (outside its needs: {by_name(name).needs}): {result}"
    )


def test_law_check_has_power_and_calibration():
    """The checker itself: the reference passes on several seeds; a 2% planted shift is caught."""
    for seed in (10, 11):
        assert run_check(by_name("canonical"), "markov", seed=seed, n_rows=B_MUTANT).pvalue > 1e-4
    sc = SCENARIOS["iid"]
    target, draft, tokens = cached_inputs("iid", 0, B_MUTANT)
    g = torch.Generator().manual_seed(3)
    out, n = reference_verify(target, draft, tokens, generator=g)
    planted = out.clone()
    flip = torch.rand(B_MUTANT, generator=g) < 0.02
    planted[flip, 0] = 0
    assert law_check(sc, planted, n).pvalue < ALPHA_MUTANT


def test_match_schemes_accept_at_rate_sum_pq():
    """The documented restriction of sample_and_match / pointmass_fallback: with a stochastic q the law
    is exact (tests above) but the first-position acceptance rate is sum p q, not the canonical
    sum min(p, q) (6 sigma agreement, > 20 sigma gap; N = 100k, fixed seeds)."""
    sc = SCENARIOS["iid"]
    target, draft, tokens = cached_inputs("iid", 0, B_MUTANT)
    p, q = sc.target[0], sc.draft[0]
    se = (0.25 / B_MUTANT) ** 0.5
    for name in ("sample_and_match", "pointmass_fallback"):
        _, n = by_name(name).fn(target, draft, tokens, generator=torch.Generator().manual_seed(4))
        rate = (n > 1).double().mean().item()
        assert abs(rate - float((p * q).sum())) < 6 * se, name
        assert float(torch.minimum(p, q).sum()) - rate > 20 * se, name
    _, n = by_name("canonical").fn(target, draft, tokens, generator=torch.Generator().manual_seed(4))
    assert abs((n > 1).double().mean().item() - float(torch.minimum(p, q).sum())) < 6 * se

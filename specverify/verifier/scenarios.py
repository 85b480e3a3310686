"""Named scenarios of the verifier battery, and which catalogued bug each exposes.

A :class:`Scenario` fixes a target table model, a drafter from the zoo
(:mod:`specverify.verifier.zoo`), the draft length K, the batch size, the sequence
length and the number of batches (per tier).  Tables are seeded from the
scenario's name only, so a scenario is the same object in every run; the run's
sampling seed is derived from ``(seed, name)`` by :func:`scenario_seed`.

Which scenario exposes which verifier bug of ``docs/bugs.md`` (the
mutants the smoke tier must catch; most bugs are seen by several scenarios):

=============================  ====================================================================
bug class                      exposed by (what makes it visible)
=============================  ====================================================================
always_accept                  pos8_uniform_k4, pos32_anti_inverse_k4 (q far from p), pos32_onehot_noisy_k4 (support)
inverted_ratio                 pos8_uniform_k4, pos32_anti_inverse_k4 (any p != q)
residual_softmax               pos8_uniform_k4, pos32_topk_disjoint_k4 (residual = p exactly; softmax flattens it)
residual_is_p                  pos8_uniform_k4, pos16_noisy_k1 (residual != p whenever q overlaps p)
residual_unnormalised_icdf     pos32_adversary_k4 (residual mass ~eps: u beyond it overflows to the last id)
pointmass_accept               pos8_uniform_k4, markov8_temperature_k2 (stochastic drafter)
argmax_match                   pos8_uniform_k4, pos32k_zipf_temperature_k2 (T > 0)
bonus_from_residual            pos16_noisy_k1 (K = 1, high acceptance: the all-accept path is frequent)
bonus_wrong_row                pos16_noisy_k1 (position-dependent rows), markov8_temperature_k2
shared_uniform                 pos8_uniform_k4, markov16_topp_anti_complement_k8 (K >= 2)
first_unverified               pos8_uniform_k4, pos32_topk_disjoint_k4 (every draft should be rejected)
late_rejection                 markov8_temperature_k2, ngram3_v6_stale_k4 (K >= 2, context-dependent p)
continue_after_reject          pos8_uniform_k4, markov16_topp_anti_complement_k8 (K >= 2)
batch_row_mix                  pos8_uniform_k4 (B > 1, rows reject at different positions; collision test)
tile_wrapped_rng               every B > 64 scenario, pos8_boundary129_uniform_k2 (pair test at offset 64)
neighbour_scratch              every scenario with B >= 2 (pair test of adjacent rows)
batch_over_64                  every scenario whose calls exceed 64 rows
typical_accept                 pos8_uniform_k4, pos256_flat_argmax_k4
ensemble                       pos8_uniform_k4, pos32_anti_inverse_k4
p == q corner                  markov4_oracle_k8 (every draft accepted; bonus after K = 8)
one-hot q (deterministic)      pos2_least_likely_k2, pos256_flat_argmax_k4 (sample-and-match territory)
temperature 0 target           pos32_onehot_noisy_k4 (support test: any non-argmax token fails)
truncated targets (zeros)      pos32_topk_disjoint_k4, markov16_topp_anti_complement_k8
near-degenerate values         markov12_dirichlet_noisy_k4 (Dirichlet(0.3) rows)
large vocabulary               pos32k_zipf_temperature_k2 (V = 32768, pooled bins, small B)
padding_unmasked               pos151936_lm_padding_leak_k2 (support: any emitted padding id fails)
q_unscattered                  pos128256_lm_hot_set_k2 (q read at target ids from the compact draft row)
residual_fp32_running_cdf      pos151936_lm_padding_leak_k2 (long tail; below the smoke tier: tokens_to_detect)
residual_fp32_exponential      pos151936_lm_padding_leak_k2 (tail below 2^-24; below the smoke tier: tokens_to_detect)
=============================  ====================================================================

Tiers scale the number of batches: ``smoke`` (every pull request, <= 60 s on 2 CPU
cores), ``standard`` (x ``TIER_SCALE["standard"]``, nightly, minimum detectable TV
~0.01 per stratum), ``deep`` (x ``TIER_SCALE["deep"]``, sized for a GPU).

Greedy scenarios (:data:`GREEDY_SCENARIOS`) feed verifiers rows with exact ties
in the argmax, one-hot rows and deterministic / stochastic drafters; the expected
output is :func:`reference.rules.greedy_verify` (ties to the lowest token id).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from specverify.core import portable, tables
from specverify.core.errors import InvalidArgument
from specverify.core.seeds import scenario_seed
from specverify.verifier import zoo

__all__ = ["Scenario", "SCENARIOS", "GREEDY_SCENARIOS", "TIER_SCALE", "TIERS", "scenario_seed", "get_scenarios"]

TIERS = ("smoke", "standard", "deep")
#: Number-of-batches multiplier per tier, times the scenario's own ``groups``.  Measured on
#: 2 idle CPU cores with the canonical rule: smoke ~14 s (median detectable binned TV ~0.022),
#: standard ~2 min (~0.0055); deep (~0.001) is sized for an accelerator.
#: Scenarios with at most this many tokens carry the first table rows in their config (reports show them).
PREVIEW_MAX_VOCAB = 32
TIER_SCALE = {"smoke": 4, "standard": 64, "deep": 2048}


@dataclass(frozen=True)
class Scenario:
    """One configuration of the battery.

    Attributes
    ----------
    name : str
    target : str
        ``"positional"`` (one row per position, ``positions`` rows), ``"markov"`` or ``"ngram3"``.
    vocab_size : int
    rows : str
        Row kind of the target table (:func:`specverify.core.tables.make_rows`), plus ``"tied"``.
    drafter : str
        Zoo name (:data:`specverify.verifier.zoo.ZOO` or :data:`~specverify.verifier.zoo.SHAPED`).
    k, batch_size, length, groups : int
        Draft length, rows per verify batch, tokens per row, batches in the smoke tier.
    positions : int
        Rows of a positional target.
    row_options, drafter_options : tuple of (key, value)
    exposes : tuple of str
        Bug classes this scenario is meant to expose (documentation and reports).
    """

    name: str
    target: str
    vocab_size: int
    rows: str
    drafter: str
    k: int
    batch_size: int
    length: int
    groups: int = 1
    positions: int = 0
    row_options: tuple = ()
    drafter_options: tuple = ()
    exposes: tuple = ()
    description: str = ""
    tier_scale: tuple = field(default=())  # optional per-tier overrides ((tier, scale), ...)

    def num_groups(self, tier: str) -> int:
        if tier not in TIERS:
            raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
        scale = dict(self.tier_scale).get(tier, TIER_SCALE[tier])
        return max(1, self.groups * scale)

    def build(self):
        """``(target, drafter)`` table models (tables seeded from the name only)."""
        seed = scenario_seed(0, "table/" + self.name)
        opts = dict(self.row_options)
        kind = self.rows
        tied = kind == "tied"
        if tied:
            kind = "peaked"
        V = self.vocab_size
        if self.target == "positional":
            target = tables.positional(V, self.positions or self.length, kind, seed=seed, name=self.name, **opts)
        elif self.target == "markov":
            target = tables.markov(V, kind, seed=seed, name=self.name, **opts)
        elif self.target == "ngram3":
            target = tables.ngram(V, 3, kind, seed=seed, name=self.name, **opts)
        else:
            raise InvalidArgument(f"target must be positional, markov or ngram3, got {self.target!r}")
        if tied:
            target = target.with_table(_tie_top_two(target.table), name=self.name)
        dopts = dict(self.drafter_options)
        if self.drafter in ("noisy", "argmax"):
            dopts.setdefault("seed", scenario_seed(0, "drafter/" + self.name))
        drafter = zoo.make_drafter(self.drafter, target, **dopts)
        return target, drafter

    def config(self, tier: str = "smoke") -> dict:
        data = asdict(self)
        data["row_options"] = dict(self.row_options)
        data["drafter_options"] = dict(self.drafter_options)
        data["exposes"] = list(self.exposes)
        data.pop("tier_scale")
        data["num_groups"] = self.num_groups(tier)
        data["rows_total"] = self.batch_size * self.num_groups(tier)
        if self.vocab_size <= PREVIEW_MAX_VOCAB:  # the laws themselves, for a report's counterexample
            target, drafter = self.build()
            data["target_probs_preview"] = target.table[: self.k + 1].round(decimals=4).tolist()  # (<=K+1, V)
            data["draft_probs_preview"] = drafter.table[: self.k].round(decimals=4).tolist()  # (<=K, V)
        return data


def _tie_top_two(table: torch.Tensor) -> torch.Tensor:
    """Make the two most likely tokens of every row exactly equal (an argmax tie)."""
    top = table.topk(2, -1)
    tied = table.clone()
    tied.scatter_(-1, top.indices[:, 1:], top.values[:, :1])
    return portable.normalise(tied)


S = Scenario
# fmt: off
SCENARIOS: tuple[Scenario, ...] = (
    S("pos8_uniform_k4", "positional", 8, "peaked", "uniform", k=4, batch_size=4096, length=8, groups=3,
      exposes=("always_accept", "inverted_ratio", "residual_softmax", "residual_is_p", "pointmass_accept",
               "argmax_match", "shared_uniform", "first_unverified", "continue_after_reject", "batch_row_mix",
               "typical_accept", "ensemble"),
      description="position-dependent peaked rows, uniform drafter: rows reject at different positions"),
    S("pos16_noisy_k1", "positional", 16, "peaked", "noisy", k=1, batch_size=4096, length=10, groups=2,
      drafter_options=(("sigma", 0.3),),
      exposes=("bonus_from_residual", "bonus_wrong_row", "residual_is_p"),
      description="K=1, drafter close to p: most blocks take the all-accept path and emit a bonus"),
    S("markov8_temperature_k2", "markov", 8, "peaked", "temperature", k=2, batch_size=4096, length=10, groups=3,
      drafter_options=(("tau", 2.0),),
      exposes=("late_rejection", "bonus_wrong_row", "pointmass_accept"),
      description="first-order Markov target, flattened drafter: context-dependent p"),
    S("ngram3_v6_stale_k4", "ngram3", 6, "peaked", "stale", k=4, batch_size=3072, length=12, groups=2,
      exposes=("late_rejection", "continue_after_reject"),
      description="trigram target, drafter conditioned on the previous-but-one context"),
    S("markov4_oracle_k8", "markov", 4, "peaked", "oracle", k=8, batch_size=2048, length=12, groups=2,
      exposes=("p == q corner", "bonus after K=8"),
      description="q = p: every draft is accepted, the residual is never used"),
    S("pos2_least_likely_k2", "positional", 2, "peaked", "least_likely", k=2, batch_size=4096, length=6, groups=2,
      exposes=("one-hot q", "V=2"),
      description="binary vocabulary, deterministic drafter on the least likely token"),
    S("pos32_topk_disjoint_k4", "positional", 32, "topk", "disjoint", k=4, batch_size=4096, length=6, groups=2,
      exposes=("residual_softmax", "first_unverified", "support"),
      description="top-k truncated target, drafter only on p = 0 tokens: every draft must be rejected"),
    S("pos32_onehot_noisy_k4", "positional", 32, "onehot", "noisy", k=4, batch_size=2048, length=6, groups=2,
      drafter_options=(("sigma", 1.0),),
      exposes=("temperature 0", "always_accept", "support"),
      description="one-hot target rows (temperature 0), full-support drafter"),
    S("pos32k_zipf_temperature_k2", "positional", 32768, "zipf", "temperature", k=2, batch_size=64, length=3, groups=4,
      drafter_options=(("tau", 1.5),),
      exposes=("large V", "argmax_match"),
      description="V = 32768 Zipf-like rows, tested at modest N with pooled bins"),
    S("pos151936_lm_padding_leak_k2", "positional", 151936, "lm", "padding_leak", k=2, batch_size=32, length=3,
      groups=4, row_options=(("real_vocab", 151665),), drafter_options=(("real_vocab", 151665), ("mass", 0.05)),
      exposes=("padded vocabulary", "padding_unmasked", "support"),
      description="Qwen3's head width (151,936) over its tokenizer's 151,665 ids: LM-shaped rows, zero mass on the "
                  "271 padding ids, a drafter that puts 5% there"),
    S("pos128256_lm_hot_set_k2", "positional", 128256, "lm", "hot_set", k=2, batch_size=32, length=3, groups=4,
      row_options=(("hot", 32000),), drafter_options=(("size", 32000),),
      exposes=("reduced draft vocabulary", "q_unscattered"),
      description="Llama 3's vocabulary (128,256), a 32,000-id draft vocabulary mapped into it (EAGLE-3 / FR-Spec): "
                  "the target's 3-7% outside it comes only from the residual and the bonus"),
    S("pos32_anti_inverse_k4", "positional", 32, "peaked", "anti_inverse", k=4, batch_size=4096, length=6, groups=2,
      exposes=("always_accept", "inverted_ratio", "ensemble"),
      description="drafter proportional to 1/p: mass where p is small"),
    S("pos32_adversary_k4", "positional", 32, "peaked", "adversary", k=4, batch_size=4096, length=6, groups=3,
      drafter_options=(("eps", 0.15),),
      exposes=("residual_unnormalised_icdf",),
      description="residual (p - q)+ of total mass ~0.15, shaped like p"),
    S("markov16_topp_anti_complement_k8", "markov", 16, "topp", "anti_complement", k=8, batch_size=2048, length=10,
      groups=2, exposes=("shared_uniform", "continue_after_reject", "support"),
      description="top-p truncated Markov target, drafter proportional to 1 - p (mass on p = 0 tokens), K = 8"),
    S("pos256_flat_argmax_k4", "positional", 256, "flat", "argmax", k=4, batch_size=1024, length=6, groups=2,
      exposes=("one-hot q", "typical_accept"),
      description="near-uniform target over 256 tokens, greedy deterministic drafter"),
    S("pos8_boundary129_uniform_k2", "positional", 8, "peaked", "uniform", k=2, batch_size=129, length=6, groups=25,
      exposes=("tile edges: calls of 129 rows shrink through 128, 65, 64, 63 as rows finish", "tile_wrapped_rng",
               "batch_over_64"),
      description="small batches that straddle the 64- and 128-row tile edges, many calls: the pair tests' lags"),
    S("markov12_dirichlet_noisy_k4", "markov", 12, "dirichlet", "noisy", k=4, batch_size=4096, length=8, groups=2,
      row_options=(("concentration", 0.3),), drafter_options=(("sigma", 1.0),),
      exposes=("near-degenerate values",),
      description="Dirichlet(0.3) Markov rows (many near-zero probabilities), noisy drafter"),
)
# fmt: on

# fmt: off
GREEDY_SCENARIOS: tuple[Scenario, ...] = (
    S("greedy_pos16_tied_argmax_k4", "positional", 16, "tied", "argmax", k=4, batch_size=1024, length=8,
      exposes=("argmax ties (lowest id)",), description="exact ties between the two most likely tokens"),
    S("greedy_markov8_noisy_k2", "markov", 8, "peaked", "noisy", k=2, batch_size=1024, length=8,
      exposes=("greedy mismatch path",), description="stochastic drafter, context-dependent target"),
    S("greedy_pos32_onehot_uniform_k8", "positional", 32, "onehot", "uniform", k=8, batch_size=512, length=10,
      exposes=("one-hot rows",), description="one-hot target rows, uniform drafter, K = 8"),
)
# fmt: on


def get_scenarios(names=None, *, greedy: bool = False) -> tuple[Scenario, ...]:
    """The battery's scenarios (or the greedy ones), optionally only those named."""
    pool = GREEDY_SCENARIOS if greedy else SCENARIOS
    if names is None:
        return pool
    by_name = {s.name: s for s in pool}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise InvalidArgument(f"unknown scenario(s) {missing}; known: {sorted(by_name)}")
    return tuple(by_name[n] for n in names)

"""Which scenarios the smoke selftest runs for each catalogue entry.

The full smoke battery takes ~60 s per implementation, too much for ~40 entries in
CI, so in the ``smoke`` tier each verifier mutant runs only on the scenarios that
expose its bug class (``specverify.verifier.scenarios``' docstring table; the first one or two
listed) and each equivalent variant on scenarios its ``requires`` allows.  The
``standard`` tier runs the full battery for every mutant and every scenario that
``requires`` allows for the equivalents.

Mutants not in the scenarios table (specverify's own off-by-one, precision, RNG and
normalisation classes) were mapped here by what makes them visible:

==========================  ===============================  ======================================================
mutant                      smoke scenario                   why
==========================  ===============================  ======================================================
residual_next_row           pos8_uniform_k4                  position-dependent rows, frequent rejections
target_row_shift            pos8_uniform_k4                  position-dependent rows, frequent rejections
resample_and_continue       markov8_temperature_k2           context-dependent p (Markov), K = 2
residual_bf16_cdf           pos16_noisy_k1,                  many small-mass tokens in the residual / bonus rows;
                            pos256_flat_argmax_k4,           a flat 255-token residual (bf16 CDF steps of 2^-8
                            pos32_adversary_k4               merge tokens: collisions rise), tiny residual masses
uniform_bf16_le             pos32_topk_disjoint_k4           drafts only on p = 0 tokens: accepting one is a
                                                             support failure
residual_overflow_first     pos8_uniform_k4                  any rejection path
reuse_accept_uniform        pos8_uniform_k4                  any rejection path
rows_share_uniforms         pos8_uniform_k4                  B > 1: the within-batch collision test
emitted_plus_one            pos8_uniform_k4                  any
emitted_drop_last           pos8_uniform_k4                  K >= 2
tile_wrapped_rng            pos8_boundary129_uniform_k2      calls of 65..129 rows: rows 64 apart share uniforms
neighbour_scratch           pos16_noisy_k1                   K = 1, frequent bonus draws: adjacent rows' pairs
rejection_index_wrong_row   pos8_uniform_k4                  rows reject at different positions
batch_over_64               pos8_boundary129_uniform_k2      calls above and below 64 rows
==========================  ===============================  ======================================================

Equivalents: ``requires`` mentioning "one-hot q" -> the deterministic-drafter
scenarios (``pos2_least_likely_k2``, ``pos256_flat_argmax_k4``); otherwise
``pos8_uniform_k4`` and ``markov8_temperature_k2`` (position- and context-dependent p,
stochastic drafter) in smoke.
"""

from __future__ import annotations

from specverify.core.errors import InvalidArgument
from specverify.verifier.scenarios import SCENARIOS, TIERS

__all__ = [
    "MUTANT_SCENARIOS",
    "EQUIVALENT_SMOKE",
    "ONE_HOT_DRAFTERS",
    "mutant_scenarios",
    "equivalent_scenarios",
    "CALIBRATION_SCENARIOS",
    "TREE_MUTANT_SCENARIOS",
    "tree_entry_scenarios",
]

#: Smoke scenarios per verifier mutant (bug class -> scenarios of the scenarios.py table, then our own).
# fmt: off
MUTANT_SCENARIOS: dict[str, tuple[str, ...]] = {
    "always_accept": ("pos8_uniform_k4",),
    "inverted_ratio": ("pos8_uniform_k4", "pos32_anti_inverse_k4"),
    "residual_softmax": ("pos8_uniform_k4", "pos32_topk_disjoint_k4"),
    "residual_is_p": ("pos8_uniform_k4", "pos16_noisy_k1"),
    "residual_unnormalised_icdf": ("pos32_adversary_k4",),
    "pointmass_accept": ("pos8_uniform_k4", "markov8_temperature_k2"),
    "argmax_match": ("pos8_uniform_k4", "pos32k_zipf_temperature_k2"),
    "bonus_from_residual": ("pos16_noisy_k1",),
    "bonus_wrong_row": ("pos16_noisy_k1", "markov8_temperature_k2"),
    "shared_uniform": ("pos8_uniform_k4", "markov16_topp_anti_complement_k8"),
    "first_unverified": ("pos8_uniform_k4", "pos32_topk_disjoint_k4"),
    "late_rejection": ("markov8_temperature_k2", "ngram3_v6_stale_k4"),
    "continue_after_reject": ("pos8_uniform_k4", "markov16_topp_anti_complement_k8"),
    "batch_row_mix": ("pos8_uniform_k4",),
    "typical_accept": ("pos8_uniform_k4", "pos256_flat_argmax_k4"),
    "ensemble": ("pos8_uniform_k4", "pos32_anti_inverse_k4"),
    # specverify's own classes (module docstring)
    "residual_next_row": ("pos8_uniform_k4",),
    "target_row_shift": ("pos8_uniform_k4",),
    "resample_and_continue": ("markov8_temperature_k2",),
    "residual_bf16_cdf": ("pos16_noisy_k1", "pos256_flat_argmax_k4", "pos32_adversary_k4"),
    "uniform_bf16_le": ("pos32_topk_disjoint_k4",),
    "residual_overflow_first": ("pos8_uniform_k4",),
    "reuse_accept_uniform": ("pos8_uniform_k4",),
    "rows_share_uniforms": ("pos8_uniform_k4",),
    "emitted_plus_one": ("pos8_uniform_k4",),
    "emitted_drop_last": ("pos8_uniform_k4",),
    "uniforms_reuse_rejected": ("pos8_uniform_k4", "pos16_noisy_k1"),
    # the row-layout class (specverify.mutants.rows)
    "tile_wrapped_rng": ("pos8_boundary129_uniform_k2",),
    "neighbour_scratch": ("pos16_noisy_k1",),
    "rejection_index_wrong_row": ("pos8_uniform_k4",),
    "batch_over_64": ("pos8_boundary129_uniform_k2",),
    # large vocabularies (docs/bugs.md)
    "q_unscattered": ("pos128256_lm_hot_set_k2",),
    "padding_unmasked": ("pos151936_lm_padding_leak_k2",),
    # below the smoke tier (CatalogueEntry.tokens_to_detect): the witness scenario of the measurement
    "residual_fp32_running_cdf": ("pos151936_lm_padding_leak_k2",),
    "residual_fp32_exponential": ("pos151936_lm_padding_leak_k2",),
}
# fmt: on

#: Smoke scenarios of an equivalent with no restriction.
EQUIVALENT_SMOKE = ("pos8_uniform_k4", "markov8_temperature_k2")
#: Zoo drafters whose q is one-hot (deterministic).
ONE_HOT_DRAFTERS = ("least_likely", "argmax")
#: Small scenarios of the calibration run (scaled down further there).
CALIBRATION_SCENARIOS = ("pos8_uniform_k4", "markov8_temperature_k2", "pos2_least_likely_k2")

_KNOWN = {s.name for s in SCENARIOS}


def _known(names) -> tuple[str, ...]:
    return tuple(n for n in names if n in _KNOWN)


def mutant_scenarios(name: str, tier: str) -> tuple[str, ...] | None:
    """Scenario names for a verifier mutant (None: the full battery)."""
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    if tier != "smoke":
        return None
    chosen = _known(MUTANT_SCENARIOS.get(name, ()))
    return chosen or None  # unknown mutant (or renamed scenarios): the full battery


def equivalent_scenarios(requires: str, tier: str) -> tuple[str, ...]:
    """Scenario names on which an equivalent variant with this ``requires`` is correct."""
    if "one-hot" in requires:
        allowed = tuple(s.name for s in SCENARIOS if s.drafter in ONE_HOT_DRAFTERS)
        return allowed if tier != "smoke" else allowed[:2]
    if tier == "smoke":
        return _known(EQUIVALENT_SMOKE) or tuple(s.name for s in SCENARIOS[:2])
    return tuple(s.name for s in SCENARIOS)


#: Smoke tree scenarios per tree mutant: where its bug shows and its base rule is lossless.
# fmt: off
TREE_MUTANT_SCENARIOS: dict[str, tuple[str, ...]] = {
    "residual_zero_only_rejected": ("markov8_iid_2x2",),
    "wor_verified_as_iid": ("markov8_wor_3x2",),
    "residual_not_carried": ("markov8_iid_2x2",),
    "q_wrong_node": ("markov8_iid_2x2",),
    "duplicate_siblings": ("markov8_topk_duplicates",),
    "coin_le_accepts_zero": ("pos32_disjoint_edge_coins",),
    "thresholds_below_one": ("markov8_topk_3x2",),
    "greedy_fallback": ("markov8_topk_3x2",),
    "cumsum_never_updated": ("markov8_topk_3x2",),
    "late_residual_unnormalised": ("markov12_iid_overlap_6x1",),
    "padding_counted_as_sibling": ("ngram3_iid_ragged",),
    "first_row_sibling_loop": ("ngram3_iid_ragged",),
    "coin_per_sibling_rank": ("markov12_iid_overlap_6x1",),
}
# fmt: on


def tree_entry_scenarios(entry, tier: str) -> tuple[str, ...] | None:
    """Tree scenarios for a tree catalogue entry (None: every tree scenario).

    Mutants run on their witness scenario in smoke, else on every scenario their base rule
    allows (``requires``); equivalents always on every scenario ``requires`` allows.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    from specverify.verifier.tree.scenarios import TREE_SCENARIOS

    allowed = tuple(entry.requires.split(",")) if entry.requires else tuple(s.name for s in TREE_SCENARIOS)
    if entry.lossy and tier == "smoke" and entry.name in TREE_MUTANT_SCENARIOS:
        return TREE_MUTANT_SCENARIOS[entry.name]
    return allowed

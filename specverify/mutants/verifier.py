"""Verifier entries of the mutation catalogue: lossy mutants and equivalent (correct) variants.

Each entry follows the verifier protocol
``verify(target_probs (B,K+1,V), draft_probs (B,K,V), draft_tokens (B,K), *, generator)
-> (tokens (B,K+1) long, num_emitted (B,) long)``.  Most are :func:`steps.chain` with one
step overridden; ``argmax_match``, ``resample_and_continue``, ``sample_and_match``,
``pointmass_fallback`` and ``canonical`` are written out.

Notation in descriptions: p target law, q draft law, x ~ q the drafted token, u ~ U[0, 1),
r = (p - q)+ / sum (p - q)+ the residual, n the number of accepted drafts.

Notes on the equivalent variants:

* ``sample_and_match`` (draw y_i ~ p_i, accept while x_i == y_i, emit y at the first
  mismatch) emits y_i ~ p_i(. | emitted prefix) at every position whatever q is, so its
  output law is exact for ANY drafter; but its acceptance probability is sum_x p(x) q(x),
  not sum_x min(p, q) (min(p, q) >= p q with equality iff p or q is 0 or 1 at that token,
  so the two agree iff q or p is one-hot or their supports are disjoint).
  The canonical acceptance-rate test therefore (rightly) calls it non-canonical with a
  stochastic drafter: its verdict (the output law) passes on every scenario and its rule
  conformance (:mod:`specverify.core.conformance`) fails wherever q is not one-hot.  The
  sample-and-match scheme that reproduces the canonical acceptance for a general q must draw
  y from the maximal coupling of (p, q) given x, which is exactly the canonical
  accept/residual rule.
* ``pointmass_fallback`` (vLLM's path when no draft probabilities are passed) has the same
  law as ``sample_and_match``: P(y) = q(y) p(y) + sum_{x != y} q(x) (1 - p(x)) p(y) / (1 - p(x))
  = p(y) for any q, acceptance sum p q.  The lossy point-mass bug is ``pointmass_accept``.
* ``residual_over_overlap`` relies on sum (p - q)+ = 1 - sum min(p, q), exact only when
  p and q are normalised: with float32 rows that sum to 1 +- 1e-6 the relative error of
  the residual mass is ~1e-6 / TV(p, q), far below any sample size the suite uses.
"""

from __future__ import annotations

import torch

from specverify.core.sampling import sample
from specverify.mutants import steps as S
from specverify.mutants.entry import CatalogueEntry
from specverify_reference.rules import greedy_verify
from specverify_reference.rules import verify as reference_verify

__all__ = ["ENTRIES"]


def _composed(name: str, doc: str, **overrides):
    """A named verifier: :func:`steps.chain` with ``overrides`` in place of the canonical steps."""

    def verify(target_probs, draft_probs, draft_tokens, *, generator):
        return S.chain(target_probs, draft_probs, draft_tokens, generator=generator, **overrides)

    verify.__name__ = verify.__qualname__ = name
    verify.__doc__ = doc
    return verify


# ---------------------------------------------------------------- written-out verifiers


def argmax_match(target_probs, draft_probs, draft_tokens, *, generator):
    """Greedy verification at T > 0: accept iff x == argmax p, emit argmax p at the first mismatch."""
    S.make_block(target_probs, draft_probs, draft_tokens, generator)
    return greedy_verify(target_probs, draft_tokens, check=False)


def resample_and_continue(target_probs, draft_probs, draft_tokens, *, generator):
    """At every rejected position emit a residual draw and keep verifying the later drafts.

    The later target rows were computed on the rejected draft, not on the replacement, so
    the block is lossy exactly when p depends on the context.
    """
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    B, K = blk.tokens.shape
    accepted = S.accept_ratio(S.iid_uniforms(blk), blk)  # (B, K)
    residual = S.residual_clamped(blk.target[:, :K], blk.draft)  # (B, K, V)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, blk.target[:, :K])  # (B, K, V)
    replacement = sample(residual, generator=generator, check=False)  # (B, K)
    bonus = sample(blk.target[:, K], generator=generator, check=False)  # (B,)
    tokens = torch.cat([torch.where(accepted, blk.tokens, replacement), bonus[:, None]], dim=1)  # (B, K+1)
    return tokens, torch.full((B,), K + 1, dtype=torch.long, device=tokens.device)


def sample_and_match(target_probs, draft_probs, draft_tokens, *, generator):
    """Draw y_i ~ p_i at every position; accept while x_i == y_i; the emitted block is y."""
    blk = S.make_block(target_probs, draft_probs, draft_tokens, generator)
    K = blk.tokens.shape[1]
    y = sample(blk.target, generator=generator, check=False)  # (B, K+1)
    num_accepted = S.count_prefix(y[:, :K] == blk.tokens)  # (B,)
    return y, num_accepted + 1


def pointmass_fallback(target_probs, draft_probs, draft_tokens, *, generator):
    """vLLM's no-draft-probs path: accept iff u < p(x), residual (p - onehot(x))+, whatever q was."""
    S.make_block(target_probs, draft_probs, draft_tokens, generator)
    onehot = torch.nn.functional.one_hot(draft_tokens.long(), target_probs.shape[-1]).double()  # (B, K, V)
    return S.chain(target_probs, onehot, draft_tokens, generator=generator)


def _half_residual(target_row, draft_row):
    """Residual of the mixture 0.5 p + 0.5 q against q: 0.5 (p - q)+."""
    return 0.5 * (target_row - draft_row).clamp_min(0.0)


def canonical(target_probs, draft_probs, draft_tokens, *, generator):
    """The reference rule itself (``reference.rules.verify``; structure checked, values trusted)."""
    S.check_structure(target_probs, draft_probs, draft_tokens, generator)
    return reference_verify(target_probs, draft_probs, draft_tokens, generator=generator, check=False)


# ---------------------------------------------------------------- the entries

_ANY = "any p != q"
# Measured on pos151936_lm_padding_leak_k2 (docs/bugs.md, "Large vocabularies"; tests/test_mutants_vocab.py;
# benchmarks/bench_mutant_detection.py, whose runs are in benchmarks/results/mutant_detection.jsonl).
FP32_NOT_KILLED_WITHIN = 98_304  # emitted tokens: 32,768 rows of 3 tokens, 64x the smoke tier's 512 rows
_NOT_KILLED = (
    f"the smoke battery with rows doubled (seed 0, alpha 1e-3) did not kill it within {FP32_NOT_KILLED_WITHIN:,} "
    "emitted tokens"
)
FP32_CDF_EFFECT = (
    "exact law of the draw on the witness's bonus row: TV 7.3e-04 (tail tokens absorbed into their neighbours; "
    "its float32 sum overshoots 1, so nothing overflows to the last id); its residual rows hold no deep tail "
    "(TV < 1e-6); " + _NOT_KILLED
)
FP32_EXP_EFFECT = (
    "on the witness's bonus row the tokens below 2^-24 hold 1.8e-03 of the mass (none is below 0.77 x 2^-24), "
    "and the floored race moves TV 1.7e-03 from tokens near the floor to the head (the first-order loss, checked "
    "by a direct test of 16,000 draws on a tail at half the floor); " + _NOT_KILLED
)
_M = CatalogueEntry


def _mutant(name, description, provenance, needs, *, tokens_to_detect=0, effect="", **overrides):
    fn = _composed(name, description, **overrides)
    return _M(name, "verifier", fn, description, provenance, needs, tokens_to_detect=tokens_to_detect, effect=effect)


# fmt: off
ENTRIES: tuple[CatalogueEntry, ...] = (
    # ---- docs/bugs.md, verifier table
    _mutant("always_accept", "u = 0: every draft with p(x) > 0 is accepted, so the block is the draft (output = q)",
            "vllm-ascend #13730 (u = 0)", "any", uniforms=S.zero_uniforms),
    _mutant("inverted_ratio", "accept iff u < min(1, q(x)/p(x)) (ratio upside down); canonical residual",
            "classic", _ANY, accept=S.accept_inverted),
    _mutant("residual_softmax", "recovered token ~ softmax((p - q)+) instead of (p - q)+ normalised",
            "transformers PR #28508", "any", residual=S.residual_softmax),
    _mutant("residual_is_p", "recovered token ~ p instead of the residual", "Spec-RL #14", "any",
            residual=S.residual_target),
    _mutant("residual_unnormalised_icdf",
            "inverse CDF of the unnormalised (p - q)+ with an unscaled uniform; u past the total overflows "
            "to the last token id", "SGLang-style fallback", "any", draw=S.draw_icdf_assume_normalised),
    _mutant("pointmass_accept", "accept iff u < p(x), as if q were a point mass at x, but draw the residual "
            "(p - q)+ with the real q (draft probs wired into the residual only)",
            "vLLM #40149 / PR #40269 (half-wired draft_probs; the issue's own fallback is lossless: "
            "see pointmass_fallback)", "stochastic drafter", accept=S.accept_pointmass),
    _M("argmax_match", "verifier", argmax_match,
       "greedy verification used at T > 0: accept iff x == argmax p, emit argmax p on mismatch and as bonus",
       "mlx-swift-lm PR #459", "T > 0 (target not one-hot)"),
    _mutant("bonus_from_residual", "after all K accepted, bonus ~ r_K = (p_K - q_K)+ instead of p_{K+1}",
            "EAGLE PR #47", "all-accept path, K >= 1", bonus=S.bonus_residual),
    _mutant("bonus_wrong_row", "after all K accepted, bonus ~ p_K instead of p_{K+1}", "docs/bugs.md (no issue)",
            "position-dependent p", bonus=S.bonus_same_row),
    _mutant("shared_uniform", "one uniform per row reused at every position of the block",
            "LLMSpeculativeSampling (reseeds before each draw)", "K >= 2", uniforms=S.row_shared_uniforms),
    _mutant("first_unverified", "the first draft token is always accepted, the others verified canonically",
            "lattice #243", "any", accept=S.first_always_accepted(S.accept_ratio)),
    _mutant("late_rejection", "on rejection at i, emit a draw from p_{i+1} (the target conditioned on the rejected "
            "draft) instead of the residual of p_i", "openvino.genai #4190",
            "any p != q, K >= 1 (docs/bugs.md: K >= 2, context-dependent p, where it is also visible)",
            residual=S.residual_target, residual_offset=1),
    _mutant("continue_after_reject", "acceptances after the first rejection are counted too (n = sum of accepted "
            "flags, not the accepted prefix): rejected drafts are emitted and the residual lands later",
            "classic", "K >= 2", count=S.count_total),
    _mutant("batch_row_mix", "the replacement/bonus token of row b is written into row b+1",
            "flash-attention PR #2779", "B > 1, different rejection points", mix_rows=True),
    _mutant("typical_accept", "Medusa typical acceptance: accept iff p(x) > min(0.09, 0.3 exp(-H(p))); "
            "on rejection emit a draw from p", "Medusa (lossy by design)", "any",
            accept=S.accept_typical(0.09, 0.3), residual=S.residual_target),
    _mutant("ensemble", "accept with min(1, 1 - w + w p/q), w = 0.5, residual of the mixture: output w p + (1-w) q",
            "HF assistant_ensemble_weight", _ANY, accept=S.accept_ensemble(0.5),
            residual=_half_residual),
    # ---- further mutants of the same classes
    _mutant("residual_next_row", "off by one: residual (p_{i+1} - q_i)+ from the next target row",
            "specverify (off-by-one class)", "position/context-dependent p", residual_offset=1),
    _mutant("target_row_shift", "off by one: accept iff u q_i(x_i) < p_{i+1}(x_i) (target logits shifted one row)",
            "specverify (off-by-one class)", "position/context-dependent p", accept=S.accept_shifted_target),
    _M("resample_and_continue", "verifier", resample_and_continue,
       "after a rejection at i, emit a residual draw and keep verifying drafts i+1.. against target rows that "
       "were computed on the rejected draft", "classic", "context-dependent p, K >= 1"),
    _mutant("residual_bf16_cdf", "residual/bonus drawn by an inverse CDF accumulated in bfloat16: tokens of mass "
            "below ~2e-3 vanish or double, the CDF may stop short of 1 (overflow to the last id)",
            "specverify (precision class; cf. DeepSpec #31)", "residual or target with many small-mass tokens",
            draw=S.draw_bf16_cdf),
    _mutant("uniform_bf16_le", "uniforms drawn in bfloat16 (u = 0 w.p. 1/256) and accept iff u <= p/q: a draft "
            "with p(x) = 0 is accepted w.p. 1/256", "specverify (precision + boundary class)",
            "target with zeros where q > 0 (top-k/top-p target)", uniforms=S.bf16_uniforms,
            accept=S.accept_ratio_le),
    _mutant("residual_overflow_first", "inverse CDF of the unnormalised (p - q)+ as argmax(cdf > u): when u exceeds "
            "the residual mass no entry is True and argmax returns token 0", "specverify (normalisation class)",
            "any", draw=S.draw_overflow_to_first),
    _mutant("reuse_accept_uniform", "the residual/bonus draw reuses the uniform of the last acceptance test, "
            "which that test conditioned", "specverify (RNG class)", "any", draw=S.draw_with_accept_uniform),
    _mutant("rows_share_uniforms", "one set of uniforms for the whole batch (acceptance and residual draw): each row's "
            "marginal law is exact, the rows are dependent", "specverify (RNG class)",
            "B > 1, a within-batch test (histogram of one call, collisions)",
            uniforms=S.batch_shared_uniforms, draw=S.draw_batch_shared),
    _mutant("emitted_plus_one", "num_emitted = n + 2 (capped at K+1): the unverified draft (or filler 0) after the "
            "residual is emitted", "specverify (off-by-one class)", "any", emitted=S.emitted_plus_one),
    _mutant("emitted_drop_last", "num_emitted = max(n, 1): the residual/bonus token is dropped whenever a draft was "
            "accepted", "specverify (off-by-one class)", "K >= 2", emitted=S.emitted_drop_last),
    # ---- large vocabularies (docs/bugs.md, "Large vocabularies")
    _mutant("q_unscattered", "a reduced draft vocabulary's q left compact (its nonzero entries packed in id order) "
            "while the drafts carry target ids: q read at the wrong columns for the ratio and the residual",
            "rtp-llm PR #1311, verl-SpeCo PR #67", "a drafter over a scattered subset of the vocabulary",
            block=S.q_unscattered),
    _mutant("padding_unmasked", "padding ids above the last id with target mass get probability 1e-4 each "
            "(a padded head's logit 0 not masked) and the target rows are renormalised",
            "vLLM #13175, vLLM PR #35937, TensorRT-LLM PR #18836", "a head wider than the tokenizer",
            block=S.padding_unmasked),
    # below the smoke tier's detectable deviation (docs/bugs.md, "Large vocabularies"): run, reported,
    # expected to be killed only by a run of more than tokens_to_detect tokens
    _mutant("residual_fp32_running_cdf", "residual/bonus drawn by an inverse CDF over a float32 running sum of the "
            "normalised row, u not scaled: tail tokens below half a float32 spacing are absorbed or rounded up, and "
            "a sum that stops short of 1 overflows to the last id",
            "SGLang PR #22643, TensorRT-LLM #19485, Megatron-LM PR #7182", "a long tail over a real vocabulary",
            draw=S.draw_fp32_running_cdf, tokens_to_detect=FP32_NOT_KILLED_WITHIN, effect=FP32_CDF_EFFECT),
    _mutant("residual_fp32_exponential", "residual/bonus drawn by the exponential race argmax(w / E) in float32 "
            "with Exp(1) noise floored at 2^-24: tokens below ~2^-24 of the row's largest weight can no longer win",
            "vLLM PR #43150, vLLM PR #51367", "a long tail over a real vocabulary",
            draw=S.draw_fp32_exponential_race, tokens_to_detect=FP32_NOT_KILLED_WITHIN, effect=FP32_EXP_EFFECT),
    # ---- equivalent (correct) variants
    _M("canonical", "equivalent", canonical, "the reference rule: accept iff u q(x) < p(x), residual (p - q)+, "
       "bonus p_{K+1}", "reference.rules.verify"),
    _M("accept_le", "equivalent", _composed("accept_le", "accept iff u <= p/q", accept=S.accept_ratio_le),
       "accept iff u <= p(x)/q(x) instead of u q(x) < p(x) (differs only on a set of probability 0)", "docs/bugs.md"),
    _M("sample_and_match", "equivalent", sample_and_match,
       "y_i ~ p_i at every position; accept while x_i == y_i; emit y at the first mismatch (or y_{K+1}); the law "
       "is exact for any q, but with a stochastic q acceptance is sum p q < sum min(p, q): rule conformance fails",
       "docs/bugs.md"),
    _M("exponential_race", "equivalent",
       _composed("exponential_race", "residual/bonus by argmax(w / Exp(1))", draw=S.draw_exponential_race),
       "residual and bonus token drawn as argmax_v w_v / E_v, E_v ~ Exp(1) i.i.d.", "vLLM V1 rejection sampler"),
    _M("residual_over_overlap", "equivalent",
       _composed("residual_over_overlap", "residual (p-q)+ / (1 - sum min(p,q)), inverse CDF assuming sum 1",
                 residual=S.residual_over_overlap, draw=S.draw_icdf_assume_normalised),
       "residual (p - q)+ normalised by 1 - sum min(p, q), drawn by an inverse CDF that assumes a normalised row",
       "docs/bugs.md", requires="normalised p and q (row sums 1 within ~1e-6)"),
    _M("pointmass_fallback", "equivalent", pointmass_fallback,
       "vLLM's no-draft-probs path: accept iff u < p(x), residual p with x removed, i.e. the canonical rule for "
       "q = onehot(x) whatever q was; P(y) = p(y) q(y) + p(y) (1 - q(y)) = p(y), so the law is exact for any q",
       "vLLM #40149 (draft_probs=None fallback)"),
    _M("no_bonus", "equivalent", _composed("no_bonus", "no bonus token", emitted=S.emitted_no_bonus),
       "when all K drafts are accepted, emit the K drafts only (num_emitted = K)", "docs/bugs.md"),
)
# fmt: on

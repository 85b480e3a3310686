"""Every candidate generator of transformers' ``generate``, on tiny seeded models: specs and CLI factories.

:data:`GENERATORS` names each path ``generate`` can take with a draft (transformers 5.24,
``GenerationMixin._get_candidate_generator``), the class it must build, what K means for it and
the rule read from its source (:attr:`GeneratorSpec.rule`: what it drafts and which q it hands
``_speculative_sampling``).  :func:`tiny_generator_decoder` builds the
:class:`~specverify.adapters.hf.generators.HFGeneratorDecoder` for one of them and
:func:`tiny_generator_target` the exact processed conditionals of its target (same ``seed``, same
weights), both CLI factories (``PKG.MOD:NAME``, keyword-only options)::

    specverify audit --decoder specverify.adapters.hf.catalog:tiny_generator_decoder \\
        --decoder-option generator=prompt_lookup --decoder-option k=3 \\
        --target specverify.adapters.hf.catalog:tiny_generator_target --target-option generator=prompt_lookup

Models (offline, from configs; :mod:`specverify.adapters.fixtures`): the tiny Llama pair (V = 32)
for the assistant schedules, early exit, prompt lookup and DFlash; word-level tokenizers with
partly shared vocabularies for the different-tokenizer paths; a tiny Mellum with one MTP layer;
tiny Gemma 4 / Gemma 4 unified targets with their assistants.
"""

from __future__ import annotations

import dataclasses

from specverify.adapters.hf.assisted import HFTarget
from specverify.adapters.hf.generators import HFGeneratorDecoder
from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = ["GeneratorSpec", "GENERATORS", "available", "tiny_generator_decoder", "tiny_generator_target"]

_CG = "transformers/generation/candidate_generator.py"
_UTILS = "transformers/generation/utils.py"


@dataclasses.dataclass(frozen=True)
class GeneratorSpec:
    """One candidate-generator path of ``generate``.

    Attributes
    ----------
    name : str
        Key in :data:`GENERATORS` and the factories' ``generator=`` option.
    generator : str
        The ``CandidateGenerator`` class ``generate`` must build (``greedy_generator`` when greedy differs).
    architecture : str
        The target model family (``llama``, ``mellum``, ``gemma4``, ``gemma4_unified``).
    k_meaning : str
        What the factories' ``k`` sets.
    rule : str
        What it drafts and which q it returns, read from the source (file and function cited).
    sampling : bool
        Whether ``generate`` accepts it with ``do_sample=True``.
    greedy_generator : str
        The class for ``do_sample=False`` (defaults to ``generator``).
    max_k : int
        Largest K the architecture allows (0: no limit).
    """

    name: str
    generator: str
    architecture: str
    k_meaning: str
    rule: str
    sampling: bool = True
    greedy_generator: str = ""
    max_k: int = 0

    def expected(self, greedy: bool) -> str:
        """The class name ``generate`` must build."""
        return (self.greedy_generator or self.generator) if greedy else self.generator


GENERATORS = {
    s.name: s
    for s in (
        GeneratorSpec(
            "heuristic",
            "AssistedCandidateGenerator",
            "llama",
            "initial num_assistant_tokens (schedule 'heuristic': +2 after a fully accepted round, -1 otherwise, "
            "at least 1)",
            f"Drafts by running `assistant.generate` with the target's logits processors and sampling options "
            f"(`{_CG}` `AssistedCandidateGenerator._generate_candidates`); q = the assistant's processed scores "
            "(`torch.stack(assistant_output.scores)`), the law its drafts were sampled from. Only the draft length "
            "changes between rounds (`update_candidate_strategy`), from the number of matches.",
        ),
        GeneratorSpec(
            "dynamic",
            "AssistedCandidateGenerator",
            "llama",
            "num_assistant_tokens (constant schedule), with assistant_confidence_threshold=0.4",
            f"As the standard assistant (q = the assistant's processed scores, `{_CG}` "
            "`AssistedCandidateGenerator._generate_candidates`), but the assistant stops drafting early when its "
            "drafted token's probability falls below `assistant_confidence_threshold` (`ConfidenceCriteria`); "
            "with scikit-learn installed `update_candidate_strategy` re-fits the threshold from an ROC curve of "
            "(draft probability, accepted) pairs once a call has more than 5 of them. The stop depends only on the "
            "drafts. The adapter resets the threshold before every call, and a 6-token sample drafts about 4 "
            "tokens, so in these runs (scikit-learn installed, recorded in each report's environment) the re-fit "
            "does not fire: the threshold stays 0.4.",
        ),
        GeneratorSpec(
            "early_exit",
            "EarlyExitCandidateGenerator",
            "llama",
            "num_assistant_tokens of the target's own generation config (assistant_early_exit=1 of 2 layers)",
            f"The target itself drafts with `config.num_hidden_layers` temporarily set to `assistant_early_exit` "
            f"(`{_CG}` `EarlyExitCandidateGenerator.get_candidates`), through `AssistedCandidateGenerator`: "
            "q = the truncated model's processed scores, the law its drafts were sampled from.",
        ),
        GeneratorSpec(
            "prompt_lookup",
            "PromptLookupCandidateGenerator",
            "llama",
            "prompt_lookup_num_tokens (n-gram match of size <= 2 in the sequence so far)",
            f"Copies the continuation of the first earlier match of the last n-gram (`{_CG}` "
            "`PromptLookupCandidateGenerator.get_candidates`) and returns no logits (`None`), so `_assisted_decoding` "
            f"(`{_UTILS}`) takes its target-only path: it samples every position from the target's processed law "
            "(`torch.multinomial(new_logits.softmax(-1))`) and keeps the drafts up to the first mismatch, then the "
            "sampled token.",
        ),
        GeneratorSpec(
            "vocab_superset",
            "UniversalSpeculativeDecodingGenerator",
            "llama",
            "num_assistant_tokens; assistant vocabulary = the target's 32 words + 8 of its own",
            f"Sampling: the assistant's lm_head is pruned to the words both vocabularies share (`{_CG}` "
            "`AssistantToTargetTranslator`, `_PruneReindexingLMHead`): pruned row j is assistant id "
            "`assistant_overlap_token_ids[j]`, in the iteration order of the assistant tokenizer's `get_vocab()`. "
            "It drafts with the target's processors on the pruned logits; `get_target_ids` maps a drafted row j "
            "through `assistant_overlap_token_ids` to its target id, but `get_target_logits` scatters column j onto "
            "the target id of the j-th shared assistant id in ascending id order, so q is the drafts' law attached "
            "to other tokens unless that dict happens to be sorted by id. The first sampling call builds the "
            "translator, whose `prune_linear_layer` draws from the global RNG (so the decoder warms up once). "
            "Greedy: `AssistedCandidateGeneratorDifferentTokenizers` re-tokenizes text both ways and returns no "
            "logits (target-only matching).",
            greedy_generator="AssistedCandidateGeneratorDifferentTokenizers",
        ),
        GeneratorSpec(
            "vocab_subset",
            "UniversalSpeculativeDecodingGenerator",
            "llama",
            "num_assistant_tokens; assistant vocabulary = 20 of the target's 32 words",
            f"As `vocab_superset`, but nothing is pruned (every assistant word is a target word): `{_CG}` "
            "`AssistantToTargetTranslator.__init__` sets `assistant_overlap_token_ids` only when some assistant word "
            "is missing from the target, while `get_target_ids` indexes it whenever `assistant_prune_lm_head` is "
            "set, which `_get_candidate_generator` always does for sampling.",
            greedy_generator="AssistedCandidateGeneratorDifferentTokenizers",
        ),
        GeneratorSpec(
            "vocab_partial",
            "UniversalSpeculativeDecodingGenerator",
            "llama",
            "num_assistant_tokens; assistant vocabulary = 20 of the target's words + 8 of its own",
            "As `vocab_superset` (both vocabularies have words the other lacks).",
            greedy_generator="AssistedCandidateGeneratorDifferentTokenizers",
        ),
        GeneratorSpec(
            "mtp",
            "MTPCandidateGenerator",
            "mellum",
            "number of MTP layers (Mellum supports one)",
            f"Each MTP layer drafts one token from the target's last hidden state and the previous token "
            f"(`transformers/modeling_layers.py` `MtpModel.forward`, called by `{_CG}` `MTPCandidateGenerator`): it "
            "applies the target's logits processors, samples from their softmax with `do_sample` (argmax otherwise) "
            "and returns those processed logits as q.",
            max_k=1,
        ),
        GeneratorSpec(
            "dflash",
            "DFlashTokenCandidateGenerator",
            "llama",
            "block_size - 1 (one forward of the drafter proposes a whole block)",
            f"One drafter forward over [last token, mask x (block_size-1)] with the target's hidden states as context "
            f"(`{_CG}` `DFlashTokenCandidateGenerator.get_candidates`); position by position it applies the target's "
            "processors to the logits, samples from their softmax (`torch.multinomial`, argmax when greedy) and "
            "returns the processed logits as q.",
        ),
        GeneratorSpec(
            "gemma4",
            "SinglePositionMultiTokenCandidateGenerator",
            "gemma4",
            "num_assistant_tokens of the Gemma4AssistantForCausalLM",
            f"Drafts autoregressively from the target's last hidden state and shared KV states with "
            f"`last_token_id = outputs.logits.argmax(dim=-1)` -- argmax whatever `do_sample` says -- and returns "
            f"the assistant's raw logits (no temperature / top-k / top-p processing) as q (`{_CG}` "
            "`SinglePositionMultiTokenCandidateGenerator.get_candidates`). With `do_sample=True` "
            "`_speculative_sampling` then treats a deterministic argmax draft as a sample from softmax(raw logits): "
            "it accepts x = argmax q with probability min(1, p(x)/q(x)) >= p(x) and resamples the residual "
            "(p - q)+, which is not the target's law unless q is one-hot.",
        ),
        GeneratorSpec(
            "gemma4_unified",
            "SinglePositionMultiTokenCandidateGenerator",
            "gemma4_unified",
            "num_assistant_tokens of the Gemma4UnifiedAssistantForCausalLM",
            "As `gemma4` (the same generator), with `Gemma4UnifiedForCausalLM` and its unified assistant. The tiny "
            "unified pair is built from the same seeds and shapes as the Gemma 4 pair and computes the same laws "
            "(its outputs equal the Gemma 4 pair's), so it checks the routing and the classes, not a different law.",
        ),
    )
}


def _family_present(spec: GeneratorSpec) -> bool:
    from transformers.generation import candidate_generator as cg

    if not all(hasattr(cg, name) for name in (spec.expected(False), spec.expected(True))):
        return False
    if spec.architecture in ("gemma4", "gemma4_unified"):
        from specverify.adapters.fixtures.gemma4 import has_family

        return has_family(spec.architecture)
    if spec.name == "mtp":
        from specverify.adapters.fixtures.heads import has_mtp

        return has_mtp()
    if spec.name == "dflash":
        from specverify.adapters.fixtures.heads import has_dflash

        return has_dflash()
    return True


def available(name: str) -> bool:
    """Whether the installed transformers has the models and generator of ``name``."""
    return _family_present(_spec(name))


def _spec(name: str) -> GeneratorSpec:
    if name not in GENERATORS:
        raise InvalidArgument(f"generator must be one of {tuple(GENERATORS)}, got {name!r}")
    return GENERATORS[name]


def _target_model(spec: GeneratorSpec, seed: int):
    if spec.architecture == "mellum":
        from specverify.adapters.fixtures.heads import tiny_mtp_model

        return tiny_mtp_model(seed=seed)
    if spec.architecture in ("gemma4", "gemma4_unified"):
        from specverify.adapters.fixtures.gemma4 import tiny_gemma4_pair

        return tiny_gemma4_pair(family=spec.architecture, seed=seed)[0]
    from specverify.adapters.fixtures.llama import tiny_llama

    return tiny_llama(vocab_size=32, seed=seed)


def _draft_setup(spec: GeneratorSpec, k: int, seed: int, confidence: float):
    """(model, assistant, options, draft_config, tokenizers) of one path."""
    from specverify.adapters.fixtures.llama import tiny_llama_pair

    constant = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant"}
    none = (None, None)
    if spec.name in ("heuristic", "dynamic"):
        model, assistant = tiny_llama_pair(vocab_size=32, seed=seed)
        fields = dict(constant, assistant_confidence_threshold=0.0)
        if spec.name == "heuristic":
            fields["num_assistant_tokens_schedule"] = "heuristic"
        else:
            fields["assistant_confidence_threshold"] = confidence
        _set(assistant.generation_config, fields)
        return model, assistant, {}, assistant.generation_config, none
    if spec.name == "early_exit":
        model = _target_model(spec, seed)
        _set(model.generation_config, dict(constant, assistant_confidence_threshold=0.0))
        return model, None, {"assistant_early_exit": 1}, model.generation_config, none
    if spec.name == "prompt_lookup":
        return _target_model(spec, seed), None, {"prompt_lookup_num_tokens": k}, None, none
    if spec.name.startswith("vocab_"):
        from specverify.adapters.fixtures.vocab import tiny_vocab_pair

        model, assistant, tok, assistant_tok = tiny_vocab_pair(overlap=spec.name[len("vocab_") :], seed=seed)
        _set(assistant.generation_config, dict(constant, assistant_confidence_threshold=0.0))
        return model, assistant, {}, assistant.generation_config, (tok, assistant_tok)
    if spec.name == "mtp":
        return _target_model(spec, seed), None, {"use_mtp": True}, None, none
    if spec.name == "dflash":
        from specverify.adapters.fixtures.heads import tiny_dflash_assistant

        assistant = tiny_dflash_assistant(block_size=k + 1, seed=seed)
        return _target_model(spec, seed), assistant, {"speculation_type": "dflash"}, None, none
    from specverify.adapters.fixtures.gemma4 import tiny_gemma4_pair

    model, assistant = tiny_gemma4_pair(family=spec.architecture, seed=seed)
    _set(assistant.generation_config, dict(constant, assistant_confidence_threshold=0.0))
    return model, assistant, {}, assistant.generation_config, none


def _set(config, fields: dict) -> None:
    for key, value in fields.items():
        setattr(config, key, value)


def tiny_generator_decoder(
    *,
    generator: str,
    k: int = 3,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    confidence: float = 0.4,
    seed: int = 0,
    num_threads: int | None = 1,
) -> HFGeneratorDecoder:
    """CLI factory: ``generate`` through candidate generator ``generator`` (a :data:`GENERATORS` key).

    Parameters
    ----------
    generator : str
        Which path (:data:`GENERATORS`).
    k : int
        Draft tokens per round as :attr:`GeneratorSpec.k_meaning` says (MTP: at most 1).
    temperature, top_k, top_p : sampling options (give the same to :func:`tiny_generator_target`).
    greedy : bool
        ``do_sample=False`` (no sampling options); check with ``--greedy``.
    confidence : float
        ``assistant_confidence_threshold`` of the ``dynamic`` path (ignored by the others).
    seed : int
        Weights seed (the same as the target's).
    """
    spec = _spec(generator)
    k = check_int("k", k, minimum=1, maximum=spec.max_k or None)
    seed = check_int("seed", seed, minimum=0, maximum=2**62)
    if not _family_present(spec):
        raise InvalidArgument(f"the installed transformers has no {spec.generator} path for {generator!r}")
    model, assistant, options, draft_config, (tok, assistant_tok) = _draft_setup(spec, k, seed, float(confidence))
    if greedy and (temperature != 1.0 or top_k or top_p != 1.0):
        raise InvalidArgument("greedy decoding takes no sampling options (temperature, top_k, top_p)")
    sampling = {} if greedy else dict(temperature=temperature, top_k=top_k, top_p=top_p)
    return HFGeneratorDecoder(
        model,
        expected_generator=spec.expected(bool(greedy)),
        k=k,
        assistant=assistant,
        options=options,
        draft_config=draft_config,
        tokenizer=tok,
        assistant_tokenizer=assistant_tok,
        greedy=bool(greedy),
        num_threads=num_threads,
        warm_up=spec.name.startswith("vocab_") and not greedy,
        **sampling,
    )


def tiny_generator_target(
    *,
    generator: str,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    num_threads: int | None = 1,
) -> HFTarget:
    """CLI factory: the exact processed conditionals of the target of ``generator``'s decoder (same ``seed``)."""
    spec = _spec(generator)
    seed = check_int("seed", seed, minimum=0, maximum=2**62)
    if not _family_present(spec):
        raise InvalidArgument(f"the installed transformers has no {spec.generator} path for {generator!r}")
    return HFTarget(
        _target_model(spec, seed), temperature=temperature, top_k=top_k, top_p=top_p, num_threads=num_threads
    )

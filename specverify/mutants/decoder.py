"""Decoder mutants: the reference speculative decoder with one planted integration bug each.

Each mutant subclasses :class:`reference.decoder.SpeculativeDecoder` and overrides one
of its hooks, mirroring a bug real engines shipped (``docs/bugs.md``, table
"Decoder (integration)").  :data:`ENTRIES` lists them with provenance and the
sampling configuration that makes the loss visible; :func:`make_decoder_mutant`
builds one.

==========================  =========================================================  ==============
name                        wrong behaviour                                            provenance
==========================  =========================================================  ==============
``kv_not_rolled_back``      rejected drafts stay in the target's KV cache              classic
``topk_not_in_reported_q``  drafter samples from its top-k law, reports q without it   transformers #47932
``target_unprocessed``      target probabilities at temperature 1 (user asked 0.7)     vLLM #9834
``stale_context``           drafter conditioned on the context before the last block   classic
``penalties_not_verified``  target verifies without the penalties the user asked for   vLLM #18902
``penalty_last_token_only`` penalty state records one token per round, not the block   SGLang PR #33643
``grammar_first_row_only``  grammar mask on the first verified row only                vLLM PR #54442
==========================  =========================================================  ==============

``stale_context`` is *lossless for the output law*: the drafter still reports the law
it sampled from, and speculative sampling preserves the target law for any drafter
(Leviathan et al. 2023, Theorem 1).  It only lowers acceptance (tokens per target pass),
so :func:`specverify.decoder.check_decoder` must PASS it (``lossy=False``); the
drafter audit's efficiency numbers are where it shows.

References: Leviathan, Kalman & Matias (ICML 2023); vLLM issue #9834 (speculative
decoding ignored the sampling parameters in the target's verification probabilities).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.sampling import sample
from specverify.mutants.entry import CatalogueEntry
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.grammar import Grammar
from specverify_reference.penalties import History
from specverify_reference.processors import SamplingConfig, logits_to_probs

__all__ = [
    "NoTargetRollback",
    "TopKNotInReportedQ",
    "TargetUnprocessed",
    "StaleDraftContext",
    "PenaltiesNotVerified",
    "PenaltyLastTokenOnly",
    "GrammarFirstRowOnly",
    "PENALISED",
    "STRUCTURED",
    "ENTRIES",
    "FaultVisibility",
    "VISIBILITY",
    "fault_visibility",
    "make_decoder_mutant",
]


class NoTargetRollback(SpeculativeDecoder):
    """Rejected drafts' keys/values stay in the target's KV cache (never truncated)."""

    def _rollback_target(self, state) -> None:
        pass


class TopKNotInReportedQ(SpeculativeDecoder):
    """The drafter samples from its processed (top-k) law but reports the law without top-k."""

    def _draft_token(self, logits: torch.Tensor, generator: torch.Generator, history=None):
        sampled_from = logits_to_probs(logits, self.sampling, history=history)  # (B, V)
        reported = logits_to_probs(logits, replace(self.sampling, top_k=None), history=history)  # (B, V)
        return sample(sampled_from, generator=generator, check=False), reported


class TargetUnprocessed(SpeculativeDecoder):
    """The target's verification probabilities at temperature 1, whatever temperature the user asked."""

    def _target_probs(self, logits: torch.Tensor, history=None) -> torch.Tensor:
        return logits_to_probs(logits, replace(self.sampling, temperature=1.0), history=history)  # (B, K+1, V)


class PenaltiesNotVerified(SpeculativeDecoder):
    """The target's verification laws without the repetition, frequency and presence penalties.

    The drafter still applies them.  vLLM #18902 (V1: the frequency penalty had no effect with
    speculative decoding, no warning), TensorRT-LLM PR #17701 (one-model speculative decoding
    ignored all three), SGLang #28180 (DFlash ignored the repetition penalty).
    """

    def _target_probs(self, logits: torch.Tensor, history=None) -> torch.Tensor:
        unpenalised = replace(self.sampling, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)
        return logits_to_probs(logits, unpenalised, history=history if unpenalised.needs_history else None)


class GrammarFirstRowOnly(SpeculativeDecoder):
    """Structured output: the verification pass masks its first row only; the later draft positions
    and the bonus position are scored and resampled from unmasked rows.

    vLLM #44006 / PR #44292 (the bonus row got the full mask after padded drafts), PR #54442 and
    #54437 (every row after the first padded draft unmasked: "a request can accept tokens the
    grammar never allowed"), PR #36138 (draft tokens after the end of reasoning not checked
    against the grammar).
    """

    def _target_probs(self, logits: torch.Tensor, history=None) -> torch.Tensor:
        if history is None or logits.shape[1] < 2:
            return super()._target_probs(logits, history)
        free = replace(self.sampling, grammar=None)
        rest = History(history.tokens, history.prompt_len, history.ends[:, 1:]) if free.needs_history else None
        unmasked = logits_to_probs(logits[:, 1:], free, history=rest)  # (B, K, V) before logits are overwritten
        probs = super()._target_probs(logits, history)  # (B, K+1, V)
        probs[:, 1:] = unmasked
        return probs


class PenaltyLastTokenOnly(SpeculativeDecoder):
    """The penalties' record of the output gets one token per round: the last one emitted.

    SGLang PR #33643: with a speculator a decode step commits ``accept_len`` tokens, but only
    ``output_ids[-1]`` reaches the penalizers, so the other accepted tokens never count (a
    frequency penalty weakens to about nominal / accepted length).  The drafts of a round are
    still seen after the record (the verification pass conditions on them).
    """

    def _append(self, state, tokens: torch.Tensor, num_emitted: torch.Tensor) -> None:
        super()._append(state, tokens, num_emitted)
        record, length = _penalty_record(state)  # (B_all, L), (B_all,)
        rows = state.rows  # (B,) original rows of the active ones
        last = tokens.gather(1, (num_emitted - 1)[:, None])[:, 0]  # (B,)
        record[rows, length[rows]] = last
        length[rows] += 1

    def _history(self, state, drafts: torch.Tensor):
        record, length = _penalty_record(state)
        rows, T = state.rows, state.prompt_len
        B, m = drafts.shape
        recorded = length[rows]  # (B,)
        width = int(recorded.max()) if B else 0
        tokens = torch.zeros(B, T + width + m, dtype=torch.long, device=drafts.device)
        tokens[:, :T] = state.seq[:, :T]
        if width:
            tokens[:, T : T + width] = record[rows, :width]
        if m:
            tokens.scatter_(1, (T + recorded)[:, None] + torch.arange(m, device=drafts.device), drafts)
        return tokens, T + recorded


def _penalty_record(state) -> tuple[torch.Tensor, torch.Tensor]:
    """The mutant's own record of the output per original row: tokens (B_all, L) and lengths (B_all,)."""
    if not hasattr(state, "_record"):
        B_all, capacity = state.out.shape[0], state.seq.shape[1]
        state._record = torch.zeros(B_all, capacity, dtype=torch.long, device=state.seq.device)
        state._record_len = torch.zeros(B_all, dtype=torch.long, device=state.seq.device)
    return state._record, state._record_len


class StaleDraftContext(SpeculativeDecoder):
    """The drafter conditions on the committed context of the previous round (the last block is missing).

    The drafter's cache is truncated to that stale context before it catches up, so it
    drafts as if the tokens emitted in the last round did not exist.  Its reported law
    is still the one it sampled from: lossless, only slower.
    """

    def _draft_context(self, state):
        stale = getattr(state, "_stale_len", None)
        if stale is None or stale.shape != state.seq_len.shape:
            stale = state.seq_len.clone()  # (B,) first round (or rows retired): nothing stale yet
        state._stale_len = state.seq_len.clone()  # (B,) what the next round will see as stale
        if state.draft_cache is not None:
            cache = state.draft_cache
            cache.truncate(torch.minimum(cache.lengths, stale - 1))
        return state.seq, stale


#: Where the penalty mutants show: vLLM's penalties, strong enough to move a law over 8 tokens.
PENALISED = SamplingConfig(engine="vllm", repetition_penalty=1.6, frequency_penalty=0.6, presence_penalty=0.4)


#: Where the grammar mutant shows: a JSON object with one string field, over the selftest's 32 tokens
#: (``{}":, `` and the letters of :func:`~specverify_reference.grammar.synthetic_vocabulary`).
STRUCTURED = SamplingConfig(
    engine="vllm",
    grammar=Grammar(
        "json_schema", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    ),
)


def _entry(name, cls, sampling, description, provenance, lossy=True) -> CatalogueEntry:
    """A decoder entry: ``cls(target, drafter, *, k, sampling)``; ``sampling`` is where the bug shows."""
    kind = "decoder" if lossy else "decoder_equivalent"
    return CatalogueEntry(name, kind, cls, description, provenance, config=sampling)


# fmt: off
ENTRIES: tuple[CatalogueEntry, ...] = (
    _entry("kv_not_rolled_back", NoTargetRollback, SamplingConfig(),
                  "rejected draft tokens stay in the target KV cache", "classic"),
    _entry("topk_not_in_reported_q", TopKNotInReportedQ, SamplingConfig(top_k=3),
                  "drafter samples from top-k processed logits, reports q without top-k",
                  "transformers #47932 / PR #47961"),
    _entry("target_unprocessed", TargetUnprocessed, SamplingConfig(temperature=0.7),
                  "target probabilities taken at temperature 1 while the user asked 0.7", "vLLM #9834"),
    _entry("stale_context", StaleDraftContext, SamplingConfig(temperature=0.9),
                  "drafter conditioned on the context before the last accepted block (honest q: lossless, slower)",
                  "classic", lossy=False),
    _entry("penalties_not_verified", PenaltiesNotVerified, PENALISED,
                  "target verification laws without the repetition, frequency and presence penalties "
                  "(the drafter applies them)", "vLLM #18902, TensorRT-LLM PR #17701, SGLang #28180"),
    _entry("penalty_last_token_only", PenaltyLastTokenOnly, PENALISED,
                  "the penalties' record of the output gets only the last token emitted in each round",
                  "SGLang PR #33643"),
    _entry("grammar_first_row_only", GrammarFirstRowOnly, STRUCTURED,
                  "structured output: the grammar mask applied to the first verified row only (the later draft "
                  "positions and the bonus token drawn from unmasked rows)",
                  "vLLM #44006 / PR #44292, PR #54442 (#54437), PR #36138"),
)
# fmt: on


def make_decoder_mutant(
    name: str, target, drafter, *, k: int, sampling: SamplingConfig | None = None, **kwargs
) -> SpeculativeDecoder:
    """Build the mutant ``name`` around ``target`` and ``drafter`` (its own sampling config by default)."""
    for entry in ENTRIES:
        if entry.name == name:
            return entry.build(target, drafter, k=k, sampling=sampling or entry.config, **kwargs)
    raise InvalidArgument(f"name must be one of {[e.name for e in ENTRIES]}, got {name!r}")


@dataclass(frozen=True)
class FaultVisibility:
    """When a decoder mutant's fault reaches the output law: in words, as options of an audit, as a test.

    ``audit_with`` are ``specverify audit`` options under which it shows (empty: any, or never);
    ``visible(sampling)`` says whether an audit with that :class:`SamplingConfig` can see it.
    """

    when: str
    audit_with: tuple[str, ...]
    visible: Callable[[SamplingConfig], bool]


#: Each decoder mutant's visibility (a server playing one says so at start-up and in its model list).
VISIBILITY: dict[str, FaultVisibility] = {
    "kv_not_rolled_back": FaultVisibility("any sampling options", (), lambda s: True),
    "topk_not_in_reported_q": FaultVisibility("top-k set", ("--top-k", "3"), lambda s: s.top_k is not None),
    "target_unprocessed": FaultVisibility(
        "a temperature other than 1 (and not 0)", ("--temperature", "0.7"), lambda s: s.temperature not in (0, 1)
    ),
    "stale_context": FaultVisibility("never: it is lossless for the output law, only slower", (), lambda s: False),
    "penalties_not_verified": FaultVisibility(
        "a repetition, frequency or presence penalty", ("--frequency-penalty", "0.6"), lambda s: s.penalised
    ),
    "penalty_last_token_only": FaultVisibility(
        "a repetition, frequency or presence penalty", ("--frequency-penalty", "0.6"), lambda s: s.penalised
    ),
    "grammar_first_row_only": FaultVisibility(
        "a structured-output grammar", ("--regex", "[a-d]+( [a-d]+)*"), lambda s: s.grammar is not None
    ),
}


def fault_visibility(name: str) -> FaultVisibility:
    """The :class:`FaultVisibility` of decoder mutant ``name``."""
    if name not in VISIBILITY:
        raise InvalidArgument(f"name must be one of {sorted(VISIBILITY)}, got {name!r}")
    return VISIBILITY[name]

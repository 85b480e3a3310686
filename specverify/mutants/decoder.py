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
from specverify_reference.processors import SamplingConfig, logits_to_probs

__all__ = [
    "NoTargetRollback",
    "TopKNotInReportedQ",
    "TargetUnprocessed",
    "StaleDraftContext",
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

    def _draft_token(self, logits: torch.Tensor, generator: torch.Generator):
        sampled_from = logits_to_probs(logits, self.sampling)  # (B, V)
        reported = logits_to_probs(logits, replace(self.sampling, top_k=None))  # (B, V)
        return sample(sampled_from, generator=generator, check=False), reported


class TargetUnprocessed(SpeculativeDecoder):
    """The target's verification probabilities at temperature 1, whatever temperature the user asked."""

    def _target_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, replace(self.sampling, temperature=1.0))  # (B, K+1, V)


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
}


def fault_visibility(name: str) -> FaultVisibility:
    """The :class:`FaultVisibility` of decoder mutant ``name``."""
    if name not in VISIBILITY:
        raise InvalidArgument(f"name must be one of {sorted(VISIBILITY)}, got {name!r}")
    return VISIBILITY[name]

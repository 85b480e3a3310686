"""Speculative-decoding counters as engines expose them: drafts, draft tokens, acceptances by position.

* vLLM (and the local server) publish Prometheus counters at ``GET /metrics``, and so does
  llama.cpp's ``llama-server`` started with ``--metrics`` (prefix ``llamacpp:`` for ``vllm:``):
  ``vllm:spec_decode_num_drafts_total`` (verification steps, one per sequence and step),
  ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="i"}`` (0-based).  Label sets (engines,
  models) are summed.
* without ``--metrics``, ``llama-server`` still reports ``timings.draft_n`` and
  ``timings.draft_n_accepted`` in each reply: draft tokens and accepted ones, no drafts and no
  positions.
* The in-process reference decoders return a ``DecodeStats`` (rounds per row, drafted and
  accepted per position).

A :class:`SpecCounts` is a cumulative snapshot; the difference of two snapshots counts what
happened between them.  Mean acceptance length is vLLM's: ``1 + accepted / drafts`` tokens per
verification step (the bonus or residual token included); acceptance at position ``i`` is
``accepted_per_pos[i] / drafts``, the share of steps whose draft ``i`` was accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["SpecCounts", "parse_prometheus", "from_prometheus"]

_PREFIXES = ("vllm:spec_decode_", "llamacpp:spec_decode_")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class SpecCounts:
    """Cumulative counters (None where the engine does not expose one)."""

    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    accepted_per_pos: tuple[int, ...] = ()

    def __sub__(self, earlier: SpecCounts) -> SpecCounts:
        return _combine(self, earlier, -1)

    def __add__(self, other: SpecCounts) -> SpecCounts:
        return _combine(self, other, 1)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verification step, ``1 + accepted / drafts`` (None without drafts)."""
        if not self.drafts or self.accepted is None:
            return None
        return 1.0 + self.accepted / self.drafts

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens over proposed ones (None without draft tokens)."""
        if not self.draft_tokens or self.accepted is None:
            return None
        return self.accepted / self.draft_tokens

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        """Share of verification steps whose draft at position ``i`` was accepted (empty when unknown)."""
        if not self.drafts or not self.accepted_per_pos:
            return ()
        return tuple(a / self.drafts for a in self.accepted_per_pos)

    def as_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": list(self.acceptance_by_position),
        }


def _combine(a: SpecCounts, b: SpecCounts, sign: int) -> SpecCounts:
    """``a + sign * b``, field by field (None where either lacks a counter; positions padded with 0)."""

    def combine(x, y):
        return None if x is None or y is None else x + sign * y

    width = max(len(a.accepted_per_pos), len(b.accepted_per_pos))
    pad_a = (*a.accepted_per_pos, *(0,) * (width - len(a.accepted_per_pos)))
    pad_b = (*b.accepted_per_pos, *(0,) * (width - len(b.accepted_per_pos)))
    return SpecCounts(combine(a.drafts, b.drafts), combine(a.draft_tokens, b.draft_tokens),
                      combine(a.accepted, b.accepted), tuple(x + sign * y for x, y in zip(pad_a, pad_b)))  # fmt: skip


def parse_prometheus(text: str) -> dict[str, list[tuple[str, float]]]:
    """Prometheus text format -> {metric name: [(labels text, value), ...]} (comments and bad lines skipped)."""
    metrics: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            metrics.setdefault(match.group(1), []).append((match.group(2) or "", value))
    return metrics


def from_prometheus(text: str) -> SpecCounts | None:
    """The spec-decode counters of a ``/metrics`` page (vLLM's or llama-server's names); None when it has
    none (no speculation)."""
    metrics = parse_prometheus(text)
    prefix = next((p for p in _PREFIXES if f"{p}num_drafts_total" in metrics), None)
    if prefix is None:
        return None

    def total(name: str) -> int | None:
        entries = metrics.get(f"{prefix}{name}_total")
        return None if entries is None else int(round(sum(v for _, v in entries)))

    drafts = total("num_drafts")
    per_pos: dict[int, float] = {}
    for labels, value in metrics.get(f"{prefix}num_accepted_tokens_per_pos_total", []):
        found = _POSITION.search(labels)
        if found is not None:
            position = int(found.group(1))
            per_pos[position] = per_pos.get(position, 0.0) + value
    width = max(per_pos) + 1 if per_pos and max(per_pos) < 64 else 0
    return SpecCounts(drafts, total("num_draft_tokens"), total("num_accepted_tokens"),
                      tuple(int(round(per_pos.get(i, 0.0))) for i in range(width)))  # fmt: skip

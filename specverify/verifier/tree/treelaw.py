"""The result type of the exact tree laws: :class:`TreeLaw` and the quantities derived from it.

One entry per slot of a fixed tree (:func:`specverify.verifier.tree.laws.conditional_round_law`,
batched) or per (node, path tokens) visit of a round averaged over the drafts
(:func:`specverify.verifier.tree.laws.round_law`).  Derived here: the lossless error, the
next-token law at every entry, the law of the accepted length, acceptance per depth, and
the law of the emitted sequence -- what the tree battery compares its counts with.

Shapes: M entries, V vocabulary, D maximum depth (leading batch dimensions allowed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument

__all__ = ["TreeLaw"]


@dataclass(frozen=True, eq=False)
class TreeLaw:
    """Exact one-round law of a tree walk, one entry per slot (fixed trees) or per visit.

    Attributes
    ----------
    reach : Tensor, shape (..., M)
        P(the walk reaches the entry's node).
    stop : Tensor, shape (..., M, V)
        P(the walk stops there and emits final token y): with M = N+1 slots, the joint law
        of (path end node, final token).
    next_law : Tensor, shape (..., M, V)
        P(the walk reaches the entry and the next emitted token -- the accepted child's or
        the final -- is y); a lossless rule gives ``reach * target``.
    target : Tensor, shape (..., M, V)
        The target's row at the entry (renormalised).
    depth : Tensor, shape (..., M), long
        Accepted tokens on the way to the entry (0 at the root; padding slots 0, reach 0).
    prefix : Tensor, shape (..., M, D), long
        The path's tokens, -1 padded.
    slot : Tensor, shape (..., M), long
        The entry's slot (0 root, n+1 node n).
    """

    reach: torch.Tensor
    stop: torch.Tensor
    next_law: torch.Tensor
    target: torch.Tensor
    depth: torch.Tensor
    prefix: torch.Tensor
    slot: torch.Tensor

    @property
    def max_depth(self) -> int:
        return self.prefix.shape[-1]

    def error(self) -> float:
        """max |next_law - reach * target|: 0 (up to rounding) for a lossless rule."""
        return float((self.next_law - self.reach[..., None] * self.target).abs().max()) if self.reach.numel() else 0.0

    def next_token_law(self) -> torch.Tensor:
        """The law of the next emitted token at each entry, ``next_law / reach`` (0 where unreached); (..., M, V)."""
        reach = self.reach[..., None]
        return torch.where(reach > 0, self.next_law / torch.where(reach > 0, reach, 1.0), 0.0)

    def _by_depth(self, values: torch.Tensor) -> torch.Tensor:
        onehot = torch.nn.functional.one_hot(self.depth, self.max_depth + 1).to(torch.float64)  # (..., M, D+1)
        return (values[..., None] * onehot).sum(-2)  # (..., D+1)

    def accepted_length_law(self) -> torch.Tensor:
        """P(accepted depth = d), d = 0..D; shape (..., D+1); num_emitted = d + 1."""
        return self._by_depth(self.stop.sum(-1))

    def reach_by_depth(self) -> torch.Tensor:
        """P(accepted depth >= d), d = 0..D; shape (..., D+1) (entry 0 is 1)."""
        return self._by_depth(self.reach)

    def acceptance_by_depth(self) -> torch.Tensor:
        """P(accepted depth >= d | accepted depth >= d-1), d = 1..D; shape (..., D) (0 where unreached)."""
        reach = self.reach_by_depth()
        above = reach[..., :-1]
        return torch.where(above > 0, reach[..., 1:] / torch.where(above > 0, above, 1.0), 0.0)

    def expected_accepted_length(self) -> torch.Tensor:
        """E[accepted depth] = sum_{d >= 1} P(depth >= d); shape (...)."""
        return self.reach_by_depth()[..., 1:].sum(-1)

    def sequences(self) -> dict:
        """The law of the emitted sequence (accepted tokens + final) of an unbatched law, as {tuple: prob}."""
        if self.reach.ndim != 1:
            raise InvalidArgument(f"sequences() needs an unbatched law, got reach of shape {tuple(self.reach.shape)}")
        law: defaultdict[tuple[int, ...], float] = defaultdict(float)
        for m in range(self.reach.shape[0]):
            if not self.reach[m] > 0:
                continue
            prefix = tuple(int(t) for t in self.prefix[m, : int(self.depth[m])])
            for y in self.stop[m].nonzero().flatten().tolist():
                law[prefix + (y,)] += float(self.stop[m, y])
        return dict(law)

    def by_prefix(self) -> dict:
        """Per emitted context of an unbatched law: ``{path tokens: (P(reach), next-token law (V,))}``.

        Entries with the same path tokens (duplicate siblings under i.i.d. drafting) are
        pooled; for a lossless rule each law equals the target's row after those tokens.
        """
        if self.reach.ndim != 1:
            raise InvalidArgument(f"by_prefix() needs an unbatched law, got reach of shape {tuple(self.reach.shape)}")
        reach: defaultdict[tuple[int, ...], float] = defaultdict(float)
        nexts: dict[tuple[int, ...], torch.Tensor] = {}
        for m in range(self.reach.shape[0]):
            if not self.reach[m] > 0:
                continue
            prefix = tuple(int(t) for t in self.prefix[m, : int(self.depth[m])])
            reach[prefix] += float(self.reach[m])
            nexts[prefix] = nexts[prefix] + self.next_law[m] if prefix in nexts else self.next_law[m].clone()
        return {prefix: (mass, nexts[prefix] / mass) for prefix, mass in reach.items()}

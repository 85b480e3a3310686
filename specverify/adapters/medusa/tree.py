"""Tree-verifier adapter around Medusa's typical acceptance on a tree of candidate paths.

Medusa (Cai et al. 2024, arXiv 2401.10774; PyPI ``medusa-llm``) verifies a *tree* of
candidate continuations: ``generate_candidates`` lays the tree out as candidate paths,
``tree_decoding`` gathers the target's logits along them
(``logits = tree_logits[0, retrieve_indices]``) and ``evaluate_posterior`` accepts, per
path, the longest prefix whose every token x has ``p(x) > min(posterior_threshold,
posterior_alpha * exp(-H(p)))`` (``H(p) = -sum p log(p + 1e-5)``), keeps the longest
accepted prefix over all paths and breaks ties by likelihood (``sum log p`` of the
accepted tokens; the first such path in ``retrieve_indices`` order on exact ties).  The
candidates are deterministic (top-k of each Medusa head), so the rule reads no draft law:
the walk is a deterministic function of the tree and the target rows, followed by one
draw (:mod:`specverify.adapters.medusa` for the chain path and the ``next_token`` rules).

Layout: Medusa and EAGLE share it (:mod:`specverify.adapters.layouts`).  Per protocol
row, ``retrieve_indices`` = :func:`~specverify.adapters.layouts.to_eagle` (tree position
n+1 = node n, -1 padding of shorter paths; the batch's all -1 padding rows are dropped),
``candidates`` = :func:`~specverify.adapters.layouts.eagle_candidates` with the root's
token 0 (never read) and ``logits = slot_logits[retrieve_indices]`` with
``slot_logits = temperature * log target_probs``, so ``softmax(logits / temperature)`` gives
back the harness' (already processed) target law.  Medusa's own sparse trees (the GitHub
sources after ``medusa-llm`` 0.1, whose ``medusa_choices`` are lists of paths) pad
``retrieve_indices`` with -1 and ``tree_candidates`` with token 0, so a padded position of a
short path reads the *last tree slot's* logits and proposes token 0 after the path's leaf;
the position right after the leaf is judged by the leaf's own law.  ``padding`` chooses:

* ``"unreachable"`` (default) -- the rule on the tree as drawn: the padding token is an
  extra vocabulary entry V with logit -inf (probability 0: the softmax, the entropy and
  every real token's probability are unchanged), which is never accepted;
* ``"medusa"`` -- Medusa's sparse-tree padding (token 0, the last slot's logits).  If Medusa
  then accepts past a path's leaf it has emitted a token that is not in the tree, which the
  protocol cannot express: the call raises :class:`ImplementationError` naming the row.
  ``medusa-llm`` 0.1 builds only full Cartesian trees (``medusa_choices`` a list of top-k per
  head, every path of full depth), where padding never arises and the two agree.

Shapes: B batch, N nodes, V vocabulary, P paths (leaves) of a row, D maximum depth.
"""

from __future__ import annotations

import torch

from specverify.adapters.layouts import eagle_candidates, from_eagle_outputs, to_eagle
from specverify.adapters.medusa.chain import (
    ENTROPY_OFFSET,
    INSTALL,
    _load_evaluate_posterior,
    next_tokens,
    typical_options,
)
from specverify.adapters.runtime import torch_threads
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_generator
from specverify.protocols.tree import check_tree_inputs

__all__ = ["MedusaTreeVerifier", "typical_tree_verifier", "PADDING", "ENTROPY_OFFSET", "INSTALL"]

#: How padded positions of short paths are laid out (see the module docstring).
PADDING = ("unreachable", "medusa")


class MedusaTreeVerifier:
    """``medusa.model.utils.evaluate_posterior`` on the protocol's trees, behind the tree-verifier protocol.

    Parameters
    ----------
    posterior_threshold : float > 0, default 0.09
        Medusa's epsilon (the hard threshold).
    posterior_alpha : float > 0, default 0.3
        Medusa's delta (scales ``exp(-H(p))``).
    temperature : float > 0, default 1.0
        Passed to ``evaluate_posterior``; logits are ``temperature * log p``.
    next_token : {"typical", "greedy"}
        The token after the accepted prefix (:func:`specverify.adapters.medusa.next_tokens`).
    padding : {"unreachable", "medusa"}
        Layout of the padded positions of short paths (see the module docstring).
    dtype : torch dtype or its name, default "float32"
        Dtype of the logits handed to Medusa.
    num_threads : int or None, default 1
        torch intra-op threads during the row loop (restored afterwards).

    Notes
    -----
    Every protocol mode is accepted: typical acceptance reads no draft law (the natural modes
    are ``"topk"``, Medusa's deterministic top-k children, and ``"any"``).  Rows are verified
    one at a time (dim 0 of ``evaluate_posterior`` is the paths of one sequence).
    """

    def __init__(
        self,
        *,
        posterior_threshold: float = 0.09,
        posterior_alpha: float = 0.3,
        temperature: float = 1.0,
        next_token: str = "typical",
        padding: str = "unreachable",
        dtype="float32",
        num_threads: int | None = 1,
    ):
        vars(self).update(
            typical_options(posterior_threshold, posterior_alpha, temperature, next_token, dtype, num_threads)
        )
        if padding not in PADDING:
            raise InvalidArgument(f"padding must be one of {PADDING}, got {padding!r}")
        self.padding = padding
        self._evaluate_posterior = _load_evaluate_posterior()

    def __repr__(self) -> str:
        return (
            f"MedusaTreeVerifier(posterior_threshold={self.posterior_threshold:g}, "
            f"posterior_alpha={self.posterior_alpha:g}, temperature={self.temperature:g}, "
            f"next_token={self.next_token!r}, padding={self.padding!r}, dtype={self.dtype})"
        )

    def layout(self, target_probs: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor):
        """Medusa's inputs for a batch: ``(retrieve_indices (B, P, D+1), candidates (B, P, D+1), slot_logits)``.

        ``slot_logits`` is (B, N+1, V) for ``padding="medusa"`` and (B, N+1, V+1) with a -inf
        last column for ``"unreachable"``; ``candidates`` carries the padding token (0 or V)
        on padded positions.  Row b's path logits are ``slot_logits[b][retrieve_indices[b]]``.
        """
        V = target_probs.shape[-1]
        ri = to_eagle(parents)  # (B, P, D+1)
        candidates = eagle_candidates(tokens, ri)  # (B, P, D+1), -1 on padding
        logits = target_probs.to(self.dtype).log() * self.temperature  # (B, N+1, V), log 0 = -inf
        if self.padding == "unreachable":
            logits = torch.cat([logits, torch.full_like(logits[..., :1], float("-inf"))], -1)  # (B, N+1, V+1)
            pad_token = V
        else:
            pad_token = 0
        return ri, torch.where(candidates >= 0, candidates, pad_token), logits

    def verify_tree(self, target_probs, draft_probs, tokens, parents, *, mode, generator):
        """Verify each row with ``evaluate_posterior``; see :mod:`specverify.protocols.tree` for the contract.

        Returns
        -------
        emitted : Tensor (B, D+1) long
        num_emitted : Tensor (B,) long
        path : Tensor (B, D) long
        """
        B, N, V = check_tree_inputs(target_probs, draft_probs, tokens, parents, mode)
        check_generator("generator", generator)
        device = target_probs.device
        target_probs, tokens, parents = target_probs.cpu(), tokens.cpu().long(), parents.cpu().long()
        ri, candidates, slot_logits = self.layout(target_probs, tokens, parents)
        best = torch.empty(B, dtype=torch.long)  # (B,)
        accepted = torch.empty(B, dtype=torch.long)  # (B,)
        with torch_threads(self.num_threads), torch.no_grad():
            for b in range(B):
                real = ri[b, :, 0] == 0  # (P,) the batch pads rows with fewer paths with all -1 rows
                best[b], accepted[b] = self._row(b, slot_logits[b][ri[b, real]], candidates[b, real], ri[b, real])
        slots = ri[torch.arange(B), best, accepted]  # (B,) the slot after the accepted prefix (0 = root)
        rows = target_probs[torch.arange(B), slots]  # (B, V)
        final = next_tokens(rows, self.next_token, self.posterior_threshold, self.posterior_alpha, generator)
        emitted, num_emitted, path = from_eagle_outputs(ri, best, accepted, final.cpu(), tokens)
        return emitted.to(device), num_emitted.to(device), path.to(device)

    __call__ = verify_tree

    def _row(self, b: int, logits: torch.Tensor, candidates: torch.Tensor, ri: torch.Tensor) -> tuple[int, int]:
        """``(best_candidate, accept_length)`` of one row: logits (P, D+1, V'), candidates and ri (P, D+1)."""
        P, W = candidates.shape
        try:
            best, length = self._evaluate_posterior(
                logits, candidates, self.temperature, self.posterior_threshold, self.posterior_alpha
            )
            best, length = int(best), int(length)
        except Exception as exc:  # the implementation under test failed
            raise ImplementationError(
                f"medusa evaluate_posterior raised on row {b}: {type(exc).__name__}: {exc}", row=b
            ) from exc
        if not (0 <= best < P and 0 <= length < W):
            raise ImplementationError(
                f"medusa evaluate_posterior returned best_candidate={best}, accept_length={length} on row {b} "
                f"for {P} paths of depth <= {W - 1}",
                row=b,
            )
        depth = int((ri[best, 1:] >= 0).sum())
        if length > depth:
            raise ImplementationError(
                f"medusa evaluate_posterior accepted {length} tokens on path {best} of row {b}, whose leaf is at depth "
                f"{depth}: the padding token 0 after the leaf was accepted (padding='medusa', Medusa's sparse-tree "
                "layout); the emitted token is not in the tree",
                row=b,
            )
        return best, length


def typical_tree_verifier(
    *,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    temperature: float = 1.0,
    next_token: str = "typical",
    padding: str = "unreachable",
    dtype="float32",
    num_threads: int | None = 1,
) -> MedusaTreeVerifier:
    """Factory for ``--tree-verifier specverify.adapters.medusa.tree:typical_tree_verifier`` (options as keywords)."""
    return MedusaTreeVerifier(
        posterior_threshold=posterior_threshold,
        posterior_alpha=posterior_alpha,
        temperature=temperature,
        next_token=next_token,
        padding=padding,
        dtype=dtype,
        num_threads=num_threads,
    )

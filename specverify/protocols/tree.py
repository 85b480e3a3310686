"""The tree-verifier protocol: inputs, their validation, output validation, uniforms-in kernels.

A tree verifier is a plain callable::

    verify_tree(target_probs (B, N+1, V), draft_probs (B, N+1, V) | None, tokens (B, N) long,
                parents (B, N) long, *, mode: str, generator)
        -> (emitted (B, D+1) long, num_emitted (B,) long, path (B, D) long)

Per row b there are N draft *nodes* n = 0..N-1; slot 0 is the root (the committed
prefix) and slot n+1 is node n, so ``target_probs[b, 0]`` is the target's law at the
root and ``target_probs[b, n+1]`` its law after the path to node n; ``draft_probs`` is
indexed the same way and holds the law the children of a slot were drawn from.
``parents[b, n]`` is the parent *node* of node n, :data:`ROOT` (-1) for a child of the
root and :data:`PAD` (-2) for a padding node (ragged or dynamic trees whose shape differs
per row; padding may sit anywhere).  Real nodes are topologically ordered
(``parents[b, n] < n``) and siblings are verified in index order.  ``mode`` says how the
children were drawn (:data:`MODES`): ``"iid"`` (i.i.d. from q, with replacement),
``"wor"`` (without replacement), ``"topk"`` (deterministic distinct children; q is
irrelevant) and ``"any"`` (target-only rules, nothing assumed).

The verifier returns the accepted path as node indices (-1 padded to D = the batch's
maximum depth), the emitted tokens (the path's tokens, then one correction or bonus
token; entries past ``num_emitted`` are ignored) and ``num_emitted`` = accepted depth + 1.

Kernels that take their uniforms as a tensor (SGLang's ``tree_speculative_sampling_target_only``
takes ``uniform_samples (B, N+1)`` and ``uniform_samples_for_final_sampling (B,)``,
``sgl-kernel/csrc/speculative/speculative_sampling.cuh``) are made into protocol
verifiers by :func:`uniforms_in`; :func:`call_tree_verifier` is the one way a harness calls
any tree verifier (exceptions and protocol violations become ``ImplementationError``).

Shapes: B batch rows, N draft nodes, V vocabulary, D maximum depth, S maximum number of
children of one slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specverify.core.errors import ImplementationError, InvalidArgument, raised
from specverify.core.validation import check_generator, check_probs, check_shape

__all__ = [
    "PAD",
    "ROOT",
    "MODES",
    "TreeBatch",
    "TreeOutput",
    "check_tree_inputs",
    "check_mode",
    "node_depths",
    "children_table",
    "draw_uniforms",
    "uniforms_in",
    "check_tree_output",
    "call_tree_verifier",
]

#: ``parents`` value of a padding node.
PAD = -2
#: ``parents`` value of a child of the root.
ROOT = -1
#: How the children of an expanded node were drawn.
MODES = ("iid", "wor", "topk", "any")
#: Modes whose rules read ``draft_probs`` (for the others it may be None).
MODES_NEEDING_DRAFT = ("iid", "wor")


def check_mode(mode) -> str:
    """Return ``mode`` if it is one of :data:`MODES`, else raise InvalidArgument."""
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def _check_int_tensor(name: str, tensor, shape) -> torch.Tensor:
    check_shape(name, tensor, shape)
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise InvalidArgument(f"{name} must have an integer dtype, got {tensor.dtype}")
    return tensor


def check_parents(parents, B: int | None = None, N: int | None = None) -> torch.Tensor:
    """Validate a parent array (B, N): values in {PAD, ROOT} or [0, n), real nodes under real parents."""
    parents = _check_int_tensor("parents", parents, (B, N))
    if parents.numel() == 0:
        return parents
    parents = parents.long()
    B, N = parents.shape
    n = torch.arange(N, device=parents.device)  # (N,)
    bad = (parents < PAD) | (parents >= n[None])  # (B, N)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise InvalidArgument(
            f"parents[{b}, {i}] is {int(parents[b, i])}: a node's parent must be an earlier node (in [0, {i})), "
            f"{ROOT} (root) or {PAD} (padding)"
        )
    padded_parent = (parents >= 0) & (parents.gather(1, parents.clamp(min=0)) == PAD)  # (B, N)
    if bool(padded_parent.any()):
        b, i = (int(v) for v in padded_parent.nonzero()[0])
        raise InvalidArgument(
            f"parents[{b}, {i}] is {int(parents[b, i])}, a padding node (parents[{b}, {int(parents[b, i])}] = {PAD})"
        )
    return parents


def check_tree_inputs(target_probs, draft_probs, tokens, parents, mode) -> tuple[int, int, int]:
    """Validate the tree-verifier protocol's inputs; return ``(B, N, V)``.

    Checks shapes and dtypes, probability rows (:func:`~specverify.core.validation.check_probs`),
    ``draft_probs`` present for the modes that read it, ``parents`` (topological, PAD
    consistent) and the tokens of real nodes in [0, V) (padding nodes' tokens are ignored).
    """
    check_mode(mode)
    check_probs("target_probs", target_probs)
    if target_probs.ndim != 3 or target_probs.shape[1] < 1:
        raise InvalidArgument(f"target_probs must have shape (B, N+1, V), got {tuple(target_probs.shape)}")
    B, N1, V = target_probs.shape
    N = N1 - 1
    if draft_probs is None:
        if mode in MODES_NEEDING_DRAFT:
            raise InvalidArgument(f"draft_probs is None, but mode {mode!r} verifies with the draft law")
    else:
        check_shape("draft_probs", draft_probs, (B, N1, V))
        check_probs("draft_probs", draft_probs)
    parents = check_parents(parents, B, N)
    _check_int_tensor("tokens", tokens, (B, N))
    real = parents != PAD  # (B, N)
    bad = real & ((tokens < 0) | (tokens >= V))
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise InvalidArgument(f"tokens[{b}, {i}] is {int(tokens[b, i])}, outside the vocabulary [0, {V})")
    return B, N, V


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node (B, N) long: 1 for a child of the root, 0 for padding.

    ``parents`` must be valid (:func:`check_parents`); one pass over the nodes, batched over rows.
    """
    parents = parents.long()
    B, N = parents.shape
    if B > 1 and parents.stride(0) == 0:  # one tree expanded over the batch: compute it once
        return node_depths(parents[:1]).expand(B, -1)
    depth = torch.zeros(B, N, dtype=torch.long, device=parents.device)  # (B, N)
    for n in range(N):
        par = parents[:, n]  # (B,)
        above = depth.gather(1, par.clamp(min=0)[:, None]).squeeze(1)  # (B,)
        depth[:, n] = torch.where(par >= 0, above + 1, torch.where(par == ROOT, 1, 0))
    return depth


def children_table(parents: torch.Tensor) -> torch.Tensor:
    """Children of every slot in verification (index) order: (B, N+1, S) long, -1 padded.

    ``children[b, m, s]`` is the s-th child node of slot m (slot 0 the root, slot n+1 node n).
    """
    parents = parents.long()
    B, N = parents.shape
    if B > 1 and parents.stride(0) == 0:  # one tree expanded over the batch: compute it once
        return children_table(parents[:1]).expand(B, -1, -1)
    device = parents.device
    real = parents != PAD  # (B, N)
    position = torch.arange(N, device=device).expand(B, N)  # (B, N)
    # Sort the nodes by (parent, index): siblings become runs in index order; a node's rank
    # among its siblings is its distance from the start of its run.
    order = ((parents + 2) * (N + 1) + position).argsort(-1)  # (B, N)
    grouped = parents.gather(1, order)  # (B, N)
    starts = torch.ones_like(real)
    starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
    first = torch.where(starts, position, 0).cummax(-1).values  # (B, N)
    rank = torch.empty_like(parents).scatter_(1, order, position - first)  # (B, N)
    S = int(rank.masked_fill(~real, -1).max()) + 1 if N else 0
    # Scatter node n into column (parent + 1) * S + rank; padding nodes go to a spare last column.
    column = torch.where(real, (parents + 1) * S + rank, (N + 1) * S)  # (B, N)
    children = torch.full((B, (N + 1) * S + 1), -1, dtype=torch.long, device=device)  # (B, (N+1)*S + 1)
    children.scatter_(1, column, position.contiguous())
    return children[:, :-1].reshape(B, N + 1, S)


@dataclass(frozen=True, eq=False)
class TreeBatch:
    """One call's worth of tree-verifier inputs, validated on construction.

    Parameters
    ----------
    target_probs : Tensor, shape (B, N+1, V)
    draft_probs : Tensor, shape (B, N+1, V), or None for modes "topk" and "any"
    tokens : Tensor, shape (B, N), integer
    parents : Tensor, shape (B, N), integer
    mode : {"iid", "wor", "topk", "any"}
    """

    target_probs: torch.Tensor
    draft_probs: torch.Tensor | None
    tokens: torch.Tensor
    parents: torch.Tensor
    mode: str

    def __post_init__(self):
        check_tree_inputs(self.target_probs, self.draft_probs, self.tokens, self.parents, self.mode)

    @classmethod
    def trusted(cls, target_probs, draft_probs, tokens, parents, mode: str) -> TreeBatch:
        """A batch the suite built itself from validated tables and drafted trees: not checked again.

        The harness calls this every round; the verifier under test still validates what it
        receives, and its output is checked against the batch as usual.
        """
        batch = object.__new__(cls)
        for name, value in zip(
            ("target_probs", "draft_probs", "tokens", "parents", "mode"),
            (target_probs, draft_probs, tokens, parents, mode),
        ):
            object.__setattr__(batch, name, value)
        return batch

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(B, N, V)``."""
        B, N1, V = self.target_probs.shape
        return B, N1 - 1, V

    def depths(self) -> torch.Tensor:
        """Depth of every node (B, N), 0 for padding."""
        return node_depths(self.parents)

    def max_depth(self) -> int:
        """D: the largest depth of a real node in the batch (0 without real nodes)."""
        depths = self.depths()
        return int(depths.max()) if depths.numel() else 0

    def children(self) -> torch.Tensor:
        """:func:`children_table` of this batch, (B, N+1, S)."""
        return children_table(self.parents)


@dataclass(frozen=True, eq=False)
class TreeOutput:
    """A validated verifier output: emitted (B, D+1), num_emitted (B,), path (B, D), all long on CPU."""

    emitted: torch.Tensor
    num_emitted: torch.Tensor
    path: torch.Tensor


def draw_uniforms(B: int, N: int, *, generator: torch.Generator, device=None):
    """The uniforms a uniforms-in kernel gets: ``coins (B, N+1)`` then ``final_coins (B,)``, float64 in [0, 1).

    ``coins[b, m]`` belongs to slot m (root 0, node n at n+1): node n's own accept test, or
    one draw at slot m (see :func:`uniforms_in`; each coin drives at most one decision);
    ``final_coins[b]`` belongs to the final (correction or bonus) draw; the draw order is
    fixed, so the same seed gives the same uniforms.
    """
    coins = torch.rand((B, N + 1), generator=generator, dtype=torch.float64, device=device)  # (B, N+1)
    final_coins = torch.rand((B,), generator=generator, dtype=torch.float64, device=device)  # (B,)
    return coins, final_coins


def uniforms_in(kernel: Callable) -> Callable:
    """Make a protocol tree verifier from a kernel that takes its uniforms as tensors.

    Parameters
    ----------
    kernel : callable
        ``kernel(target_probs, draft_probs, tokens, parents, *, mode, coins, final_coins)``
        returning ``(emitted, num_emitted, path)``; ``coins (B, N+1)`` float64 holds one
        uniform per slot (SGLang's ``uniform_samples``) and ``final_coins (B,)`` one for
        the final draw (SGLang's ``uniform_samples_for_final_sampling``).  Each coin drives
        at most one random decision, so that decisions the rule needs independent are:

        * a rule that tests siblings one by one (SpecInfer, RRSw, top-k) tests node n with
          its own coin ``coins[:, n+1]`` -- every sibling test its own coin, never the coin of
          another node, of its sibling rank or of the slot being expanded;
        * a rule that makes one draw per expanded slot (sample-and-match's ``y ~ p``, SGLang's
          cumulative test of all children against one ``u``) uses that slot's coin
          ``coins[:, m]`` (root m = 0) for that one draw;
        * the correction or bonus draw uses ``final_coins``.

        A kernel that reuses a coin (e.g. the coin that accepted a node, again for one of its
        children) conditions one decision on another and is not lossless; nothing in the
        output shows it, so the battery's law tests are what catch it (the catalogue's
        ``coin_per_sibling_rank``).

    Returns
    -------
    callable
        ``verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator)`` that
        draws the uniforms with :func:`draw_uniforms` from ``generator`` (same seed, same
        uniforms) and calls ``kernel``.  The kernel is reachable as ``verify_tree.kernel``.
    """
    if not callable(kernel):
        raise InvalidArgument(f"kernel must be callable, got {kernel!r}")

    def verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator):
        check_generator("generator", generator)
        B, N1 = target_probs.shape[:2]
        coins, final_coins = draw_uniforms(B, N1 - 1, generator=generator, device=target_probs.device)
        return kernel(target_probs, draft_probs, tokens, parents, mode=mode, coins=coins, final_coins=final_coins)

    verify_tree.kernel = kernel  # type: ignore[attr-defined]
    verify_tree.__name__ = getattr(kernel, "__name__", "verify_tree")
    verify_tree.__doc__ = f"Uniforms-in adapter of {verify_tree.__name__} (see specverify.protocols.tree)."
    return verify_tree


# --------------------------------------------------------------------------- output


def _as_long(name: str, value, shape) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception:
            raise ImplementationError(
                f"tree verifier returned {name} as {type(value).__name__}, not a tensor"
            ) from None
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ImplementationError(f"tree verifier returned {name} with dtype {value.dtype} (expected an integer dtype)")
    if tuple(value.shape) != tuple(shape):
        raise ImplementationError(
            f"tree verifier returned {name} of shape {tuple(value.shape)} (expected {tuple(shape)})"
        )
    return value.detach().to(device="cpu", dtype=torch.long)


def check_tree_output(output, batch: TreeBatch) -> TreeOutput:
    """Check one tree-verifier output against the protocol; return it as a :class:`TreeOutput`.

    Checks: a triple of integer tensors of shapes (B, D+1), (B,), (B, D) with D the batch's
    maximum depth; ``num_emitted`` in [1, D+1]; ``path`` a root-down chain of real nodes of
    length ``num_emitted - 1`` and -1 after it; the emitted tokens before the last equal to
    the path's tokens; the last emitted token in [0, V).

    Raises
    ------
    ImplementationError
        naming the offending row and values, observed vs expected.
    """
    B, N, V = batch.shape
    D = batch.max_depth()
    if not isinstance(output, (tuple, list)) or len(output) != 3:
        raise ImplementationError(
            f"tree verifier must return (emitted, num_emitted, path), got {type(output).__name__}"
            + (f" of length {len(output)}" if isinstance(output, (tuple, list)) else "")
        )
    emitted = _as_long("emitted", output[0], (B, D + 1))
    num_emitted = _as_long("num_emitted", output[1], (B,))
    path = _as_long("path", output[2], (B, D))
    parents = batch.parents.detach().to("cpu", torch.long)  # (B, N)
    tokens = batch.tokens.detach().to("cpu", torch.long)  # (B, N)
    bad = (num_emitted < 1) | (num_emitted > D + 1)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ImplementationError(
            f"row {b}: num_emitted = {int(num_emitted[b])} outside [1, D+1] = [1, {D + 1}]", row=b
        )
    accepted = num_emitted - 1  # (B,)
    j = torch.arange(D)  # (D,)
    on_path = j[None] < accepted[:, None]  # (B, D)
    bad = ~on_path & (path != -1)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise ImplementationError(
            f"row {b}: path[{b}, {i}] = {int(path[b, i])} but num_emitted = {int(num_emitted[b])} "
            f"(path entries from index {int(accepted[b])} on must be -1)",
            row=b,
        )
    bad = on_path & ((path < 0) | (path >= N))
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise ImplementationError(
            f"row {b}: path[{b}, {i}] = {int(path[b, i])} is not a node index in [0, {N}) "
            f"(num_emitted = {int(num_emitted[b])}: the path must hold {int(accepted[b])} nodes)",
            row=b,
        )
    safe = path.clamp(min=0)  # (B, D)
    node_parent = parents.gather(1, safe) if N else torch.full_like(safe, PAD)  # (B, D)
    expected_parent = torch.cat([torch.full((B, 1), ROOT, dtype=torch.long), path[:, :-1]], 1)[:, :D]  # (B, D)
    bad = on_path & (node_parent != expected_parent)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        above = "the root" if i == 0 else f"path[{b}, {i - 1}] = {int(path[b, i - 1])}"
        actual = {PAD: "it is a padding node", ROOT: "its parent is the root"}.get(
            int(node_parent[b, i]), f"its parent is node {int(node_parent[b, i])}"
        )
        raise ImplementationError(
            f"row {b}: path[{b}, {i}] = {int(path[b, i])} is not a child of {above} ({actual}): "
            "the path must be a root-down chain of real nodes",
            row=b,
        )
    path_tokens = tokens.gather(1, safe) if N else torch.zeros_like(safe)  # (B, D)
    bad = on_path & (emitted[:, :D] != path_tokens)
    if bool(bad.any()):
        b, i = (int(v) for v in bad.nonzero()[0])
        raise ImplementationError(
            f"row {b}: emitted[{b}, {i}] = {int(emitted[b, i])} differs from the token {int(path_tokens[b, i])} "
            f"of the accepted node path[{b}, {i}] = {int(path[b, i])}",
            row=b,
        )
    last = emitted.gather(1, accepted[:, None]).squeeze(1)  # (B,)
    bad = (last < 0) | (last >= V)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ImplementationError(
            f"row {b}: the final emitted token emitted[{b}, {int(accepted[b])}] = {int(last[b])} is outside "
            f"the vocabulary [0, {V})",
            row=b,
        )
    return TreeOutput(emitted, num_emitted, path)


def call_tree_verifier(
    verify_tree, batch: TreeBatch, *, generator: torch.Generator, device=None, dtype=None
) -> TreeOutput:
    """Call ``verify_tree`` on ``batch``; an exception or a protocol violation becomes ``ImplementationError``.

    The verifier gets clones of the input tensors (kernels such as SGLang's write into
    ``draft_probs``), so ``batch`` is unchanged afterwards.  With ``device`` (not the CPU)
    or ``dtype`` (not float32) the clones are copies on that device, probabilities in
    that dtype; the output is copied back and validated against ``batch`` on the CPU.
    """
    check_generator("generator", generator)

    def copy(t, probs):
        if t is None:
            return None
        if device is None and (dtype is None or not probs):
            return t.clone()
        return t.to(device=device, dtype=dtype if probs else None, copy=True)

    try:
        output = verify_tree(
            copy(batch.target_probs, True),
            copy(batch.draft_probs, True),
            copy(batch.tokens, False),
            copy(batch.parents, False),
            mode=batch.mode,
            generator=generator,
        )
    except ImplementationError:
        raise
    except Exception as error:  # the implementation under test raised: report it, never crash
        raise raised("tree verifier", error) from error
    return check_tree_output(output, batch)

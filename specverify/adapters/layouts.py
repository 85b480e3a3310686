"""Converters between the protocols' layouts and the ones engines use.

The chain kernels' padded output (ids, -1 after the emitted ones: :func:`from_padded`) and, for trees:

**SGLang** (``sgl-kernel/csrc/speculative/eagle_utils.cu``, ``build_tree_efficient`` /
``VerifyTreeGreedy``; ``speculative_sampling.cuh``, ``TreeSpeculativeSamplingTargetOnly``):
a row has ``num_draft_tokens = N+1`` slots, slot 0 the verified root token and slot n+1
our node n -- the same slot indexing as the protocol's ``target_probs (B, N+1, V)``.
``retrive_index[b, i] = b * (N+1) + i`` is a slot's flat position (``predicts`` and
``accept_index`` hold flat positions), ``retrive_next_token[b, i]`` the slot of i's first
child and ``retrive_next_sibling[b, i]`` the slot of i's next sibling, -1 for none.
``build_tree_efficient`` walks the slots from last to first and pushes each onto its
parent's list, so siblings are linked in increasing slot order, which is the protocol's
verification order.  ``candidates (B, N+1)`` holds the slots' tokens.  The kernels write
``accept_index (B, num_speculative_tokens)`` (flat positions of the root and the accepted
slots), ``accept_token_num (B,)`` (accepted drafts) and ``predicts`` (at the flat position
of each accepted slot, the next emitted token).

**EAGLE** (SafeAILab/EAGLE ``eagle/model/utils.py``, ``generate_tree_buffers``,
``generate_candidates``, ``evaluate_posterior``): tree position 0 is the root token and
position n+1 our node n (positions are breadth-first, parents first).
``retrieve_indices (P, D+1)`` has one row per leaf path, ``[0, positions of the path...]``
padded with -1, rows sorted lexicographically with -1 after every index;
``cart_candidates = tree_candidates_ext[retrieve_indices]`` (the tokens, -1 on padding).
``evaluate_posterior`` returns ``best_candidate`` (a row) and ``accept_length`` (accepted
drafts), and the emitted drafts are that row's positions 1..accept_length.

Batches: SGLang's layout is batched as is; EAGLE's is per sequence, so :func:`to_eagle`
pads rows of the same batch to the same number of paths with all -1 rows.

Shapes: B batch, N nodes, D maximum depth, P paths (leaves), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_shape
from specverify.protocols.tree import PAD, ROOT, check_parents, children_table, node_depths

__all__ = [
    "from_padded",
    "SGLangTree",
    "to_sglang",
    "from_sglang",
    "sglang_candidates",
    "from_sglang_outputs",
    "sglang_target_only_kernel",
    "to_eagle",
    "from_eagle",
    "eagle_candidates",
    "from_eagle_outputs",
]


def _int_tensor(name: str, value, ndim: int) -> torch.Tensor:
    value = torch.as_tensor(value)
    check_shape(name, value, (None,) * ndim)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise InvalidArgument(f"{name} must have an integer dtype, got {value.dtype}")
    return value.long()


# --------------------------------------------------------------------------- SGLang


@dataclass(frozen=True, eq=False)
class SGLangTree:
    """SGLang's tree buffers, each (B, N+1) long: ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``."""

    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor


def to_sglang(parents) -> SGLangTree:
    """SGLang's first-child / next-sibling lists of a parent array (B, N).

    Padding nodes get -1 links and are reachable from no slot, as ``build_tree_efficient``
    leaves a node without a selected parent.
    """
    parents = check_parents(_int_tensor("parents", parents, 2))
    B, N = parents.shape
    device = parents.device
    children = children_table(parents)  # (B, N+1, S)
    S = children.shape[-1]
    index = torch.arange(B * (N + 1), device=device).view(B, N + 1)  # (B, N+1)
    next_token = torch.full((B, N + 1), -1, dtype=torch.long, device=device)  # (B, N+1)
    next_sibling = torch.full((B, N + 1), -1, dtype=torch.long, device=device)  # (B, N+1)
    if S:
        first = children[:, :, 0]  # (B, N+1)
        next_token = torch.where(first >= 0, first + 1, -1)
        following = torch.cat([children[:, :, 1:], torch.full_like(children[:, :, :1], -1)], -1)  # (B, N+1, S)
        b, m, s = (children >= 0).nonzero(as_tuple=True)
        after = following[b, m, s]
        next_sibling[b, children[b, m, s] + 1] = torch.where(after >= 0, after + 1, -1)
    return SGLangTree(index, next_token, next_sibling)


def from_sglang(retrive_next_token, retrive_next_sibling) -> torch.Tensor:
    """The parent array (B, N) of SGLang's linked lists (B, N+1); slots unreachable from the root are PAD.

    Raises
    ------
    InvalidArgument
        For links outside [-1, N], a cycle or a slot reached twice, a child slot not after its
        parent's, or siblings not linked in increasing slot order (the protocol verifies
        siblings in index order; renumber the slots first).
    """
    next_token = _int_tensor("retrive_next_token", retrive_next_token, 2).cpu()
    next_sibling = _int_tensor("retrive_next_sibling", retrive_next_sibling, 2).cpu()
    check_shape("retrive_next_sibling", next_sibling, tuple(next_token.shape))
    B, N1 = next_token.shape
    if N1 < 1:
        raise InvalidArgument(f"retrive_next_token must have N+1 >= 1 slots, got shape {tuple(next_token.shape)}")
    for name, links in (("retrive_next_token", next_token), ("retrive_next_sibling", next_sibling)):
        bad = (links < -1) | (links == 0) | (links >= N1)
        if bool(bad.any()):
            b, i = (int(v) for v in bad.nonzero()[0])
            raise InvalidArgument(
                f"{name}[{b}, {i}] is {int(links[b, i])}: links must be -1 or a slot in [1, {N1 - 1}]"
            )
    parents = torch.full((B, N1 - 1), PAD, dtype=torch.long)
    for b in range(B):
        seen = {0}
        stack = [0]
        while stack:
            slot = stack.pop()
            child, previous = int(next_token[b, slot]), -1
            while child != -1:
                if child in seen:
                    raise InvalidArgument(f"row {b}: slot {child} is reached twice (a cycle or a shared child)")
                if child <= slot or child <= previous:
                    raise InvalidArgument(
                        f"row {b}: slot {child} is linked as a child of slot {slot} after sibling slot {previous}: "
                        "children must come after their parent and siblings in increasing slot order"
                    )
                seen.add(child)
                parents[b, child - 1] = slot - 1
                stack.append(child)
                previous, child = child, int(next_sibling[b, child])
    return parents


def sglang_candidates(tokens, parents, root_tokens=None) -> torch.Tensor:
    """SGLang's ``candidates (B, N+1)``: the root token (default 0) then the nodes' tokens (0 on padding)."""
    parents = check_parents(_int_tensor("parents", parents, 2))
    tokens = _int_tensor("tokens", tokens, 2)
    check_shape("tokens", tokens, tuple(parents.shape))
    B = parents.shape[0]
    root = torch.zeros(B, 1, dtype=torch.long, device=tokens.device)
    if root_tokens is not None:
        root = _int_tensor("root_tokens", root_tokens, 1).view(B, 1).to(tokens.device)
    return torch.cat([root, torch.where(parents == PAD, 0, tokens)], 1)


def from_sglang_outputs(predicts, accept_index, accept_token_num, *, num_nodes: int, max_depth: int):
    """The protocol's ``(emitted (B, D+1), num_emitted (B,), path (B, D))`` from an SGLang kernel's outputs.

    Parameters
    ----------
    predicts : Tensor, shape (B * (N+1),)
        At the flat position of each accepted slot (the root included) the next emitted token.
    accept_index : Tensor, shape (B, W)
        Flat positions of the root and the accepted slots, in order.
    accept_token_num : Tensor, shape (B,)
        Accepted drafts per row.
    num_nodes : int
        N.
    max_depth : int
        D, the batch's maximum depth (the protocol's output width).

    Raises
    ------
    ImplementationError
        If a row accepted more than ``max_depth`` drafts or more than ``W - 1``.
    """
    predicts = _int_tensor("predicts", predicts, 1).cpu()
    accept_index = _int_tensor("accept_index", accept_index, 2).cpu()
    accepted = _int_tensor("accept_token_num", accept_token_num, 1).cpu()
    B, W = accept_index.shape
    N1, D = num_nodes + 1, max_depth
    if bool(((accepted < 0) | (accepted > min(D, W - 1))).any()):
        b = int(((accepted < 0) | (accepted > min(D, W - 1))).nonzero()[0])
        raise ImplementationError(
            f"row {b}: accept_token_num = {int(accepted[b])} outside [0, {min(D, W - 1)}] (max depth {D})", row=b
        )
    j = torch.arange(W)  # (W,)
    used = j[None] <= accepted[:, None]  # (B, W)
    flat = torch.where(used, accept_index, 0).clamp(0, predicts.shape[0] - 1)  # (B, W)
    emitted = torch.zeros(B, D + 1, dtype=torch.long)
    width = min(W, D + 1)
    emitted[:, :width] = torch.where(used, predicts[flat], 0)[:, :width]
    slots = accept_index - (torch.arange(B) * N1)[:, None]  # (B, W) local slots
    path = torch.full((B, D), -1, dtype=torch.long)
    on_path = (j[None, 1:] <= accepted[:, None])[:, :D]  # (B, min(W-1, D))
    path[:, : on_path.shape[1]] = torch.where(on_path, slots[:, 1 : 1 + on_path.shape[1]] - 1, -1)
    return emitted, accepted + 1, path


def sglang_target_only_kernel(
    kernel: Callable,
    *,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    pass_draft_probs: bool = False,
    prob_dtype: torch.dtype = torch.float32,
) -> Callable:
    """A uniforms-in kernel (for :func:`~specverify.protocols.tree.uniforms_in`) around SGLang's target-only kernel.

    ``kernel`` is called as sgl_kernel's ``tree_speculative_sampling_target_only(predicts,
    accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
    [draft_probs,] threshold_single=, threshold_acc=, deterministic=)``; versions that take
    ``draft_probs`` use it as the running "rejected mass" buffer, which SGLang's verify
    allocates as zeros, so ``pass_draft_probs=True`` passes zeros.  Coins become
    ``uniform_samples`` (the coin of the slot being expanded) and ``final_coins`` the final
    sampling's; they are cast to ``prob_dtype`` and kept below 1.
    """
    if not callable(kernel):
        raise InvalidArgument(f"kernel must be callable, got {kernel!r}")

    def coins_kernel(target_probs, draft_probs, tokens, parents, *, mode, coins, final_coins):
        B, N1, V = target_probs.shape
        device = target_probs.device
        layout = to_sglang(parents)
        depths = node_depths(parents.long())
        D = int(depths.max()) if depths.numel() else 0
        below_one = torch.nextafter(torch.ones((), dtype=prob_dtype), torch.zeros((), dtype=prob_dtype))
        args = [
            torch.zeros(B * N1, dtype=torch.int32, device=device),  # predicts
            torch.full((B, D + 1), -1, dtype=torch.int32, device=device),  # accept_index
            torch.zeros(B, dtype=torch.int32, device=device),  # accept_token_num
            sglang_candidates(tokens, parents).to(device),
            layout.retrive_index.to(device),
            layout.retrive_next_token.to(device),
            layout.retrive_next_sibling.to(device),
            torch.minimum(coins.to(prob_dtype), below_one).contiguous(),
            torch.minimum(final_coins.to(prob_dtype), below_one).contiguous(),
            target_probs.to(prob_dtype).contiguous(),
        ]
        if pass_draft_probs:
            args.append(torch.zeros(B, N1, V, dtype=prob_dtype, device=device))
        kernel(*args, threshold_single=threshold_single, threshold_acc=threshold_acc, deterministic=deterministic)
        return from_sglang_outputs(args[0], args[1], args[2], num_nodes=N1 - 1, max_depth=D)

    coins_kernel.__name__ = f"sglang[{getattr(kernel, '__name__', 'kernel')}]"
    return coins_kernel


# --------------------------------------------------------------------------- EAGLE


def to_eagle(parents) -> torch.Tensor:
    """EAGLE's ``retrieve_indices`` of a parent array (B, N): (B, P, D+1) long.

    Row b lists its leaf paths as ``[0, n_1+1, ..., n_d+1, -1, ...]`` sorted as
    ``generate_tree_buffers`` sorts them; rows with fewer leaves than the batch's P are
    padded with all -1 rows; a row without real nodes has the single path ``[0, -1, ...]``.
    """
    parents = check_parents(_int_tensor("parents", parents, 2)).cpu()
    B, N = parents.shape
    depths = node_depths(parents)  # (B, N)
    D = int(depths.max()) if depths.numel() else 0
    has_child = torch.zeros(B, N + 1, dtype=torch.bool)
    real = parents != PAD
    b, n = real.nonzero(as_tuple=True)
    has_child[b, parents[b, n] + 1] = True
    rows = []
    for b in range(B):
        paths = []
        for n in range(N):
            if parents[b, n] == PAD or has_child[b, n + 1]:
                continue
            path, node = [], n
            while node != ROOT:
                path.append(node + 1)
                node = int(parents[b, node])
            paths.append([0] + path[::-1] + [-1] * (D - len(path)))
        if not paths:
            paths = [[0] + [-1] * D]
        big = N + 5
        paths.sort(key=lambda row: [i if i >= 0 else big for i in row])
        rows.append(paths)
    P = max(len(p) for p in rows) if rows else 1
    out = torch.full((B, P, D + 1), -1, dtype=torch.long)
    for b, paths in enumerate(rows):
        out[b, : len(paths)] = torch.tensor(paths, dtype=torch.long)
    return out


def from_eagle(retrieve_indices, num_nodes: int | None = None) -> torch.Tensor:
    """The parent array (B, N) of EAGLE ``retrieve_indices`` (B, P, D+1) or (P, D+1); unlisted nodes are PAD.

    ``num_nodes`` (N) defaults to the largest position listed.  All -1 rows are padding.

    Raises
    ------
    InvalidArgument
        For a path not starting at 0, -1 before the end of a path, positions outside
        [1, N], a position listed under two different parents, or a child listed before its parent.
    """
    ri = _int_tensor("retrieve_indices", retrieve_indices, torch.as_tensor(retrieve_indices).ndim).cpu()
    if ri.ndim == 2:
        ri = ri[None]
    if ri.ndim != 3:
        raise InvalidArgument(f"retrieve_indices must have shape (B, P, D+1) or (P, D+1), got {tuple(ri.shape)}")
    B, P, W = ri.shape
    N = int(ri.max()) if num_nodes is None else int(num_nodes)
    padding_row = (ri == -1).all(-1)  # (B, P)
    bad = ~padding_row & (ri[..., 0] != 0)
    if bool(bad.any()):
        b, p = (int(v) for v in bad.nonzero()[0])
        raise InvalidArgument(f"retrieve_indices[{b}, {p}] starts with {int(ri[b, p, 0])}, not the root position 0")
    gap = (ri[..., 1:] >= 0) & (ri[..., :-1] < 0)  # (B, P, D) an index after padding
    root_again = (ri[..., 1:] == 0) & ~padding_row[..., None]  # (B, P, D)
    bad = ((ri < -1) | (ri > N)).any(-1) | (gap | root_again).any(-1)  # (B, P)
    if bool(bad.any()):
        b, p = (int(v) for v in bad.nonzero()[0])
        raise InvalidArgument(
            f"retrieve_indices[{b}, {p}] = {ri[b, p].tolist()} is not [0, positions in [1, {N}]..., -1 padding]"
        )
    above, below = ri[..., :-1], ri[..., 1:]  # (B, P, D)
    link = below >= 1
    bad = link & (below <= above)
    if bool(bad.any()):
        b, p, i = (int(v) for v in bad.nonzero()[0])
        raise InvalidArgument(
            f"retrieve_indices[{b}, {p}] = {ri[b, p].tolist()} lists position {int(below[b, p, i])} under "
            f"{int(above[b, p, i])}: children must come after their parent"
        )
    slot_parent = torch.full((B, N + 1), -9, dtype=torch.long)
    rows, paths, steps = link.nonzero(as_tuple=True)
    slot_parent[rows, below[rows, paths, steps]] = above[rows, paths, steps]
    bad = slot_parent[rows, below[rows, paths, steps]] != above[rows, paths, steps]
    if bool(bad.any()):
        k = int(bad.nonzero()[0])
        raise InvalidArgument(
            f"retrieve_indices[{int(rows[k])}] lists position {int(below[rows[k], paths[k], steps[k]])} "
            "under two different parents"
        )
    return torch.where(slot_parent[:, 1:] >= 0, slot_parent[:, 1:] - 1, PAD)


def eagle_candidates(tokens, retrieve_indices, root_tokens=None) -> torch.Tensor:
    """EAGLE's ``cart_candidates`` (B, P, D+1): the tokens along each path, -1 on padding (root token default 0)."""
    tokens = _int_tensor("tokens", tokens, 2)
    ri = _int_tensor("retrieve_indices", retrieve_indices, 3)
    B = tokens.shape[0]
    root = torch.zeros(B, 1, dtype=torch.long) if root_tokens is None else _int_tensor("root_tokens", root_tokens, 1)
    ext = torch.cat([root.view(B, 1), tokens, torch.full((B, 1), -1, dtype=torch.long)], 1)  # (B, N+2)
    flat = torch.where(ri >= 0, ri, ext.shape[1] - 1).view(B, -1)  # (B, P*(D+1))
    return ext.gather(1, flat).view(ri.shape)


def from_eagle_outputs(retrieve_indices, best_candidate, accept_length, final_token, tokens):
    """The protocol's ``(emitted, num_emitted, path)`` from ``evaluate_posterior``'s choice and the sampled token.

    Parameters
    ----------
    retrieve_indices : Tensor, shape (B, P, D+1)
    best_candidate, accept_length, final_token : Tensor, shape (B,)
        The chosen path row, the accepted drafts on it and the token drawn from ``sample_p``.
    tokens : Tensor, shape (B, N)
    """
    ri = _int_tensor("retrieve_indices", retrieve_indices, 3)
    B, P, W = ri.shape
    best = _int_tensor("best_candidate", best_candidate, 1)
    accepted = _int_tensor("accept_length", accept_length, 1)
    final = _int_tensor("final_token", final_token, 1)
    tokens = _int_tensor("tokens", tokens, 2)
    if bool(((best < 0) | (best >= P)).any()) or bool(((accepted < 0) | (accepted > W - 1)).any()):
        raise ImplementationError(f"best_candidate {best.tolist()} or accept_length {accepted.tolist()} out of range")
    D = W - 1
    row = ri[torch.arange(B), best]  # (B, D+1)
    j = torch.arange(D)
    path = torch.where(j[None] < accepted[:, None], row[:, 1:] - 1, -1)  # (B, D)
    emitted = torch.zeros(B, D + 1, dtype=torch.long)
    emitted[:, :D] = torch.where(path >= 0, tokens.gather(1, path.clamp(min=0)), 0)
    emitted.scatter_(1, accepted[:, None], final[:, None])
    return emitted, accepted + 1, path


def from_padded(output_token_ids, B: int, K: int, engine: str):
    """``(tokens (B, K+1) long, num_emitted (B,) long)`` from a kernel's ids padded with -1 after the emitted ones."""
    if isinstance(output_token_ids, (tuple, list)):
        output_token_ids = output_token_ids[0]
    if not isinstance(output_token_ids, torch.Tensor) or tuple(output_token_ids.shape) != (B, K + 1):
        shape = tuple(getattr(output_token_ids, "shape", ())) or type(output_token_ids).__name__
        raise ImplementationError(f"{engine} returned output_token_ids of shape {shape}, want ({B}, {K + 1})")
    ids = output_token_ids.long()  # (B, K+1)
    valid = ids >= 0  # (B, K+1) -1 is the placeholder
    num_emitted = valid.long().cumprod(-1).sum(-1)  # (B,) the emitted prefix
    return torch.where(valid, ids, 0), num_emitted

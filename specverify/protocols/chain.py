"""The chain-verifier protocol, enforced: calls, output validation, determinism.

``verify(target_probs (B, K+1, V), draft_probs (B, K, V), draft_tokens (B, K), *,
generator) -> (tokens (B, K+1) long, num_emitted (B,) long)``; entries past
``num_emitted`` are ignored.  Everything a verifier under test can get wrong (an
exception, a wrong shape or dtype, ``num_emitted`` outside [1, K+1], out-of-vocabulary
ids (vLLM GHSA-8wr5), an emitted prefix that is not the drafts, different outputs for
the same generator seed) becomes an :class:`~specverify.core.errors.ImplementationError`
naming the offending row, which the battery records in its report.

Shapes: B batch, K draft length, V vocabulary.
"""

from __future__ import annotations

import torch

from specverify.core.errors import ImplementationError, raised

__all__ = ["call_verifier", "check_determinism", "validate_verifier_output"]


def _describe(value) -> str:
    shape = tuple(getattr(value, "shape", ()))
    return f"{type(value).__name__} of shape {shape}, dtype {getattr(value, 'dtype', '?')}"


def _as_long(name: str, value, shape, device: torch.device) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception:
            raise ImplementationError(f"verifier returned {name} as {type(value).__name__}, not a tensor") from None
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise ImplementationError(f"verifier returned {name} with dtype {value.dtype} (expected an integer dtype)")
    if tuple(value.shape) != tuple(shape):
        raise ImplementationError(f"verifier returned {name} of shape {tuple(value.shape)} (expected {tuple(shape)})")
    return value.to(device=device, dtype=torch.long)


def validate_verifier_output(output, draft_tokens: torch.Tensor, vocab_size: int):
    """Check one verify call's output against the protocol; return ``(tokens, num_emitted)`` as long.

    Checks: a pair of integer tensors of shapes (B, K+1) and (B,); ``num_emitted``
    in [1, K+1]; emitted token ids in [0, V); the emitted draft prefix (positions
    < num_emitted - 1) equal to the drafted tokens.  Entries past ``num_emitted``
    are ignored, as the protocol says.  The checks run on the device of
    ``draft_tokens`` (one host sync): a few fused reductions decide that valid output is
    valid, and only output they cannot clear is checked entry by entry; the validated
    pair is copied to the CPU in one transfer.

    Raises
    ------
    ImplementationError
        naming the offending row and values.
    """
    B, K = draft_tokens.shape
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        raise ImplementationError(f"verifier must return (tokens, num_emitted), got {_describe(output)}")
    device = draft_tokens.device
    tokens = _as_long("tokens", output[0], (B, K + 1), device)
    num_emitted = _as_long("num_emitted", output[1], (B,), device)
    if B == 0:
        return tokens.cpu(), num_emitted.cpu()
    suspect = _suspect(tokens, num_emitted, draft_tokens, vocab_size)  # (,) bool
    if device.type != "cpu":  # one transfer: the pair and the flag
        packed = torch.cat([tokens.reshape(-1), num_emitted, suspect.long()[None]]).cpu()  # (B*(K+1) + B + 1,)
        n_tok = B * (K + 1)
        tokens, num_emitted = packed[:n_tok].view(B, K + 1), packed[n_tok : n_tok + B]
        if not bool(packed[-1]):
            return tokens, num_emitted
        draft_tokens = draft_tokens.cpu()
    elif not bool(suspect):
        return tokens, num_emitted
    _raise_first_violation(tokens, num_emitted, draft_tokens, vocab_size)
    return tokens, num_emitted  # only ignored entries (past num_emitted) were out of the vocabulary


def _suspect(tokens, num_emitted, draft_tokens, vocab_size: int) -> torch.Tensor:
    """0-dim bool: False when the output certainly satisfies the protocol (no host sync).

    ``num_emitted`` in [1, K+1], every entry of ``tokens`` (ignored ones too) in [0, V) and the
    emitted draft prefix equal to the drafts; True sends the output to the exact checks of
    :func:`_raise_first_violation` (an out-of-vocabulary entry past ``num_emitted`` is legal).
    """
    B, K = draft_tokens.shape
    n_low, n_high = torch.aminmax(num_emitted)
    t_low, t_high = torch.aminmax(tokens)
    j = torch.arange(K, device=tokens.device)  # (K,)
    bad_prefix = (j < (num_emitted[:, None] - 1)) & (tokens[:, :K] != draft_tokens)  # (B, K)
    return (n_low < 1) | (n_high > K + 1) | (t_low < 0) | (t_high >= vocab_size) | bad_prefix.any()


def _raise_first_violation(tokens, num_emitted, draft_tokens, vocab_size: int) -> None:
    """Raise :class:`ImplementationError` for the first protocol violation, if any (CPU tensors)."""
    B, K = draft_tokens.shape
    j = torch.arange(K + 1)  # (K+1,)
    bad_n = (num_emitted < 1) | (num_emitted > K + 1)  # (B,)
    if bool(bad_n.any()):
        b = int(bad_n.nonzero()[0])
        raise ImplementationError(
            f"row {b}: num_emitted = {int(num_emitted[b])} outside [1, K+1] = [1, {K + 1}]", row=b
        )
    emitted = j[None] < num_emitted[:, None]  # (B, K+1)
    bad_tok = emitted & ((tokens < 0) | (tokens >= vocab_size))  # (B, K+1)
    if bool(bad_tok.any()):
        b, i = (int(v) for v in bad_tok.nonzero()[0])
        raise ImplementationError(
            f"row {b}: emitted token {int(tokens[b, i])} at in-block position {i + 1} is outside the vocabulary [0, {vocab_size})",
            row=b,
        )
    bad_prefix = (j[None, :K] < (num_emitted[:, None] - 1)) & (tokens[:, :K] != draft_tokens)  # (B, K)
    if bool(bad_prefix.any()):
        b, i = (int(v) for v in bad_prefix.nonzero()[0])
        raise ImplementationError(
            f"row {b}: emitted token {int(tokens[b, i])} at in-block position {i + 1} differs from the accepted draft "
            f"{int(draft_tokens[b, i])} (num_emitted = {int(num_emitted[b])}: positions before the last must be drafts)",
            row=b,
        )


def call_verifier(verify, target_probs, draft_probs, draft_tokens, *, generator):
    """Call ``verify``; any exception becomes an :class:`ImplementationError`; validate the output."""
    try:
        output = verify(target_probs, draft_probs, draft_tokens, generator=generator)
    except ImplementationError:
        raise
    except Exception as exc:  # the implementation under test may raise anything
        raise raised("verifier", exc) from exc
    return validate_verifier_output(output, draft_tokens, target_probs.shape[-1])


def check_determinism(verify, target_probs, draft_probs, draft_tokens, *, seed: int) -> None:
    """Two calls with equal generator states (a generator of the inputs' device) must give equal outputs."""
    device = target_probs.device
    outs = [
        call_verifier(
            verify, target_probs, draft_probs, draft_tokens, generator=torch.Generator(device=device).manual_seed(seed)
        )
        for _ in range(2)
    ]
    (t1, n1), (t2, n2) = outs
    K1 = t1.shape[1]
    mask = torch.arange(K1)[None] < n1[:, None]
    diff = (n1 != n2) | ((t1 != t2) & mask).any(-1)
    if bool(diff.any()):
        b = int(diff.nonzero()[0])
        raise ImplementationError(
            f"row {b}: two calls with the same generator seed {seed} gave different outputs "
            f"({t1[b, : int(n1[b])].tolist()} vs {t2[b, : int(n2[b])].tolist()}): the verifier must draw "
            "its randomness from the generator argument only",
            row=b,
        )

"""Driving a decoder and a target under test: calls, output validation, determinism, conditionals.

Everything an implementation under test can get wrong is turned into an
:class:`~specverify.core.errors.ImplementationError` with a message a reader understands
without opening the code (observed vs expected, the offending row): an exception
raised by ``generate`` or ``next_token_probs``, a wrong shape, a non-integer dtype,
out-of-vocabulary tokens (vLLM GHSA-8wr5), probabilities that are not probability
rows, or different outputs for the same seed.  The orchestrator records these in
``Report.errors``; the suite itself never crashes on them.

Also here: the fixed prompts derived from the seed (:func:`specverify.core.seeds.derive_seed`)
and V, and the teacher-forced conditionals of a batch
of sampled continuations (the target's batched ``conditionals`` when it has one,
else ``next_token_probs`` looped over positions, batched over samples).

Shapes: N samples, T prompt tokens, L new tokens, V vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify.core.errors import ImplementationError, InvalidArgument, raised
from specverify.core.progress import ProgressTracker
from specverify.core.seeds import derive_seed
from specverify.core.validation import check_tokens

__all__ = [
    "make_prompts",
    "normalise_prompts",
    "generate_fn",
    "call_generate",
    "check_determinism",
    "vocab_size_of",
    "target_conditionals",
    "conditional_blocks",
    "summed_conditionals",
    "block_rows",
]

#: Prompt lengths drawn for derived prompts (inclusive range).
PROMPT_LEN = (3, 6)
#: Float64 entries of one block of teacher-forced conditionals (rows * L * V): 32 MiB.
CHUNK_ENTRIES = 1 << 22


def make_prompts(num_prompts: int, vocab_size: int, *, seed: int) -> list[torch.Tensor]:
    """``num_prompts`` fixed prompts (T,) long, derived only from ``seed`` and ``vocab_size``."""
    generator = torch.Generator().manual_seed(derive_seed(seed, 0xC0FFEE))
    prompts = []
    for _ in range(num_prompts):
        length = int(torch.randint(PROMPT_LEN[0], PROMPT_LEN[1] + 1, (1,), generator=generator))
        prompts.append(torch.randint(0, vocab_size, (length,), generator=generator))
    return prompts


def normalise_prompts(prompts, vocab_size: int | None) -> list[torch.Tensor]:
    """Validate a ``prompts=`` override: one 1-D token sequence or a sequence of them -> list of (T,) long."""
    if isinstance(prompts, torch.Tensor) and prompts.ndim == 1:
        prompts = [prompts]
    elif isinstance(prompts, (list, tuple)) and prompts and all(isinstance(x, (int, np.integer)) for x in prompts):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InvalidArgument(f"prompts must be a non-empty sequence of 1-D token sequences, got {prompts!r}")
    out = []
    for i, prompt in enumerate(prompts):
        tensor = torch.as_tensor(prompt)
        if tensor.ndim != 1 or tensor.numel() < 1:
            raise InvalidArgument(
                f"prompts[{i}] must be a non-empty 1-D token sequence, got shape {tuple(tensor.shape)}"
            )
        check_tokens(f"prompts[{i}]", tensor, vocab_size if vocab_size is not None else 2**62)
        if int(tensor.min()) < 0:
            raise InvalidArgument(f"prompts[{i}] holds negative token ids: {tensor.tolist()}")
        out.append(tensor.long().cpu())
    return out


def generate_fn(decoder, role: str = "decoder"):
    """The ``generate`` callable of a decoder object (or the decoder itself when it is a plain callable)."""
    fn = getattr(decoder, "generate", None)
    if callable(fn):
        return fn
    if callable(decoder):
        return decoder
    raise InvalidArgument(
        f"{role} must have a .generate(prompt, *, num_samples, max_new_tokens, seed) method, "
        f"got {type(decoder).__name__}"
    )


def vocab_size_of(*objects) -> int | None:
    """The first integer ``vocab_size`` attribute among ``objects`` (None if none has one)."""
    for obj in objects:
        value = getattr(obj, "vocab_size", None)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1:
            return int(value)
    return None


def _describe_call(role: str, prompt: torch.Tensor, num_samples: int, max_new_tokens: int, seed: int) -> str:
    return (
        f"{role}.generate(prompt={prompt.tolist()}, num_samples={num_samples}, "
        f"max_new_tokens={max_new_tokens}, seed={seed})"
    )


def call_generate(
    generate,
    prompt: torch.Tensor,
    *,
    num_samples: int,
    max_new_tokens: int,
    seed: int,
    vocab_size: int | None,
    role: str = "decoder",
) -> torch.Tensor:
    """Call ``generate`` and validate its output; return it as a CPU (N, L) long tensor.

    Raises
    ------
    ImplementationError
        If the call raised, or the output is not an integer (num_samples, max_new_tokens)
        array of token ids in [0, vocab_size).
    """
    call = _describe_call(role, prompt, num_samples, max_new_tokens, seed)
    try:
        out = generate(prompt.clone(), num_samples=num_samples, max_new_tokens=max_new_tokens, seed=seed)
    except Exception as error:  # the implementation under test raised: report it, never crash
        raise raised(call, error) from error
    if not isinstance(out, torch.Tensor):
        try:
            out = torch.as_tensor(np.asarray(out))
        except Exception:
            raise ImplementationError(f"{call} returned {type(out).__name__}, not a tensor of token ids") from None
    if tuple(out.shape) != (num_samples, max_new_tokens):
        raise ImplementationError(
            f"{call} returned shape {tuple(out.shape)}, expected ({num_samples}, {max_new_tokens})"
        )
    if out.is_floating_point() or out.is_complex() or out.dtype == torch.bool:
        raise ImplementationError(f"{call} returned dtype {out.dtype}, expected an integer dtype (torch.long)")
    out = out.detach().to("cpu", torch.long)
    upper = vocab_size if vocab_size is not None else 2**62
    bad = (out < 0) | (out >= upper)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        where = f"[0, {vocab_size})" if vocab_size is not None else "[0, inf)"
        raise ImplementationError(
            f"{call} returned token {int(out[row, col])} at row {row}, position {col + 1}, outside the vocabulary "
            f"{where} ({int(bad.sum())} such tokens)",
            row=row,
        )
    return out


def check_determinism(
    generate,
    prompt: torch.Tensor,
    *,
    num_samples: int,
    max_new_tokens: int,
    seed: int,
    vocab_size: int | None,
    role: str = "decoder",
) -> None:
    """Two calls with the same seed must return identical outputs; raise ImplementationError otherwise."""
    call = dict(num_samples=num_samples, max_new_tokens=max_new_tokens, seed=seed, vocab_size=vocab_size, role=role)
    first = call_generate(generate, prompt, **call)  # (N, L)
    second = call_generate(generate, prompt, **call)  # (N, L)
    if not torch.equal(first, second):
        diff = (first != second).any(1)  # (N,)
        row = int(diff.nonzero()[0])
        raise ImplementationError(
            f"{_describe_call(role, prompt, num_samples, max_new_tokens, seed)} is not deterministic: two calls "
            f"with the same seed differ in {int(diff.sum())} of {num_samples} rows (row {row}: "
            f"{first[row].tolist()} vs {second[row].tolist()})",
            row=row,
        )


def _check_target_rows(rows: torch.Tensor, shape: tuple, what: str) -> torch.Tensor:
    if not isinstance(rows, torch.Tensor):
        rows = torch.as_tensor(np.asarray(rows))
    if tuple(rows.shape) != shape:
        raise ImplementationError(f"target {what} returned shape {tuple(rows.shape)}, expected {shape}")
    if not rows.is_floating_point():
        raise ImplementationError(f"target {what} returned dtype {rows.dtype}, expected floating probabilities")
    rows = rows.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
        raise ImplementationError(f"target {what} returned NaN, infinite or negative probabilities")
    sums = rows.sum(-1)
    if bool(((sums - 1.0).abs() > 1e-4).any()):
        i = int(((sums - 1.0).abs() > 1e-4).flatten().nonzero()[0])
        raise ImplementationError(f"target {what} returned a row summing to {float(sums.flatten()[i]):.6g}, not 1")
    return rows / sums[..., None]  # renormalised in float64


def next_token_probs(target, prefix: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """``target.next_token_probs(prefix)`` validated: (B, V) float64 rows on the CPU."""
    try:
        rows = target.next_token_probs(prefix)
    except Exception as error:
        raise raised(f"target.next_token_probs(prefix of shape {tuple(prefix.shape)})", error) from error
    V = vocab_size if vocab_size is not None else (rows.shape[-1] if getattr(rows, "ndim", 0) == 2 else -1)
    return _check_target_rows(rows, (prefix.shape[0], V), "next_token_probs")


def target_conditionals(target, sequences: torch.Tensor, start: int, vocab_size: int) -> torch.Tensor:
    """Teacher-forced conditionals of tokens ``start..S-1`` of ``sequences`` (B, S): (B, S - start, V) float64.

    Uses the target's batched ``conditionals(sequences, start=...)`` when present, else
    ``next_token_probs`` once per position (batched over the rows).
    """
    B, S = sequences.shape
    L = S - start
    device = getattr(target, "device", None)
    seqs = sequences.to(device) if isinstance(device, torch.device) else sequences
    if callable(getattr(target, "conditionals", None)):
        try:
            rows = target.conditionals(seqs, start=start)
        except Exception as error:
            raise raised(f"target.conditionals(sequences of shape {(B, S)}, start={start})", error) from error
        return _check_target_rows(rows, (B, L, vocab_size), "conditionals")
    out = torch.empty(B, L, vocab_size, dtype=torch.float64)  # (B, L, V)
    for j in range(L):
        out[:, j] = next_token_probs(target, seqs[:, : start + j], vocab_size)
    return out


def block_rows(length: int, vocab_size: int, entries: int = CHUNK_ENTRIES) -> int:
    """Rows per block so that a block's (rows, length, V) float64 conditionals hold at most
    ``entries`` values (at least one row)."""
    return max(1, entries // max(1, length * vocab_size))


def conditional_blocks(target, prompt: torch.Tensor, tokens: torch.Tensor, vocab_size: int, *, rows: int | None = None):
    """Teacher-forced conditionals of ``tokens`` (N, L) after ``prompt`` (T,), in blocks of rows.

    Yields ``(start, block)``: ``block`` (b, L, V) float64 is
    :func:`target_conditionals` of rows ``start .. start + b - 1``, with
    ``b = rows`` (default :func:`block_rows`), so that peak memory is one block's, whatever N
    (the caller reduces each block to what its tests need before the next one is made).
    """
    N, L = tokens.shape
    T = prompt.numel()
    step = rows if rows is not None else block_rows(L, vocab_size)
    for start in range(0, N, step):
        chunk = tokens[start : start + step]  # (b, L)
        seqs = torch.cat([prompt.expand(chunk.shape[0], T), chunk], dim=1)  # (b, T + L)
        yield start, target_conditionals(target, seqs, T, vocab_size)  # (b, L, V)


def summed_conditionals(target, prompt: torch.Tensor, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Sum over the N rows of the teacher-forced conditionals of ``tokens`` (N, L): (L, V) float64,
    made block by block (:func:`conditional_blocks`)."""
    total = torch.zeros(tokens.shape[1], vocab_size, dtype=torch.float64)  # (L, V)
    for _, block in conditional_blocks(target, prompt, tokens, vocab_size):
        total += block.sum(0)
    return total


class ProgressTicker:
    """Progress in stages of named items (a decoder battery's prompts, a drafter audit's parts).

    ``tick(name)`` after each stage of ``name``; ``tick(name, finished=True)`` when ``name``
    ends early (an implementation error).  ``stages`` is ``[(name, number of stages)]`` in run
    order; ``progress`` is told as :class:`~specverify.core.progress.ProgressTracker` says
    (``done``/``total`` in stages), first before any stage (:meth:`begin`) and last with all
    done (:meth:`finish`).  A no-op without a callback.
    """

    def __init__(self, progress, stages):
        self.tracker = ProgressTracker(progress, [(name, n, 1) for name, n in stages], unit="stages")
        self.counts: dict[str, int] = {}

    def __call__(self, name: str, *, finished: bool = False) -> None:
        if finished:
            self.tracker.scenario_done(name)
            return
        stage = self.counts.get(name, 0)
        self.counts[name] = stage + 1
        self.tracker.group_done(name, stage)

    def begin(self) -> None:
        self.tracker.begin()

    def finish(self) -> None:
        self.tracker.finish()


def generate_on(generate, device: torch.device):
    """``generate`` called with its prompt on ``device`` (its output is copied back by :func:`call_generate`)."""

    def on_device(prompt, **options):
        return generate(prompt.to(device), **options)

    return on_device


class TargetOn:
    """A target queried with its prefixes on ``device``: ``next_token_probs`` and ``conditionals``.

    The rows come back to the CPU (float64) in one transfer per call through
    :func:`next_token_probs` / :func:`target_conditionals`.
    """

    def __init__(self, target, device: torch.device):
        self.inner, self.device = target, device
        size = getattr(target, "vocab_size", None)
        if size is not None:
            self.vocab_size = size
        if callable(getattr(target, "conditionals", None)):
            self.conditionals = lambda sequences, *, start: target.conditionals(sequences.to(device), start=start)

    def next_token_probs(self, prefix):
        return self.inner.next_token_probs(prefix.to(self.device))

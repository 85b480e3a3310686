"""What every adapter around third-party code shares: torch's process-wide state, the model cache,
the engine decoders' replay of repeated calls and their comparison with transformers.

Engines and kernels read torch's global settings; an adapter changes them for the length of
one call and puts them back, so the suite's own runs are unaffected.  Tiny models written for
engines live under one cache directory (:func:`cache_root`).  An engine decoder that is not
reproducible can replay a repeated call's first output (its ``memoize`` option,
:class:`OutputMemo`), and each engine's raw next-token laws are compared with transformers'
on the same weights by :func:`max_law_difference`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import torch

from specverify.core.validation import check_bool

__all__ = ["torch_threads", "cache_root", "OutputMemo", "max_law_difference", "missing_package"]


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (None: leave it alone)."""
    if num_threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def cache_root(root=None) -> Path:
    """Where tiny models are written: ``root``, else ``$SPECVERIFY_CACHE``, else ``~/.cache/specverify``."""
    return Path(root or os.environ.get("SPECVERIFY_CACHE", Path.home() / ".cache" / "specverify"))


class OutputMemo:
    """The first output of each repeated call, replayed: an engine decoder's ``memoize`` option.

    Diagnostic for engines that are not reproducible: with it ``check_decoder``'s determinism
    check cannot stop the statistical tests (the law is then tested on the first draw; the
    non-reproducibility itself is shown by the same configuration without it).  Copies go in
    and out, so a caller that changes a returned tensor changes nothing stored.

    Parameters
    ----------
    memoize : bool
        The option (validated); False stores nothing and finds nothing.
    """

    def __init__(self, memoize: bool):
        self.enabled = check_bool("memoize", memoize)
        self._outputs: dict[Hashable, torch.Tensor] = {}

    def lookup(self, key: Hashable) -> torch.Tensor | None:
        """A copy of the output stored for ``key`` (the call's normalised arguments), or None."""
        if self.enabled and key in self._outputs:
            return self._outputs[key].clone()
        return None

    def store(self, key: Hashable, tokens: torch.Tensor) -> torch.Tensor:
        """Keep a copy of ``tokens`` for ``key`` when enabled; return ``tokens``."""
        if self.enabled:
            self._outputs[key] = tokens.clone()
        return tokens


def max_law_difference(
    engine_laws: Callable[[torch.Tensor], torch.Tensor],
    reference_model,
    *,
    vocab_size: int,
    seed: int,
    num_sequences: int,
    length: int,
) -> float:
    """Largest |p_engine - p_transformers| over the raw next-token laws of random token sequences.

    Parameters
    ----------
    engine_laws : callable
        ``engine_laws(sequences (N, T) long) -> (N, T', V)`` float64: the engine's law of the
        token after each of the first T' <= T positions of every sequence.
    reference_model : transformers causal LM
        The same weights in transformers; its float32 logits, softmaxed in float64, are the reference.
    vocab_size, seed, num_sequences, length : int
        The sequences (N = ``num_sequences``, T = ``length``) are uniform over the vocabulary,
        drawn from a ``torch.Generator`` seeded with ``seed``.
    """
    generator = torch.Generator().manual_seed(seed)
    sequences = torch.randint(0, vocab_size, (num_sequences, length), generator=generator)  # (N, T)
    engine = engine_laws(sequences)  # (N, T', V)
    with torch.no_grad():
        reference = torch.softmax(reference_model(input_ids=sequences).logits.double(), -1)  # (N, T, V)
    difference = (engine - reference[:, : engine.shape[1]]).abs()  # (N, T', V)
    return float(difference.max()) if difference.numel() else 0.0


def missing_package(need: str, exc: ImportError) -> str:
    """The message of a kernel package that does not import: what is needed, and why the import failed.

    The package may be installed but fail to import (a dependency of its own is missing, or it was
    built for another torch); the underlying error says which.
    """
    return f"{need}; importing it failed with {type(exc).__name__}: {exc}"

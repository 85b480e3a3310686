"""``PKG.MOD:FACTORY`` entry points for ``specverify audit`` on the built-in implementations.

::

    specverify audit --decoder specverify.cli.factories:reference_decoder \\
                     --target  specverify.cli.factories:reference_target
    specverify audit --drafter specverify.cli.factories:zoo_drafter --drafter-option name=uniform \\
                     --target  specverify.cli.factories:table_target

Factories that must agree (decoder and target, drafter and target) take the same
``seed``/``vocab_size``/sampling keywords, so the same options give matching tables.
"""

from __future__ import annotations

import torch

from specverify.core import tables
from specverify.core.errors import InvalidArgument
from specverify.verifier import zoo
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler, TargetAdapter
from specverify_reference.grammar import GRAMMAR_KINDS, Grammar
from specverify_reference.models import make_pair
from specverify_reference.processors import SamplingConfig

__all__ = ["reference_decoder", "reference_target", "direct_sampler", "table_target", "zoo_drafter"]


#: The forward dtypes the reference factories accept, by option value.
FORWARD_DTYPES = {"float64": torch.float64, "float32": torch.float32}


#: Sampling options the reference factories take beside temperature, top-k, top-p and min-p
#: (:class:`~specverify_reference.processors.SamplingConfig`'s fields of the same names).
PENALTY_OPTIONS = (
    "engine",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "penalty_last_n",
)


def _sampling(temperature: float, top_k, top_p, min_p, options: dict) -> SamplingConfig:
    """The factories' :class:`SamplingConfig`; a ``json_schema``, ``regex`` or ``ebnf`` option is its grammar."""
    unknown = sorted(set(options) - set(PENALTY_OPTIONS) - set(GRAMMAR_KINDS))
    if unknown:
        raise InvalidArgument(f"unknown option(s) {', '.join(unknown)}; the sampling options are temperature, "
                              f"top_k, top_p, min_p, {', '.join(PENALTY_OPTIONS + GRAMMAR_KINDS)}")  # fmt: skip
    options = dict(options)
    grammars = [Grammar(kind, options.pop(kind)) for kind in GRAMMAR_KINDS if kind in options]
    if len(grammars) > 1:
        raise InvalidArgument(f"give at most one of {', '.join(GRAMMAR_KINDS)}, got {len(grammars)}")
    grammar = grammars[0] if grammars else None
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, grammar=grammar, **options)


def _forward_dtype(dtype: str) -> torch.dtype:
    """The tiny transformer's dtype.  float64 (the default) makes the sampled tokens the same on
    every CPU: float32 matrix products round differently under AVX-512, AVX2 and other BLAS
    builds, and a law moved by 1e-7 flips a token whenever a uniform falls that close to a CDF
    boundary (docs/reproducibility.md)."""
    if dtype not in FORWARD_DTYPES:
        raise InvalidArgument(f"dtype must be one of {sorted(FORWARD_DTYPES)}, got {dtype!r}")
    return FORWARD_DTYPES[dtype]


def _target_model(vocab_size: int, seed: int, dtype: str, temperature: float, top_k, top_p, min_p, options):
    """The seeded target transformer and its sampling configuration (the decoder's, for equal options)."""
    target, _ = make_pair(vocab_size=vocab_size, seed=seed, dtype=_forward_dtype(dtype))
    return target, _sampling(temperature, top_k, top_p, min_p, options)


def reference_decoder(
    *,
    vocab_size: int = 64,
    seed: int = 0,
    k: int = 4,
    temperature: float = 1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    drafter: str = "early_exit",
    greedy: bool = False,
    dtype: str = "float64",
    **penalties,
) -> SpeculativeDecoder:
    """The reference speculative decoder on a seeded tiny transformer pair (early-exit drafter), float64 forward.

    ``penalties``: ``engine``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``,
    ``logit_bias``, ``penalty_last_n`` (:class:`SamplingConfig`; the target's factory takes the same),
    and at most one grammar, ``json_schema``, ``regex`` or ``ebnf`` (its source, over the tiny
    model's :func:`~specverify_reference.grammar.synthetic_vocabulary`).
    """
    target, draft_model = make_pair(vocab_size=vocab_size, seed=seed, drafter=drafter, dtype=_forward_dtype(dtype))
    sampling = _sampling(temperature, top_k, top_p, min_p, penalties)
    return SpeculativeDecoder(target, draft_model, k=k, sampling=sampling, greedy=greedy)


def reference_target(
    *,
    vocab_size: int = 64,
    seed: int = 0,
    temperature: float = 1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    dtype: str = "float64",
    **penalties,
) -> TargetAdapter:
    """Exact processed conditionals of the target that :func:`reference_decoder` uses with the same options."""
    return TargetAdapter(*_target_model(vocab_size, seed, dtype, temperature, top_k, top_p, min_p, penalties))


def direct_sampler(
    *,
    vocab_size: int = 64,
    seed: int = 0,
    temperature: float = 1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    dtype: str = "float64",
    **penalties,
) -> DirectSampler:
    """Plain autoregressive sampling of the same target (the two-sample ``--reference``)."""
    return DirectSampler(*_target_model(vocab_size, seed, dtype, temperature, top_k, top_p, min_p, penalties))


def table_target(*, vocab_size: int = 16, seed: int = 0, kind: str = "peaked") -> tables.MarkovTable:
    """A seeded first-order Markov table target (exact conditionals)."""
    return tables.markov(vocab_size, kind, seed=seed, name=f"markov{vocab_size}-{kind}")


def zoo_drafter(*, name: str = "uniform", vocab_size: int = 16, seed: int = 0, kind: str = "peaked", **options):
    """A drafter from the zoo (:mod:`specverify.verifier.zoo`) for :func:`table_target` with the same options."""
    return zoo.make_drafter(name, table_target(vocab_size=vocab_size, seed=seed, kind=kind), **options)

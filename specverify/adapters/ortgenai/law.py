"""ONNX Runtime GenAI's sampling law in float64, its per-sample seeds and its model configurations.

Engine-free (no onnxruntime_genai import): what the decoder and the exact target of
:mod:`specverify.adapters.ortgenai.decoder` share, and what CI tests without the engine.

The law (:func:`processed_law`) is ``ComputeSampledCategorical`` of onnxruntime-genai's
``src/sampling_distribution.h``, which the plain sampler (``GreedySearch_Cpu::SampleTopK`` /
``SampleTopP`` / ``SampleTopKTopP`` in ``src/search.cpp``) and speculative decoding (draft rows in
``BaseSpeculativeStrategy::Propose``, target rows in ``ComputeTargetTokenSelection``) both call:

* ``do_sample=False``, ``top_k == 1`` or ``temperature == 0`` is greedy (``Generator::InitializeSamplingMethod``):
  the first index of the largest logit;
* ``top_k > 1``: the ``min(top_k, V)`` largest logits, ``softmax((s - max) / T)`` over them; with
  ``0 < top_p < 1`` also the shortest prefix (in descending order) whose cumulative probability
  reaches ``top_p`` (``cum >= top_p``, inclusive), renormalised;
* ``top_k == 0``: nucleus over the whole vocabulary, ``softmax((s - max) / T)`` and the shortest
  descending prefix with ``cum >= top_p * total`` (``FindNucleus``; for V <= 64 it computes this
  exact cutoff; for larger vocabularies a tail bound may keep a few extra tokens, which
  :func:`processed_law` does not reproduce, so it refuses V > 64 with ``0 < top_p < 1``).

``banned`` tokens get probability 0: the decoder masks the end-of-sequence token with
``min_length`` (``ApplyMinLengthToLogits`` sets its logit to the lowest float, whose exponential is 0).

The engine computes in float32; the law here is float64 of the same float32 logits, so a
top-p boundary within float32 rounding of ``top_p`` may fall on the other side (measure zero
for the tiny models' logits).
"""

from __future__ import annotations

import copy

import torch

from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_float, check_int

__all__ = [
    "MAX_SEED",
    "PAD_TOKEN",
    "MAX_DRAFT_TOKENS",
    "sampling_options",
    "processed_law",
    "sample_seeds",
    "tokens_from_rows",
    "plain_config",
    "speculative_config",
]

#: ``search.random_seed`` is a C++ int; -1 means "seed from std::random_device" (``CreateRandomGenerator``).
MAX_SEED = 2**31 - 1
#: No token id: the tiny models have no padding (see :func:`plain_config`).
PAD_TOKEN = -1
#: ``Speculative_Element::kMaxDraftTokens`` (``src/config.cpp``): max_draft_tokens is in [1, 16].
MAX_DRAFT_TOKENS = 16
#: The nucleus is exact for vocabularies up to 16 * 4 tokens (``FindNucleus``).
EXACT_NUCLEUS_VOCAB = 64


def sampling_options(temperature=1.0, top_k=0, top_p=1.0) -> dict:
    """Validate sampling options: temperature > 0, ``top_k`` >= 0 (0 off, 1 greedy), ``top_p`` in (0, 1] (1 off).

    ``temperature`` and ``top_p`` must be ints or floats (not bools, strings or tensors).
    """
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"{name} must be an int or a float, got {value!r}")
    temperature = check_float("temperature", temperature, minimum=0.0, exclusive_minimum=True)
    top_k = check_int("top_k", top_k, minimum=0)
    top_p = check_float("top_p", top_p, minimum=0.0, maximum=1.0, exclusive_minimum=True)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p)


def processed_law(logits: torch.Tensor, *, temperature=1.0, top_k=0, top_p=1.0, banned=()) -> torch.Tensor:
    """ORT GenAI's sampling law of each row of ``logits`` (B, V) -> (B, V) float64 (see the module docstring).

    ``banned`` token ids get probability 0 before anything else (the masked end-of-sequence token).
    Ties in the top-k boundary are broken by index (the engine's ``std::partial_sort`` leaves them
    unspecified; the tiny models' float32 logits have none).
    """
    o = sampling_options(temperature, top_k, top_p)
    if logits.ndim != 2:
        raise InvalidArgument(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    B, V = logits.shape
    scores = logits.detach().to(torch.float64).clone()  # (B, V)
    for token in banned:
        token = check_int("banned token", token, minimum=0, maximum=V - 1)
        scores[:, token] = float("-inf")
    k, p = o["top_k"], o["top_p"]
    if k == 1:  # greedy (InitializeSamplingMethod)
        out = torch.zeros_like(scores)  # (B, V)
        out[torch.arange(B), scores.argmax(-1)] = 1.0
        return out
    if k == 0 and p < 1.0 and V > EXACT_NUCLEUS_VOCAB:
        raise InvalidArgument(
            f"top_k=0 with top_p < 1 on V={V} > {EXACT_NUCLEUS_VOCAB}: the engine's FindNucleus uses a tail "
            "bound there that processed_law does not reproduce"
        )
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # (B, V)
    sorted_scores = scores.gather(-1, order)  # (B, V)
    m = min(k, V) if k > 1 else V
    kept = sorted_scores[:, :m]  # (B, m)
    probs = torch.softmax((kept - kept[:, :1]) / o["temperature"], dim=-1)  # (B, m)
    if p < 1.0:
        cum = probs.cumsum(-1)  # (B, m)
        # keep j + 1 tokens, j the first index with cum >= p (inclusive); at least one token
        first = (cum >= p).to(torch.int64).argmax(-1)  # (B,)
        reached = (cum >= p).any(-1)  # (B,)
        keep = torch.where(reached, first + 1, torch.full_like(first, m))  # (B,)
        mask = torch.arange(m).unsqueeze(0) < keep.unsqueeze(1)  # (B, m)
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    out = torch.zeros_like(scores)  # (B, V)
    out.scatter_(-1, order[:, :m], probs)
    return out


def sample_seeds(seed: int, num_samples: int) -> list[int]:
    """``num_samples`` distinct ``random_seed`` values in [0, 2**31 - 1] drawn from a generator seeded with ``seed``."""
    seed = check_int("seed", seed, minimum=0)
    n = check_int("num_samples", num_samples, minimum=1, maximum=2**30)
    generator = torch.Generator().manual_seed(seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for value in torch.randint(0, MAX_SEED + 1, (n - len(seeds),), generator=generator).tolist():  # (n',)
            if value not in seen:
                seen.add(value)
                seeds.append(value)
    return seeds


def tokens_from_rows(rows, *, num_samples: int, max_new_tokens: int, vocab_size: int) -> torch.Tensor:
    """Validate the engine's token-id rows -> (num_samples, max_new_tokens) long; else ImplementationError."""
    rows = [[int(t) for t in r] for r in rows]
    if len(rows) != num_samples:
        raise ImplementationError(f"ONNX Runtime GenAI returned {len(rows)} sequences, want {num_samples}")
    for i, row in enumerate(rows):
        if len(row) != max_new_tokens:
            raise ImplementationError(
                f"ONNX Runtime GenAI returned {len(row)} new tokens for sample {i}, want {max_new_tokens}: {row}"
            )
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ImplementationError(f"ONNX Runtime GenAI sample {i} holds token ids outside [0, {vocab_size}): {bad}")
    return torch.tensor(rows, dtype=torch.long).reshape(num_samples, max_new_tokens)  # (N, L)


def plain_config(builder_config: dict, *, eos_token_id: int, num_threads: int = 1) -> dict:
    """A model builder's ``genai_config.json`` with the end-of-sequence token, no pad token and one ORT thread."""
    eos_token_id = check_int("eos_token_id", eos_token_id, minimum=0)
    num_threads = check_int("num_threads", num_threads, minimum=1)
    config = copy.deepcopy(builder_config)
    try:
        model = config["model"]
        options = model["decoder"].setdefault("session_options", {})
    except (KeyError, TypeError, AttributeError) as error:
        raise InvalidArgument(f"not a genai_config with model.decoder: {error!r}") from error
    if not 0 <= eos_token_id < int(model.get("vocab_size", 0)):
        raise InvalidArgument(f"eos_token_id {eos_token_id} is outside the vocabulary of {model.get('vocab_size')}")
    # The pad id must be no token at all: the engine masks (attention 0) every prompt or generated
    # token equal to it (src/models/position_inputs.cpp), which changes the model's law.
    model["eos_token_id"] = model["bos_token_id"] = eos_token_id
    model["pad_token_id"] = PAD_TOKEN
    options["intra_op_num_threads"] = num_threads
    options["inter_op_num_threads"] = 1
    return config


def speculative_config(target: dict, draft: dict, *, max_draft_tokens: int = 4) -> dict:
    """The composite ``genai_config.json`` of base speculative decoding (``docs/SpeculativeDecoding.md``).

    ``target`` and ``draft`` are the two models' :func:`plain_config`; the composite lives in a
    directory that holds them as ``target/`` and ``draft/`` (0.18 rejects ``..`` in model paths).
    """
    k = check_int("max_draft_tokens", max_draft_tokens, minimum=1, maximum=MAX_DRAFT_TOKENS)
    if target["model"]["vocab_size"] != draft["model"]["vocab_size"]:
        raise InvalidArgument("target and draft must share the vocabulary")
    config = copy.deepcopy(target)
    config["model"]["decoder"]["filename"] = "target/" + target["model"]["decoder"]["filename"]
    config["model"]["draft"] = copy.deepcopy(draft["model"]["decoder"])
    config["model"]["draft"]["filename"] = "draft/" + draft["model"]["decoder"]["filename"]
    config["speculative"] = {"max_draft_tokens": k}
    return config

"""Tiny, randomly initialised Hugging Face Llama models for offline tests and demos.

No hub download: every model is built from a ``LlamaConfig`` and initialised by
transformers' own ``_init_weights`` (normal, std ``initializer_range``), which
draws from the *global* torch RNG.  To make a model a pure function of its seed
without touching the caller's randomness, construction runs inside
``torch.random.fork_rng()`` and seeds the forked global CPU RNG with
``torch.default_generator.manual_seed(seed)`` (what ``torch.manual_seed`` does on
CPU, without also queueing a CUDA seeding that ``fork_rng`` would not undo); the
caller's global RNG state is restored on exit.

The lm_head weights are multiplied by ``logit_scale`` after initialisation so that
next-token distributions are peaked (at the default 15: mean max-probability about
0.4, entropy about 1.9 nats at V=32) instead of the near-uniform ones a fresh
network produces.

The assistant of :func:`tiny_llama_pair` is the target truncated to its first
``assistant_layers`` decoder layers (same embeddings, final norm and lm_head,
hence the same tokenizer / vocabulary), optionally perturbed by Gaussian noise.
Truncation to one of two layers gives a moderate per-token acceptance
``sum_x min(p, q)`` of about 0.57 at the defaults.

References: H. Touvron et al., "LLaMA" (2023); transformers ``LlamaForCausalLM``.
"""

from __future__ import annotations

import torch

from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_float, check_int

try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "specverify.adapters.hf_models needs Hugging Face transformers: pip install 'specverify[hf]'"
    ) from exc

__all__ = ["tiny_llama", "tiny_llama_pair", "TRANSFORMERS_VERSION"]

TRANSFORMERS_VERSION = transformers.__version__


def _llama_config(
    *,
    vocab_size,
    num_hidden_layers,
    hidden_size,
    intermediate_size,
    num_attention_heads,
    num_key_value_heads,
    max_position_embeddings,
) -> LlamaConfig:
    # bos/eos/pad are None: the tiny vocabulary has no special tokens, generation never
    # stops early, and no embedding row is reserved as padding_idx.
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )


def tiny_llama(
    *,
    vocab_size: int = 32,
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 256,
    logit_scale: float = 15.0,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A tiny random ``LlamaForCausalLM`` in eval mode, float32, on CPU.

    The weights are a pure function of the arguments: transformers initialises
    them from the global torch RNG, so this function seeds that (CPU) RNG with
    ``torch.default_generator.manual_seed(seed)`` inside ``torch.random.fork_rng()``;
    the caller's global RNG state is left exactly as it was.

    Parameters
    ----------
    vocab_size, num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
    num_key_value_heads, max_position_embeddings : int
        The ``LlamaConfig`` fields.
    logit_scale : float
        Factor applied to the lm_head weights so distributions are peaked.
    seed : int
        Initialisation seed.
    """
    vocab_size = check_int("vocab_size", vocab_size, minimum=2)
    num_hidden_layers = check_int("num_hidden_layers", num_hidden_layers, minimum=1)
    num_attention_heads = check_int("num_attention_heads", num_attention_heads, minimum=1)
    num_key_value_heads = check_int("num_key_value_heads", num_key_value_heads, minimum=1)
    hidden_size = check_int("hidden_size", hidden_size, minimum=1)
    if hidden_size % num_attention_heads or num_attention_heads % num_key_value_heads:
        raise InvalidArgument(
            f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads}), "
            f"which must be divisible by num_key_value_heads ({num_key_value_heads})"
        )
    seed = check_int("seed", seed, minimum=0, maximum=2**63 - 1)
    logit_scale = check_float("logit_scale", logit_scale, minimum=0.0, exclusive_minimum=True)
    config = _llama_config(
        vocab_size=vocab_size,
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        intermediate_size=check_int("intermediate_size", intermediate_size, minimum=1),
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=check_int("max_position_embeddings", max_position_embeddings, minimum=2),
    )
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def tiny_llama_pair(
    *,
    vocab_size: int = 32,
    num_hidden_layers: int = 2,
    assistant_layers: int = 1,
    assistant_noise: float = 0.0,
    logit_scale: float = 15.0,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A target and a same-vocabulary assistant, both deterministic in ``seed``.

    The assistant copies the target's embeddings, final norm, lm_head and first
    ``assistant_layers`` decoder layers; with ``assistant_noise > 0`` every matrix
    then gets Gaussian noise of ``assistant_noise`` times its own standard
    deviation, drawn from a private ``torch.Generator`` seeded with ``seed + 1``
    (no global RNG involved).  The target is :func:`tiny_llama` with the same seed,
    so ``tiny_llama_pair(seed=s)[0]`` equals ``tiny_llama(seed=s, ...)``.

    Returns
    -------
    target, assistant : LlamaForCausalLM
        Both in eval mode, float32, CPU.
    """
    num_hidden_layers = check_int("num_hidden_layers", num_hidden_layers, minimum=1)
    assistant_layers = check_int("assistant_layers", assistant_layers, minimum=1, maximum=num_hidden_layers)
    assistant_noise = check_float("assistant_noise", assistant_noise, minimum=0.0)
    common = dict(vocab_size=vocab_size, logit_scale=logit_scale, max_position_embeddings=max_position_embeddings)
    target = tiny_llama(num_hidden_layers=num_hidden_layers, seed=seed, **common)
    assistant = tiny_llama(num_hidden_layers=assistant_layers, seed=seed, **common)
    state = assistant.state_dict()
    assistant.load_state_dict({name: value for name, value in target.state_dict().items() if name in state})
    if assistant_noise > 0:
        noise_gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for _, param in sorted(assistant.named_parameters()):
                if param.ndim == 2:
                    noise = torch.randn(param.shape, generator=noise_gen, dtype=param.dtype)
                    param.add_(noise * param.std() * assistant_noise)
    return target, assistant.eval()

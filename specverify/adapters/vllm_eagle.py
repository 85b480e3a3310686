"""A tiny seeded EAGLE-1 draft head for the tiny vLLM target, in EAGLE's own checkpoint layout.

EAGLE-1 (Li et al. 2024, SafeAILab/EAGLE ``eagle/model/cnets.py``, class ``Model`` with
``bias=True``) drafts from the target's last hidden state ``h_t`` and the embedding of the next
token: ``fc(cat(embed(x_{t+1}), h_t))`` then one Llama decoder layer whose input RMSNorm is
absent (layer 0), no final norm, and the *target's* ``lm_head``.  Its checkpoints hold exactly::

    embed_tokens.weight                      (V, H)    a copy of the target's (frozen in training)
    fc.weight                                (H, 2H)
    fc.bias                                  (H,)      only with "bias": true (ea_model's default)
    layers.0.self_attn.{q,k,v,o}_proj.weight (H, H)    (k/v: (kv_heads * head_dim, H))
    layers.0.mlp.{gate,up}_proj.weight       (I, H)
    layers.0.mlp.down_proj.weight            (H, I)
    layers.0.post_attention_layernorm.weight (H,)

and a ``config.json`` that is the target's ``LlamaConfig`` with ``num_hidden_layers = 1``,
``architectures = ["LlamaForCausalLM"]`` and ``"bias"`` (``ea_model.EaModel`` builds ``fc`` with
``bias=config["bias"]``, True when the key is absent; the released Llama heads have no
``fc.bias``, SafeAILab/EAGLE#141).
vLLM 0.32 loads such a directory with ``speculative_config={"method": "eagle", "model": dir}``:
``SpeculativeConfig`` wraps the config in ``EAGLEConfig`` (architecture ``EagleLlamaForCausalLM``,
``vllm/model_executor/models/llama_eagle.py``), prefixes every weight with ``model.``, shares the
target's ``lm_head`` (none in the checkpoint) and, since ``embed_tokens`` equals the target's,
its embedding too (``llm_base_proposer.py``, ``_maybe_share_embeddings``).  With
``fc_bias=True`` (``"bias": true``) vLLM 0.32 misreads the head: it builds ``fc`` without a bias
(``llama_eagle.py`` lines 110-118) and its loader ignores the unexpected ``fc.bias``
(``model_executor/models/utils.py`` line 458), while ``LlamaDecoderLayer`` reads ``config.bias``
as *attention* bias (``models/llama.py`` lines 268-271) and creates q/k/v/o biases the
checkpoint does not have, left uninitialised (``EagleLlamaForCausalLM.load_weights`` returns
None, so the loader's missing-weights check is skipped; ``reports/vllm/repro_eagle_bias_uninitialized.py``).

The weights make a draft that agrees with the target often but not always: ``fc`` maps the
token embedding to the hidden states' scale (``embed_gain`` times the identity, the
embedding's bigram guess through the target's ``lm_head``) plus Gaussian noise of relative
size ``noise`` on both halves (so ``h_t`` matters), the decoder layer has transformers' default
initialisation (normal, std 0.02; norms 1).  All from a private ``torch.Generator`` seeded from
``seed``: the checkpoint is a pure function of ``(seed, noise, embed_gain)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specverify.adapters.runtime import cache_root
from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_bool, check_float, check_int

__all__ = ["EAGLE_KEYS", "eagle_keys", "eagle_config", "eagle_state_dict", "save_tiny_eagle"]

#: The key names of an EAGLE-1 checkpoint with one layer (``cnets.Model(config, bias=True)``).
EAGLE_KEYS = (
    "embed_tokens.weight",
    "fc.weight",
    "fc.bias",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
)
INIT_STD = 0.02  # transformers' LlamaConfig.initializer_range


def eagle_keys(fc_bias: bool) -> tuple[str, ...]:
    """The checkpoint's key names: :data:`EAGLE_KEYS`, without ``fc.bias`` unless ``fc_bias``."""
    return tuple(k for k in EAGLE_KEYS if fc_bias or k != "fc.bias")


def eagle_config(target_config: dict, *, fc_bias: bool = False) -> dict:
    """EAGLE-1's ``config.json`` for a Llama target: its config with one layer and ``"bias": fc_bias``."""
    check_bool("fc_bias", fc_bias)
    config = dict(target_config)
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], bias=fc_bias)
    return config


def _shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The shape of every :data:`EAGLE_KEYS` tensor for a Llama ``config``."""
    V, H, I = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or H // heads
    kv = config.get("num_key_value_heads") or heads
    attn = {"q": heads * head_dim, "k": kv * head_dim, "v": kv * head_dim}
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (V, H), "fc.weight": (H, 2 * H), "fc.bias": (H,)}
    for name, rows in attn.items():
        shapes[f"layers.0.self_attn.{name}_proj.weight"] = (rows, H)
    shapes["layers.0.self_attn.o_proj.weight"] = (H, heads * head_dim)
    shapes.update({"layers.0.mlp.gate_proj.weight": (I, H), "layers.0.mlp.up_proj.weight": (I, H)})
    shapes.update({"layers.0.mlp.down_proj.weight": (H, I), "layers.0.post_attention_layernorm.weight": (H,)})
    return shapes


def eagle_state_dict(
    target_embed: torch.Tensor,
    config: dict,
    *,
    seed: int,
    noise: float = 0.5,
    embed_gain: float = 50.0,
    fc_bias: bool = False,
) -> dict[str, torch.Tensor]:
    """The EAGLE-1 weights (float32, :func:`eagle_keys`) for a target with embedding ``target_embed`` (V, H).

    Parameters
    ----------
    target_embed : Tensor (V, H)
        The target's ``embed_tokens`` weight, copied as EAGLE-1 does.
    config : dict
        The target's Llama config (sizes).
    seed : int
        Seeds the private generator of every random tensor.
    noise : float
        Relative size of the Gaussian noise on ``fc`` (0: the pure embedding bigram guess).
    embed_gain : float
        Gain of the identity block of ``fc`` on the embedding half (the embedding's norm is
        ~0.16 at std 0.02, the target's final hidden states' ~sqrt(H)).
    fc_bias : bool
        Include ``fc.bias`` (normal, std 0.02), as EAGLE-1 heads trained with ``"bias": true`` do.
        The other tensors do not depend on it.
    """
    check_bool("fc_bias", fc_bias)
    seed = check_int("seed", seed, minimum=0, maximum=2**62)
    noise = check_float("noise", noise, minimum=0.0)
    embed_gain = check_float("embed_gain", embed_gain, minimum=0.0)
    shapes = _shapes(config)
    if tuple(target_embed.shape) != shapes["embed_tokens.weight"]:
        raise InvalidArgument(
            f"target_embed has shape {tuple(target_embed.shape)}, want {shapes['embed_tokens.weight']}"
        )
    generator = torch.Generator().manual_seed(seed * 7919 + 3)
    H = config["hidden_size"]
    state = {}
    for name in EAGLE_KEYS:  # fixed order: the draws are a function of the seed only
        state[name] = torch.randn(shapes[name], generator=generator, dtype=torch.float32) * INIT_STD
    fc = torch.randn((H, 2 * H), generator=generator, dtype=torch.float32) * (noise / H**0.5)  # (H, 2H)
    fc[:, :H] = fc[:, :H] * embed_gain + torch.eye(H) * embed_gain
    state["fc.weight"] = fc
    state["embed_tokens.weight"] = target_embed.detach().to(torch.float32).clone()  # (V, H)
    state["layers.0.post_attention_layernorm.weight"] = torch.ones(H)
    return {name: state[name].contiguous() for name in eagle_keys(fc_bias)}


def save_tiny_eagle(root=None, *, seed: int = 0, noise: float = 0.5, fc_bias: bool = False) -> Path:
    """Write the tiny target's EAGLE-1 head (``config.json`` + ``model.safetensors``); return its directory.

    The target is :func:`specverify.adapters.vllm_engine.save_tiny_models`' for ``seed``
    (written first if absent).  ``root`` defaults to ``$SPECVERIFY_CACHE`` or
    ``~/.cache/specverify``; an existing directory for the same ``(seed, noise, fc_bias)`` is reused.
    """
    from safetensors.torch import load_file, save_file

    from specverify.adapters.vllm_engine import save_tiny_models
    from specverify.report.io import atomic_write_text

    seed = check_int("seed", seed, minimum=0, maximum=2**62)
    noise = check_float("noise", noise, minimum=0.0)
    root = cache_root(root)
    check_bool("fc_bias", fc_bias)
    path = root / f"vllm-tiny-eagle-s{seed}-n{noise:g}{'-fcbias' if fc_bias else ''}"
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path
    target_dir, _ = save_tiny_models(root, seed=seed)
    target_config = json.loads((target_dir / "config.json").read_text())
    embed = load_file(str(target_dir / "model.safetensors"))["model.embed_tokens.weight"]  # (V, H)
    state = eagle_state_dict(embed, target_config, seed=seed, noise=noise, fc_bias=fc_bias)
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.dumps(eagle_config(target_config, fc_bias=fc_bias), indent=2, sort_keys=True) + "\n"
    atomic_write_text(path / "config.json", config)  # config last: its presence marks a complete directory
    return path

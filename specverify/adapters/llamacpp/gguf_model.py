"""The tiny seeded Llamas as GGUF files, with a tiny offline SentencePiece-style vocabulary.

:func:`save_tiny_gguf` converts the target and perturbed draft of
:func:`specverify.adapters.fixtures.llama.save_tiny_models` (Hugging Face directories, built
offline from a config) into GGUF files with ``gguf.GGUFWriter``, all weights float32, the way
llama.cpp's ``convert_hf_to_gguf.py`` writes a Llama: the same tensor names, and the query and key
projections permuted from Hugging Face's half-split rotary layout to GGUF's interleaved one
(``LlamaModel.permute``).  The vocabulary (:data:`PIECES`) has 32 pieces: ``<unk>``, ``<s>``,
``</s>`` (unknown, control, control: the usual SentencePiece layout; ``</s>`` is the
end-of-generation token) and 29 short strings over ``a``, ``b``, ``c`` and space, so that the
grammar of :data:`specverify.adapters.llamacpp.sampler_chain.WORD_GRAMMAR` constrains tokens in a
context-dependent way (a token can end mid-word; some never fit).  Token ids are passed to the
engine directly; the tokenizer is never run on text.

Needs ``gguf`` (pinned in the llama.cpp virtualenv) and transformers (``specverify[hf]``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from specverify.adapters.runtime import cache_root

__all__ = ["PIECES", "EOG", "save_tiny_gguf", "write_gguf"]

#: Token id -> piece (the text the grammar sees; a space is stored as SentencePiece's "▁").
PIECES: tuple[str, ...] = (
    "<unk>", "<s>", "</s>",
    "a", "b", "c", " ", "ab", "ac", "ba", "bc", "cb", "bb", "cc", "a ", "b ", "c ", " a", " b",
    "abc", "acb", "bca", "cab", "ba ", "bc ", "a b", " ba", "ca", "aa", "cba", "abb", "c a",
)  # fmt: skip
#: End-of-generation token ids (``</s>``).
EOG = frozenset({2})
#: gguf.TokenType values: NORMAL 1, UNKNOWN 2, CONTROL 3.
TOKEN_TYPES = (2, 3, 3) + (1,) * (len(PIECES) - 3)


def _permute(weights: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf's ``LlamaModel.permute``: half-split rotary rows -> interleaved pairs."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_gguf(hf_dir, path) -> Path:
    """Write the Hugging Face Llama in ``hf_dir`` as an all-float32 GGUF file at ``path`` (atomically)."""
    import gguf
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    c = model.config
    if c.vocab_size != len(PIECES):
        raise ValueError(f"the tiny vocabulary has {len(PIECES)} pieces, the model {c.vocab_size} logits")
    head_dim = c.hidden_size // c.num_attention_heads
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name("specverify-tiny-llama")
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_feed_forward_length(c.intermediate_size)
        w.add_head_count(c.num_attention_heads)
        w.add_head_count_kv(c.num_key_value_heads)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
        w.add_vocab_size(c.vocab_size)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("llama")
        w.add_token_list([p.replace(" ", "\u2581") for p in PIECES])
        w.add_token_scores([0.0] * len(PIECES))
        w.add_token_types(list(TOKEN_TYPES))
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        state = {k: v.detach().to(torch.float32) for k, v in model.state_dict().items()}
        tensors = {
            "token_embd.weight": state["model.embed_tokens.weight"],
            "output_norm.weight": state["model.norm.weight"],
            "output.weight": state["lm_head.weight"],
        }
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            tensors.update(
                {
                    f"blk.{i}.attn_norm.weight": state[p + "input_layernorm.weight"],
                    f"blk.{i}.attn_q.weight": _permute(state[p + "self_attn.q_proj.weight"], c.num_attention_heads),
                    f"blk.{i}.attn_k.weight": _permute(state[p + "self_attn.k_proj.weight"], c.num_key_value_heads),
                    f"blk.{i}.attn_v.weight": state[p + "self_attn.v_proj.weight"],
                    f"blk.{i}.attn_output.weight": state[p + "self_attn.o_proj.weight"],
                    f"blk.{i}.ffn_norm.weight": state[p + "post_attention_layernorm.weight"],
                    f"blk.{i}.ffn_gate.weight": state[p + "mlp.gate_proj.weight"],
                    f"blk.{i}.ffn_up.weight": state[p + "mlp.up_proj.weight"],
                    f"blk.{i}.ffn_down.weight": state[p + "mlp.down_proj.weight"],
                }
            )
        for name, tensor in tensors.items():
            w.add_tensor(name, tensor.contiguous().numpy())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def save_tiny_gguf(root=None, *, seed: int = 0, draft_noise: float = 0.5) -> tuple[Path, Path]:
    """GGUF files of the tiny target and its perturbed draft (written once, reused); return their paths.

    ``root`` defaults to ``$SPECVERIFY_CACHE`` or ``~/.cache/specverify``; the files land in
    ``root/llamacpp-tiny-llama-s{seed}-n{draft_noise}/{target,draft}.gguf``.
    """
    from specverify.adapters.fixtures.llama import save_tiny_models

    hf_dirs = save_tiny_models(root, seed=seed, draft_noise=draft_noise)  # validates seed, draft_noise
    base = cache_root(root) / f"llamacpp-tiny-llama-s{seed}-n{float(draft_noise):g}"
    base.mkdir(parents=True, exist_ok=True)
    paths = base / "target.gguf", base / "draft.gguf"
    for src, dst in zip(hf_dirs, paths):
        if not dst.exists():
            write_gguf(src, dst)
    return paths

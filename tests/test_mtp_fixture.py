"""The tiny MiMo target with an MTP layer: checkpoint layout, config, determinism (no vLLM); serving (with vLLM)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from specverify.core.errors import InvalidArgument

pytest.importorskip("safetensors")


def _read(path):
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())
    return config, load_file(str(path / "model.safetensors"))


def test_mtp_checkpoint_has_the_mimo_keys_shapes_and_config(tmp_path):
    from specverify.adapters.fixtures.mtp_model import MTP_CONFIG, mtp_keys, mtp_shapes, save_tiny_mtp

    path = save_tiny_mtp(tmp_path, seed=0)
    assert path == tmp_path / "vllm-tiny-mimo-mtp-s0-n0.5-h0.5"
    config, state = _read(path)
    assert config["architectures"] == ["MiMoForCausalLM"] and config["model_type"] == "qwen2"
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == 2
    assert config["hidden_size"] // config["num_attention_heads"] == 32  # vLLM's CPU attention head size
    assert config["tie_word_embeddings"] is False and config["eos_token_id"] is None
    assert {k: config[k] for k in MTP_CONFIG} == MTP_CONFIG
    assert set(state) == set(mtp_keys(config))
    assert {k: tuple(v.shape) for k, v in state.items()} == mtp_shapes(config)
    assert all(v.dtype == torch.float32 for v in state.values())
    mtp = [k for k in state if k.startswith("model.mtp_layers.0.")]
    assert len(mtp) == 4 + 12  # token/hidden/final norms, input_proj and one Qwen2 decoder layer (with q/k/v biases)
    assert state["model.mtp_layers.0.input_proj.weight"].shape == (64, 128)
    assert "model.mtp_layers.0.self_attn.q_proj.bias" in state and "model.mtp_layers.0.lm_head.weight" not in state
    assert torch.equal(state["model.mtp_layers.0.final_layernorm.weight"], torch.ones(64))
    # input_proj: identity on the embedding half, hidden_weight * identity on the hidden half, plus noise
    proj = state["model.mtp_layers.0.input_proj.weight"]
    assert (proj[:, 64:].diagonal().mean() - 1).abs() < 0.2 and (proj[:, :64].diagonal().mean() - 0.5).abs() < 0.2
    lm_head = state["lm_head.weight"]
    assert 0.2 < lm_head.std() < 0.4  # 0.02 * logit_scale 15


def test_mtp_checkpoint_is_a_pure_function_of_its_arguments(tmp_path):
    from specverify.adapters.fixtures.mtp_model import save_tiny_mtp

    state = torch.random.get_rng_state()
    a = _read(save_tiny_mtp(tmp_path / "a", seed=0))
    b = _read(save_tiny_mtp(tmp_path / "b", seed=0))
    c = _read(save_tiny_mtp(tmp_path / "a", seed=1))
    d = _read(save_tiny_mtp(tmp_path / "a", seed=0, noise=0.0))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is not touched
    assert a[0] == b[0] == c[0] and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert not torch.equal(a[1]["model.embed_tokens.weight"], c[1]["model.embed_tokens.weight"])
    assert torch.equal(a[1]["model.embed_tokens.weight"], d[1]["model.embed_tokens.weight"])  # noise: input_proj only
    assert torch.equal(d[1]["model.mtp_layers.0.input_proj.weight"][:, 64:], torch.eye(64))
    again = save_tiny_mtp(tmp_path / "a", seed=0)  # cached: the same directory, not rewritten
    assert again == tmp_path / "a" / "vllm-tiny-mimo-mtp-s0-n0.5-h0.5"


def test_mtp_argument_checks():
    from specverify.adapters.fixtures.mtp_model import mtp_config, mtp_state_dict

    with pytest.raises(InvalidArgument):
        mtp_config(hidden_size=64, num_attention_heads=3)
    with pytest.raises(InvalidArgument):
        mtp_config(num_nextn_predict_layers=0)
    config = mtp_config()
    with pytest.raises(InvalidArgument):
        mtp_state_dict(config, seed=0, noise=-1.0)
    with pytest.raises(InvalidArgument):
        mtp_state_dict(config, seed=-1)
    with pytest.raises(InvalidArgument):
        mtp_state_dict(config, seed=0, logit_scale=0.0)
    two = mtp_state_dict(mtp_config(num_nextn_predict_layers=2), seed=0)
    assert "model.mtp_layers.1.input_proj.weight" in two


def test_transformers_reads_the_config_and_loads_the_target_strictly(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoConfig, Qwen2ForCausalLM

    from specverify.adapters.fixtures.mtp_model import save_tiny_mtp

    path = save_tiny_mtp(tmp_path, seed=0)
    config = AutoConfig.from_pretrained(path)  # a Qwen2Config: no remote code, no download
    assert type(config).__name__ == "Qwen2Config" and config.num_nextn_predict_layers == 1
    model = Qwen2ForCausalLM(config).eval()
    _, state = _read(path)
    target = {k: v for k, v in state.items() if not k.startswith("model.mtp_layers.")}
    model.load_state_dict(target, strict=True)
    with torch.no_grad():
        logits = model(torch.tensor([[3, 1, 4, 1]])).logits  # (1, 4, V)
    assert logits.shape == (1, 4, 32) and torch.isfinite(logits).all()
    assert torch.softmax(logits[0, -1], -1).max() > 0.1  # peaked, not near-uniform (1/32)


def test_vllm_serves_the_target_with_its_mtp_drafter(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from specverify.adapters.fixtures.mtp_model import save_tiny_mtp

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    from vllm import LLM, SamplingParams

    path = save_tiny_mtp(tmp_path, seed=0)
    llm = LLM(
        model=str(path),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        seed=0,
        speculative_config={"method": "mtp", "num_speculative_tokens": 2},
    )
    spec = llm.llm_engine.vllm_config.speculative_config
    assert spec.method == "mtp" and spec.num_speculative_tokens == 2
    assert spec.draft_model_config.hf_config.architectures == ["MiMoMTPModel"]
    params = SamplingParams(n=4, max_tokens=8, temperature=1.0, seed=0, detokenize=False)
    (out,) = llm.generate([{"prompt_token_ids": [3, 1, 4, 1]}], params, use_tqdm=False)
    assert len(out.outputs) == 4
    for completion in out.outputs:
        assert len(completion.token_ids) == 8 and all(0 <= t < 32 for t in completion.token_ids)

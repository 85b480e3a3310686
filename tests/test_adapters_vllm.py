"""Tests of the vLLM adapters: layout conversions and argument checks (no vLLM needed), kernels (skip without vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specverify.adapters.vllm import layout as L
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify_reference.rules import greedy_verify


def _batch(B=3, K=2, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(B, K + 1, V, generator=g, dtype=torch.float64) + 0.05
    q = torch.rand(B, K, V, generator=g, dtype=torch.float64) + 0.05
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    return p, q, x


# ----------------------------------------------------------------------------- layout (CI, no vLLM)


def test_spec_decode_indices_match_the_model_runner_example():
    # the worked example in vLLM's GPUModelRunner._calc_spec_decode_metadata
    idx = L.spec_decode_indices([3, 0, 2, 0, 1])
    assert idx.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert idx.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert idx.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert idx.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert idx.logits_indices.tolist() == list(range(11))
    assert all(t.dtype == torch.int32 for t in idx)


def test_to_ragged_flattens_request_by_request():
    p, q, x = _batch(B=3, K=2, V=5)
    r = L.to_ragged(p, q, x)
    assert r.num_draft_tokens == [2, 2, 2]
    assert r.cu_num_draft_tokens.tolist() == [2, 4, 6] and r.cu_num_draft_tokens.dtype == torch.int32
    assert r.draft_token_ids.tolist() == x.reshape(-1).tolist() and r.draft_token_ids.dtype == torch.int32
    assert torch.equal(r.draft_probs, q.reshape(6, 5))
    assert torch.equal(r.target_rows, p[:, :2].reshape(6, 5))
    assert torch.equal(r.bonus_rows, p[:, 2])


def test_to_ragged_ragged_counts_and_point_mass():
    p, q, x = _batch(B=3, K=3, V=4)
    r = L.to_ragged(p, q, x, num_draft_tokens=[3, 0, 1], point_mass=True)
    assert r.draft_probs is None
    assert r.cu_num_draft_tokens.tolist() == [3, 3, 4]
    assert r.draft_token_ids.tolist() == x[0].tolist() + x[2, :1].tolist()
    assert torch.equal(r.target_rows, torch.cat([p[0, :3], p[2, :1]]))
    assert torch.equal(r.bonus_rows, torch.stack([p[0, 3], p[1, 0], p[2, 1]]))  # the row after each last draft


def test_engine_logits_restore_p_after_temperature():
    p, q, x = _batch(B=2, K=2, V=6)
    p[0, 1, 3] = 0.0  # a forbidden token stays exactly forbidden
    p = p / p.sum(-1, keepdim=True)
    r = L.to_ragged(p, q, x, num_draft_tokens=[2, 1])
    rows = L.engine_logits(r, temperature=0.7)  # (T + B, V)
    idx = L.spec_decode_indices(r.num_draft_tokens)
    assert rows.shape == (5, 6) and rows.dtype == torch.float32
    back = torch.softmax(rows.double() / 0.7, -1)
    assert torch.allclose(back[idx.target_logits_indices.long()], r.target_rows, atol=1e-6)
    assert torch.allclose(back[idx.bonus_logits_indices.long()], r.bonus_rows, atol=1e-6)
    assert back[1, 3] == 0.0


def test_from_output_token_ids_reads_placeholders():
    out = torch.tensor([[4, -1, -1], [1, 2, 3], [0, 7, -1]], dtype=torch.int32)
    tokens, num = L.from_output_token_ids(out, num_draft_tokens=[2, 2, 2])
    assert num.tolist() == [1, 3, 2]
    assert tokens.tolist() == [[4, 0, 0], [1, 2, 3], [0, 7, 0]] and tokens.dtype == torch.long


@pytest.mark.parametrize(
    "row, why",
    [([3, -1, 5], "token after a placeholder"), ([-1, -1, -1], "no token"), ([-2, -1, -1], "negative token")],
)
def test_from_output_token_ids_rejects_malformed_rows(row, why):
    out = torch.tensor([[1, 2, -1], row])
    with pytest.raises(ImplementationError, match=r"row 1 = "):
        L.from_output_token_ids(out)


def test_from_output_token_ids_rejects_too_many_tokens():
    with pytest.raises(ImplementationError, match="row 0"):
        L.from_output_token_ids(torch.tensor([[1, 2, 3]]), num_draft_tokens=[1])


def test_expand_to_tokens_semantics_and_checks():
    x = torch.tensor([0.7, 0.0, 1.5])
    got = L.expand_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6, replace_from=0, replace_to=1)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0, 1.5]))
    with pytest.raises(InvalidArgument, match="num_tokens=7"):
        L.expand_to_tokens(x, torch.tensor([2, 5, 6]), 7)


def test_layout_argument_checks():
    p, q, x = _batch(B=2, K=2, V=4)
    with pytest.raises(InvalidArgument, match="draft_probs must have shape"):
        L.to_ragged(p, q[:, :1], x)
    with pytest.raises(InvalidArgument, match="integer tensor"):
        L.to_ragged(p, q, x.double())
    with pytest.raises(InvalidArgument, match=r"num_draft_tokens entries must lie in \[0, K=2\], got 3"):
        L.to_ragged(p, q, x, num_draft_tokens=[3, 1])
    with pytest.raises(InvalidArgument, match="one entry per request"):
        L.to_ragged(p, q, x, num_draft_tokens=[1])
    with pytest.raises(InvalidArgument, match="temperature"):
        L.probs_to_logits(p, temperature=0.0)
    with pytest.raises(InvalidArgument, match="num_draft_tokens"):
        L.spec_decode_indices([])


def test_importing_the_adapter_does_not_import_vllm():
    code = (
        "import sys, specverify.adapters.vllm, specverify.adapters.vllm.engine, tools.reports.vllm_reports; "
        "assert 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"draft_probs": "maybe"}, "draft_probs must be one of"),
        ({"seeding": "random"}, "seeding must be one of"),
        ({"greedy": "yes"}, "greedy must be True or False"),
        ({"num_threads": 0}, "num_threads must be >= 1"),
    ],
)
def test_option_checks_need_no_vllm(options, match):
    from specverify.adapters.vllm import RejectionSampleVerifier

    with pytest.raises(InvalidArgument, match=match):
        RejectionSampleVerifier(**options)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"patch_expand": 1}, "patch"),
    ],
)
def test_forward_option_checks_need_no_vllm(options, match):
    from specverify.adapters.vllm import RejectionSamplerForwardVerifier

    with pytest.raises(InvalidArgument, match=match):
        RejectionSamplerForwardVerifier(**options)


# ----------------------------------------------------------------------------- with vLLM


@pytest.fixture(scope="module")
def vllm_adapter():
    pytest.importorskip("vllm")
    from specverify.adapters.vllm import kernel as adapter

    return adapter


def _run(verify, p, q, x, seed=1):
    return verify(p, q, x, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seeding", ["per_request", "global", "mixed"])
def test_rejection_sample_is_deterministic_and_well_formed(vllm_adapter, seeding):
    v = vllm_adapter.RejectionSampleVerifier(seeding=seeding)
    p, q, x = _batch(B=64, K=3, V=6)
    tokens, num = _run(v, p, q, x)
    again, num2 = _run(v, p, q, x)
    assert torch.equal(tokens, again) and torch.equal(num, num2)
    assert tokens.shape == (64, 4) and ((num >= 1) & (num <= 4)).all()
    assert ((tokens >= 0) & (tokens < 6)).all()


def test_rejection_sample_oracle_and_disjoint_drafts(vllm_adapter):
    v = vllm_adapter.RejectionSampleVerifier()
    p, _, _ = _batch(B=32, K=2, V=6)
    x = torch.multinomial(p[:, :2].reshape(-1, 6), 1, generator=torch.Generator().manual_seed(3)).reshape(32, 2)
    _, num = _run(v, p, p[:, :2], x)
    assert (num == 3).all()  # q = p: every draft accepted, bonus appended
    p2 = torch.zeros(32, 3, 6, dtype=torch.float64)
    p2[..., :3] = 1 / 3
    q2 = torch.zeros(32, 2, 6, dtype=torch.float64)
    q2[..., 5] = 1.0
    tokens, num = _run(v, p2, q2, torch.full((32, 2), 5))
    assert (num == 1).all() and (tokens[:, 0] < 3).all()  # drafts outside p's support: rejected, recovered from p


def test_pointmass_requires_one_hot_drafts(vllm_adapter):
    v = vllm_adapter.RejectionSampleVerifier(draft_probs="pointmass")
    p, q, x = _batch(B=4, K=2, V=5)
    with pytest.raises(InvalidArgument, match=r"row 0 position 0 has q\(x\)="):
        _run(v, p, q, x)
    one_hot = torch.nn.functional.one_hot(x, 5).double()
    tokens, num = _run(v, p, one_hot, x)
    assert ((num >= 1) & (num <= 3)).all()


@pytest.mark.parametrize("cls", ["RejectionSampleVerifier", "RejectionSamplerForwardVerifier"])
def test_greedy_paths_equal_the_greedy_continuation(vllm_adapter, cls):
    v = getattr(vllm_adapter, cls)(greedy=True)
    p, q, x = _batch(B=64, K=3, V=6)
    x[::2] = p[::2, :3].argmax(-1)  # half the rows draft the argmax: long accepted prefixes
    tokens, num = _run(v, p, q, x)
    want_tokens, want_num = greedy_verify(p, x)
    assert torch.equal(num, want_num)
    keep = torch.arange(4)[None, :] < num[:, None]
    assert torch.equal(tokens[keep], want_tokens[keep])


def test_forward_with_patched_expand_is_deterministic(vllm_adapter):
    v = vllm_adapter.RejectionSamplerForwardVerifier(temperature=0.7, patch_expand=True)
    p, q, x = _batch(B=64, K=3, V=6)
    tokens, num = _run(v, p, q, x)
    again, num2 = _run(v, p, q, x)
    assert torch.equal(tokens, again) and torch.equal(num, num2)


def test_rejection_sample_passes_a_battery_scenario(vllm_adapter):
    import specverify as sv

    report = sv.check_verifier(
        vllm_adapter.rejection_sample_verifier, tier="smoke", seed=0, scenarios=["pos16_noisy_k1"]
    )
    assert report.passed, report.summary()


@pytest.mark.xfail(
    reason="vLLM 0.32 CPU: _expand_kernel_impl fills an int64 copy (reports/vllm/repro_cpu_expand_uninitialized.py)"
)
def test_cpu_expand_batch_to_tokens_fills_float_output(vllm_adapter):
    vllm_adapter.load_vllm()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    got = expand_batch_to_tokens(torch.tensor([0.7, 1.0, 1.0]), cu, 6, replace_from=0, replace_to=1)
    assert torch.equal(got, L.expand_to_tokens(torch.tensor([0.7, 1.0, 1.0]), cu, 6))


# ----------------------------------------------------------------------------- end to end and reports (CI parts)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"method": "medusa"}, "method must be one of"),
        ({"method": "draft_model"}, "needs draft_dir"),
        ({"method": "eagle"}, "needs eagle_dir"),
        ({"method": "eagle", "eagle_dir": "/x", "draft_sample_method": "topk"}, "draft_sample_method"),
        ({"draft_sample_method": "topk"}, "draft_sample_method"),
        ({"k": 0}, "k must be >= 1"),
        ({"memoize": "yes"}, "memoize must be True or False"),
    ],
)
def test_engine_decoder_option_checks_need_no_vllm(options, match):
    from specverify.adapters.vllm.engine import VllmDecoder

    with pytest.raises(InvalidArgument, match=match):
        VllmDecoder("/nonexistent", **options)


def test_tiny_decoder_rejects_unknown_methods_before_writing_models():
    from specverify.adapters.vllm.engine import tiny_decoder

    with pytest.raises(InvalidArgument, match="method must be one of"):
        tiny_decoder(method="eagle4")


def test_eagle_decoder_speculative_config_needs_no_vllm():
    from specverify.adapters.vllm.engine import VllmDecoder

    dec = VllmDecoder("/t", method="eagle", k=3, eagle_dir="/e", draft_dir="/d", draft_sample_method="greedy")
    assert dec._speculative_config() == dict(
        method="eagle", model="/e", num_speculative_tokens=3, draft_sample_method="greedy"
    )
    assert "eagle, k=3, draft_sample_method=greedy" in repr(dec)
    dec = VllmDecoder("/t", method="eagle3", k=3, eagle_dir="/e3", draft_sample_method="greedy")
    assert dec._speculative_config() == dict(
        method="eagle3", model="/e3", num_speculative_tokens=3, draft_sample_method="greedy"
    )
    with pytest.raises(InvalidArgument, match="eagle3.*needs eagle_dir"):
        VllmDecoder("/t", method="eagle3")


# ----------------------------------------------------------------------------- EAGLE checkpoint writer (CI, no vLLM)


def _read_eagle(path):
    import json

    from safetensors.torch import load_file

    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("fc_bias", [False, True])
def test_eagle_checkpoint_has_eagle1_keys_shapes_and_config(tmp_path, fc_bias):
    pytest.importorskip("transformers")  # the hf extra writes the checkpoints
    from safetensors.torch import load_file

    from specverify.adapters.fixtures.eagle_head import EAGLE_KEYS, save_tiny_eagle
    from specverify.adapters.fixtures.llama import save_tiny_models

    config, state = _read_eagle(save_tiny_eagle(tmp_path, seed=0, fc_bias=fc_bias))
    assert set(state) == set(EAGLE_KEYS) - ({"fc.bias"} if not fc_bias else set())
    want = {
        "embed_tokens.weight": (32, 64),
        "fc.weight": (64, 128),
        "fc.bias": (64,),
        "layers.0.self_attn.q_proj.weight": (64, 64),
        "layers.0.self_attn.k_proj.weight": (64, 64),
        "layers.0.self_attn.v_proj.weight": (64, 64),
        "layers.0.self_attn.o_proj.weight": (64, 64),
        "layers.0.mlp.gate_proj.weight": (128, 64),
        "layers.0.mlp.up_proj.weight": (128, 64),
        "layers.0.mlp.down_proj.weight": (64, 128),
        "layers.0.post_attention_layernorm.weight": (64,),
    }
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: v for k, v in want.items() if k in state}
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in state.values())
    assert not any("input_layernorm" in k or "lm_head" in k or k.startswith("model.") for k in state)
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["LlamaForCausalLM"]
    assert config["bias"] is fc_bias and config["vocab_size"] == 32 and config["hidden_size"] == 64
    target_dir, _ = save_tiny_models(tmp_path, seed=0)
    target = load_file(str(target_dir / "model.safetensors"))
    assert torch.equal(state["embed_tokens.weight"], target["model.embed_tokens.weight"])  # EAGLE-1 copies it


def test_eagle_checkpoint_is_a_pure_function_of_the_seed(tmp_path):
    pytest.importorskip("transformers")  # the hf extra writes the checkpoints
    from specverify.adapters.fixtures.eagle_head import save_tiny_eagle

    a = _read_eagle(save_tiny_eagle(tmp_path / "a", seed=0))
    b = _read_eagle(save_tiny_eagle(tmp_path / "b", seed=0))
    c = _read_eagle(save_tiny_eagle(tmp_path / "a", seed=1))
    assert a[0] == b[0] and a[1].keys() == b[1].keys()
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert not torch.equal(a[1]["fc.weight"], c[1]["fc.weight"])
    again = save_tiny_eagle(tmp_path / "a", seed=0)  # cached: the same directory, not rewritten
    assert again == tmp_path / "a" / "vllm-tiny-eagle-s0-n0.5"


def test_eagle_state_dict_argument_checks():
    from specverify.adapters.fixtures.eagle_head import eagle_config, eagle_state_dict

    config = dict(vocab_size=4, hidden_size=8, intermediate_size=16, num_attention_heads=2)
    embed = torch.zeros(4, 8)
    with pytest.raises(InvalidArgument, match="noise must be"):
        eagle_state_dict(embed, config, seed=0, noise=-1.0)
    with pytest.raises(InvalidArgument, match="target_embed has shape"):
        eagle_state_dict(torch.zeros(5, 8), config, seed=0)
    with pytest.raises(InvalidArgument, match="fc_bias must be True or False"):
        eagle_state_dict(embed, config, seed=0, fc_bias=1)
    with pytest.raises(InvalidArgument, match="fc_bias must be True or False"):
        eagle_config(config, fc_bias="yes")
    state = eagle_state_dict(embed, config, seed=0, noise=0.0)
    assert torch.equal(state["fc.weight"][:, :8], 50.0 * torch.eye(8)) and not state["fc.weight"][:, 8:].any()


def test_eagle_checkpoint_loads_strictly_into_eagle_llm_model():
    cnets = pytest.importorskip("eagle.model.cnets")
    from transformers import LlamaConfig

    from specverify.adapters.fixtures.eagle_head import eagle_config, eagle_state_dict

    base = dict(vocab_size=32, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2)
    config = LlamaConfig(**eagle_config(base, fc_bias=True))
    config.rope_scaling = None  # eagle-llm 1.2.1 reads rope_scaling["type"] when set
    model = cnets.Model(config, bias=config.bias)  # what ea_model.EaModel builds
    model.load_state_dict(eagle_state_dict(torch.zeros(32, 64), base, seed=0, fc_bias=True), strict=True)


def test_report_configs_are_well_formed():
    from tools.reports.vllm_reports import CONFIGS

    names = [c[0] for c in CONFIGS]
    assert len(names) == len(set(names))
    for name, expected, _, args in CONFIGS:
        assert expected in ("pass", "fail"), name
        assert args[0] in ("--verifier", "--decoder") and ":" in args[1], name
        if args[0] == "--decoder":
            assert "--target" in args, name  # exact conditionals, never a two-sample fallback


def test_report_evidence_picks_the_strongest_failure():
    from tools.reports.common import detectable, evidence

    def result(grade, p, adj, stat, tv):
        return dict(grade=grade, family="gof", name="gof", scenario="s", position="abs=1", statistic=stat, pvalue=p,
                    adjusted_pvalue=adj, n=100, mde_tv=tv)  # fmt: skip

    report = dict(errors=[], results=[result("pass", 0.5, 1.0, 1.0, 0.1), result("fail", 0.0, 0.0, "inf", 0.2)])
    assert "[FAIL]" in evidence(report) and "statistic=inf" in evidence(report)
    assert detectable(report) == "median 0.2 (best 0.1, worst 0.2)"
    passing = dict(errors=[], results=[result("pass", 0.03, 0.9, 2.0, 0.1)])
    assert evidence(passing).startswith("no test flagged; smallest raw p")


def test_eagle3_checkpoint_has_a_reduced_draft_vocabulary_mapped_into_the_targets(tmp_path):
    """EAGLE-3's layout: d2t offsets and t2d mark the same 16 of 32 target ids (seeded, sorted, not contiguous),
    lm_head is the target's rows of those ids, fc reads three aux states, the config names vLLM's loader."""
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from specverify.adapters.fixtures.eagle3_head import AUX_LAYER_IDS, EAGLE3_KEYS, draft_ids, save_tiny_eagle3
    from specverify.adapters.fixtures.llama import save_tiny_models

    path = save_tiny_eagle3(tmp_path, seed=0)
    config, state = _read_eagle(path)
    target = load_file(str(save_tiny_models(tmp_path, seed=0)[0] / "model.safetensors"))
    assert set(state) == set(EAGLE3_KEYS)
    ids = draft_ids(32, 16, seed=0)
    assert ids.tolist() == sorted(set(ids.tolist())) and ids[-1] - ids[0] > 15  # a subset with gaps
    assert torch.equal(torch.arange(16) + state["d2t"], ids) and state["d2t"].dtype == torch.long
    assert torch.equal(state["t2d"].nonzero().flatten(), ids) and state["t2d"].dtype == torch.bool
    assert torch.equal(state["lm_head.weight"], target["lm_head.weight"][ids])
    assert torch.equal(state["embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert tuple(state["fc.weight"].shape) == (64, 3 * 64)
    assert tuple(state["midlayer.self_attn.q_proj.weight"].shape) == (64, 2 * 64)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 16
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(AUX_LAYER_IDS)
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == 32
    again = _read_eagle(save_tiny_eagle3(tmp_path / "b", seed=0))[1]
    assert all(torch.equal(again[k], state[k]) for k in EAGLE3_KEYS)  # a pure function of the seed
    assert not torch.equal(_read_eagle(save_tiny_eagle3(tmp_path, seed=1))[1]["d2t"], state["d2t"])


def test_eagle3_state_dict_argument_checks():
    from specverify.adapters.fixtures.eagle3_head import draft_ids, eagle3_config, eagle3_state_dict

    base = {"vocab_size": 32, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
            "num_hidden_layers": 2}  # fmt: skip
    config = eagle3_config(base, draft_vocab_size=4)
    good = {"model.embed_tokens.weight": torch.zeros(32, 8), "lm_head.weight": torch.zeros(32, 8)}
    assert tuple(eagle3_state_dict(good, config, seed=0)["lm_head.weight"].shape) == (4, 8)
    with pytest.raises(InvalidArgument, match="lm_head"):
        eagle3_state_dict({**good, "lm_head.weight": torch.zeros(31, 8)}, config, seed=0)
    with pytest.raises(InvalidArgument, match="draft_vocab_size"):
        eagle3_config(base, draft_vocab_size=33)
    with pytest.raises(InvalidArgument, match="layers"):
        eagle3_config({**base, "num_hidden_layers": 1}, draft_vocab_size=4)
    with pytest.raises(InvalidArgument, match="noise"):
        eagle3_state_dict(good, config, seed=0, noise=-1.0)
    assert draft_ids(5, 5, seed=3).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.xfail(
    reason="vLLM 0.32: apply_top_k_only calls k.max() on an empty step (reports/vllm/repro_topk_zero_drafts_crash.py)"
)
def test_top_k_on_a_step_without_drafts(vllm_adapter):
    vllm_adapter.load_vllm()
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    assert apply_top_k_top_p(torch.empty(0, 32), torch.empty(0, dtype=torch.int32), None).shape == (0, 32)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_decoder_generates_the_right_shape(tmp_path, monkeypatch, method):
    pytest.importorskip("vllm")
    from specverify.adapters.vllm.engine import tiny_decoder

    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    dec = tiny_decoder(method=method, k=2, draft_sample_method="greedy")
    tokens = dec.generate(torch.tensor([3, 1, 4, 1]), num_samples=4, max_new_tokens=5, seed=0)
    assert tokens.shape == (4, 5) and tokens.dtype == torch.long
    assert ((tokens >= 0) & (tokens < 32)).all()
    spec = dec.llm.llm_engine.vllm_config.speculative_config
    assert spec.method == method
    if method == "eagle3":  # its own draft vocabulary, 16 of the target's 32 tokens
        assert spec.draft_model_config.hf_config.draft_vocab_size == 16


# ----------------------------------------------------------------------------- the penalties' law (CI, no vLLM)


def test_the_penalised_target_counts_the_output_only_as_vllm_documents():
    """vLLM's frequency and presence penalties count the output's tokens, not the prompt's: the first law after a
    prompt is the unpenalised one, and a token the output repeats loses frequency x count + presence in logit."""
    pytest.importorskip("transformers")
    from specverify.adapters.vllm.engine import VllmLawTarget, tiny_target

    plain = tiny_target(temperature=0.9)
    penalised = tiny_target(temperature=0.9, frequency_penalty=0.6, presence_penalty=0.4)
    assert isinstance(penalised, VllmLawTarget)
    prompt = torch.tensor([[5, 5, 5, 7]])
    first = penalised.next_token_probs(prompt)[0]  # the whole prefix is the prompt: nothing counted
    assert torch.allclose(first, plain.next_token_probs(prompt)[0].double(), atol=1e-6)
    seqs = torch.tensor([[5, 5, 5, 7, 9, 9, 3]])
    laws = penalised.conditionals(seqs, start=4)  # (1, 3, V): after 7 | after 7 9 | after 7 9 9
    raw = penalised._logits(seqs[:, :-1])[0, 3:] / 0.9  # (3, V) tempered logits, no penalty
    expected = raw.clone()
    expected[1, 9] -= (0.6 * 1 + 0.4) / 0.9
    expected[2, 9] -= (0.6 * 2 + 0.4) / 0.9
    assert torch.allclose(laws[0], torch.softmax(expected, -1), atol=1e-12)
    assert float(laws[0, 0, 5]) == pytest.approx(float(first[5]))  # 5 is only in the prompt: not penalised

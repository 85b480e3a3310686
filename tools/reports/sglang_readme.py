"""``reports/sglang/README.md``: what SGLang 0.5.23 does on this CPU, from the records of :mod:`tools.reports.sglang_served`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from specverify.core.files import atomic_write_text

__all__ = ["INSTALL", "render_readme", "write_readme"]

SGLANG = "0.5.23"
INSTALL = (
    "python -m venv .venvs/sglang && .venvs/sglang/bin/pip install torch==2.14.1 torchvision==0.29.1 && "
    f".venvs/sglang/bin/pip install --no-deps sglang=={SGLANG} && "
    ".venvs/sglang/bin/pip install -r tools/reports/sglang_cpu_requirements.txt torch==2.14.1 torchvision==0.29.1"
)

TEMPLATE = """# SGLang on CPU: installed, serves without speculation, no speculative method runs

Regenerate (from the repository root, in the main virtualenv; the servers run in SGLang's; about {minutes} minutes):

```bash
{command}
```

Install SGLang {sglang} (one command; from a fresh clone 5 min 5 s with pip's cache warm, 6.3 min the
first time: torch 117 s from this machine's local files, SGLang and its dependencies 246 s; the
virtualenv takes 7.0 GB, mostly the CUDA libraries of PyPI's torch build):

```bash
{install}
```

**Why this shape.** SGLang {sglang} is the newest release; PyPI has no source distribution after 0.5.9 and
no CPU build of its kernel package (`sglang-kernel` is CUDA-only), and `download.pytorch.org` (the CPU
torch index) does not resolve here, so torch is the CUDA build, which runs on the CPU.  SGLang's wheel
pins GPU packages (FlashInfer, flash-attn, DeepGEMM, ...); it is installed without them
(`--no-deps`, then its own requirements minus those: [`sglang_cpu_requirements.txt`](../../tools/reports/sglang_cpu_requirements.txt)).
SGLang's CPU backend (`SGLANG_USE_CPU_ENGINE=1`) imports its CPU kernel package even where it then runs
torch-native code; that package is compiled for AVX-512 and AMX only (its CMake flags:
`-march=x86-64-v4 -mavx512bf16 -mavx512vnni -mamx-tile -mamx-bf16 -mamx-int8`), and this machine (AMD
EPYC, AVX2) has neither.  The servers here run with an import shim in its place
([`sglang_shim`](../../tools/reports/sglang_shim/sgl_kernel/__init__.py)): every op it binds raises
`NotImplementedError` naming the op, so a configuration that needs a kernel fails with that op's name,
never with a stand-in result.  Plain serving calls none.

## Results

The tiny seeded models of the [vLLM reports](../vllm/served/README.md) (the Llama, V = {vocab}; its
noisy draft; the EAGLE-1 and EAGLE-3 heads; the MiMo with its MTP layer), float32, the torch-native
attention backend, K = 3 draft tokens on a chain.

| configuration | what | starts | T = 1 request | same `sampling_seed` twice | `top_logprobs_num` = V | V + 1 | startup |
|---|---|---|---|---|---|---|---|
{rows}

{errors}

## Findings

1. **No speculative method runs on a CPU without AMX.**  Every speculative configuration stops at
   startup on a CPU kernel op (the table's last lines): EAGLE, EAGLE-3, the standalone draft model and MTP
   (NEXTN) when the KV pool warms up its copy op (`copy_all_layer_kv_cache_cpu`, called only with
   speculation), NGRAM on `sgl_kernel.speculative` (the CUDA op's import path, taken on CPU too).  Past
   those ops the attention backend refuses: a further probe, not committed, that gave the shim slow
   stand-ins for them stopped EAGLE, EAGLE-3 and the draft model at `ValueError: EAGLE is not supported
   in decode attention backend torch_native` (`sglang/srt/speculative/draft_utils.py:64`), MTP at the
   same check (`draft_utils.py:150`), and NGRAM's first request at `AttributeError: 'NoneType' object has
   no attribute 'shape'` (`torch_native_backend.py:101`: the torch-native backend has no target-verify
   mode).  On CPU only the `intel_amx` attention backend serves speculation, and SGLang switches it back
   to `torch_native` on a CPU without AMX (`sglang/srt/arg_groups/overrides.py`).  What it would take: a
   4th-generation or newer Xeon (AVX-512 + AMX) with SGLang's CPU kernel built from source.
2. **Even there, SGLang's CPU verification is greedy at every temperature** (read from the code, not run:
   nothing here reaches it).  `_verify_uses_greedy` (`sglang/srt/speculative/eagle_utils.py`) returns True
   whenever the device is the CPU, whatever the request's temperature and `--speculative-use-rejection-sampling`;
   its caller then commits `argmax` of the target's logits at each verified position.  A T = 1 request
   with EAGLE, EAGLE-3, MTP or NGRAM on CPU would return greedy tokens: not the target's law.
   [`repro_cpu_verify_is_greedy.py`](repro_cpu_verify_is_greedy.py) calls that function from the installed
   package (exit 1 while it answers True for a sampled batch on CPU).  Upstream: the same silent fallback on
   ROCm was reported and fixed for HIP only (sgl-project/sglang#31214, closed; #32922 and #39253 open, both
   HIP-gated) and patched downstream for XPU (intel/llm-scaler#719); no report for the CPU found.
3. **Per-request seeds do nothing on CPU.**  `sampling_seed` (and OpenAI's `seed`) is honoured only under
   `--enable-deterministic-inference`, which refuses the `torch_native` attention backend at startup
   ("only ['ascend', 'fa3', 'fa4', 'flashinfer', 'intel_xpu', 'triton'] attention backends are supported
   for deterministic inference"), and seeded sampling on CPU calls the kernel op `murmur_hash32_cpu`.
   An audit of a CPU server would need `--skip-determinism`.
4. **One request for more top logprobs than the vocabulary kills the server** (`top_logprobs_num` = V + 1:
   `RuntimeError: selected index k out of range` in the scheduler's `logprobs.topk`, then the server exits;
   the table's last probe).  [`repro_top_logprobs_over_vocab.py`](repro_top_logprobs_over_vocab.py) sends it
   to any SGLang server and reports whether it still answers.  Upstream: sgl-project/sglang#40076 (open),
   fixes #28794 and #40099 (open); still in {sglang}.  The endpoint audit never asks for more than V.
5. **What an audit of SGLang would need** (the plain server answers everything it needs): its native
   `POST /generate` with `input_ids`, `output_ids` in the reply, and the target's law from
   `return_logprob` + `logprob_start_len = 0` + `top_logprobs_num = V` (`meta_info.input_top_logprobs`:
   one request per longest prefix, as vLLM's `prompt_logprobs`); its logprobs are after the temperature
   unless the server runs with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`; and SGLang's own law, which differs
   from vLLM's: its torch sampler cuts top-p on the cumulative sum of the untruncated distribution, before
   top-k's renormalisation (`top_k_top_p_min_p_sampling_from_probs_torch`).  Not built: no speculative
   method runs here, so it would audit only the control.

The server commands, from the repository root:

{serve_commands}
"""


def _mark(value) -> str:
    return "-" if value is None else ("yes" if value else "**no**")


def _probe_cells(probes: dict | None) -> list[str]:
    if not probes:
        return ["-", "-", "-", "-"]
    sampled, seeded, vocab, over = (probes.get(k, {}) for k in ("sampled", "seeded", "top_logprobs_vocab",
                                                                  "top_logprobs_over_vocab"))  # fmt: skip
    cells = ["answers" if sampled.get("ok") else "**fails**"]
    cells.append(("same" if seeded.get("same") else "**different**") if seeded.get("ok") else "**fails**")
    if vocab.get("ok"):
        sums = vocab.get("probability_sums") or []
        spread = f"{min(sums):.4f}-{max(sums):.4f}" if sums else "-"
        cells.append(f"{'/'.join(map(str, vocab.get('entries', [])))} entries, sums {spread}")
    else:
        cells.append("**fails**")
    cells.append("server **dies**" if over and not over.get("server_answers_after") else "answers")
    return cells


def readme_rows(out: Path, configs: Sequence) -> tuple[list[str], list[str]]:
    rows, errors = [], []
    for config in configs:
        path = out / config.name / "run.json"
        if not path.exists():
            continue
        run = json.loads(path.read_text())
        startup = f"{run['startup_seconds']:.0f} s" if run.get("startup_seconds") is not None else "-"
        rows.append(f"| `{config.name}` | {config.what} | {_mark(run.get('started'))} | "
                    + " | ".join(_probe_cells(run.get("probes"))) + f" | {startup} |")  # fmt: skip
        if run.get("error"):
            errors.append(f"- `{config.name}` {run['error']}")
        over = (run.get("probes") or {}).get("top_logprobs_over_vocab") or {}
        if over.get("logged") and not over.get("server_answers_after"):
            errors.append(f"- `{config.name}`, after `top_logprobs_num` = V + 1, it logged: {over['logged']}")
    return rows, errors


def render_readme(out: Path, configs: Sequence) -> str:
    from tools.reports.sglang_served import CONFIGS
    from tools.reports.vllm_served_readme import only_flags

    runs = [json.loads((out / c.name / "run.json").read_text()) for c in configs if (out / c.name / "run.json").exists()]
    rows, errors = readme_rows(out, configs)
    return TEMPLATE.format(
        minutes=max(1, round(sum(r.get("wall_seconds", 0) for r in runs) / 60)),
        command=f"python -m tools.reports.sglang_served --out {out.as_posix()}" + only_flags(out, CONFIGS),
        sglang=SGLANG, install=INSTALL, vocab=32, rows="\n".join(rows),
        errors="What each configuration that failed logged (the last exception and the frame that raised it):\n\n"
        + "\n".join(errors) if errors else "",
        serve_commands="\n".join(f"- `{r['name']}`: `{r['serve_command']}`" for r in runs),
    )  # fmt: skip


def write_readme(out: Path, configs: Sequence) -> Path:
    return atomic_write_text(out / "README.md", render_readme(out, configs))

"""``reports/llama-server/README.md``: written from the reports of :mod:`tools.reports.llamaserver_served`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.llamaserver_build import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON
from tools.reports.vllm_served_readme import _cell, _memo, _requests, fidelity_summary, only_flags, read_runs, table_evidence

__all__ = ["INSTALL", "FINDINGS", "render_readme", "write_readme"]

#: The virtualenv and the server, one command from a fresh clone.
INSTALL = (
    'python -m venv .venvs/llama-server && . .venvs/llama-server/bin/activate && pip install torch==2.13.0 && '
    'pip install -e ".[test,plots,hf]" gguf==0.19.0 cmake ninja && python -m tools.reports.llamaserver_build'
)

#: What the rows found, written from their reports (kept when the README is regenerated).
FINDINGS = """\
1. **The law: every configuration passes.** llama-server's speculation is sample-and-match (the target's
   own sampler draws each position; a draft token is kept when it equals the draw), and the audits agree:
   the draft model and `ngram-simple` pass beside their controls at T = 1, greedy, the default chain,
   frequency + presence penalties (over the whole context, the prompt included), min-p with two logit
   biases (see 5 for its seed-0 warning), and with the repetition
   penalty and a GBNF grammar (both two-sample against the server without speculation: the repetition
   penalty's law needs logits, the grammar's is sample-check-resample), at a median detectable TV of
   0.062-0.070.  A
   seeded request returns the same tokens with and without speculation (the repro below prints both).
2. **Logprob fidelity FAILS with speculation** (the law passes; only the reported numbers are wrong).
   Every token a speculative verification step emits -- accepted drafts and the target's own correction
   alike -- is reported at logprob 0.0 (probability 1) with an empty top list: 49,657 mismatches over
   64,163 emitted tokens with the draft model, 10,778 with `ngram-simple` (it drafts less often), largest
   difference 9.57; without speculation the same server's logprobs match the teacher-forced laws within
   6.2e-4.  Standalone: [`repro_speculative_logprobs_zero.py`](repro_speculative_logprobs_zero.py)
   (exit 1; 22 of 24 tokens reported 0.0).  Upstream: ggml-org/llama.cpp#27972 (open, "llama-server
   returns logprob 0.0 (p=1.0) for every token when speculative decoding is enabled"), with the open
   PR #27196 ("server: Support logprobs with speculative decoding"); still present at commit 0c1e570.
3. **`ignore_eos` bans the end-of-generation tokens** (a logit bias of -inf, `server-schema.cpp`), where
   vLLM's keeps them in the law and only does not stop: the law under llama-server's `ignore_eos` is the
   model's without `</s>`.  The audit reads the ban from the reply's `generation_settings.logit_bias`;
   before it did, the control failed on `</s>` (0 drawn where 15 % were due) -- the audit's error, not
   the server's, and worth knowing when comparing engines.
4. **Usability, not the law:** `-md` alone loads the draft model and never drafts (the default
   `--spec-type` is `none`: 0 draft tokens in a first run); `ngram-simple`'s defaults (a 12-token lookup,
   48-token drafts) never draft on short contexts, so these rows use a 1-token lookup and K = 3.
   Acceptance on the tiny noisy pair at T = 1: {draft_t1} (draft model), {ngram_t1} (`ngram-simple`).
5. **The min-p + logit-bias rows are SUSPICIOUS at seed 0, control included, and pass at seed 1.**  All
   three flag the same test with the same numbers (independence/collisions at prompt1, p = 0.00453,
   adjusted p = 0.0652: the gate passes): sample-and-match draws the same tokens for the same seed with
   and without speculation, so the three rows are one draw.  Rerun at seed 1 (the same command with
   `--out reports/llama-server/followup_seed1 --seed 1 --only control_no_spec_minp_bias --only
   draft_k3_minp_bias --only ngram_simple_k3_minp_bias`): all three PASS
   ([`followup_seed1`](followup_seed1/README.md)).  A real deviation keeps lowering p as N grows;
   this one did not return.
"""

TEMPLATE = """# llama.cpp's llama-server, audited over HTTP

Regenerate (in the virtualenv below; about {minutes} minutes on 2 CPU cores at tier {tier}):

```bash
{command}
```

Install (one command from a fresh clone; it builds `llama-server` from the llama.cpp source that
`llama-cpp-python` {llama_cpp_python} vendors, commit `{commit}`, into `.venvs/llama-server/bin`):

```bash
{install}
```

`{version}`

**What runs.** The tiny seeded Llama (V = 32, float32 GGUF, the models of the in-process
[llama.cpp reports](../llama-cpp/README.md)) served by `llama-server` with a float32 KV cache, one
thread and 8 slots; speculation with its noisy draft model (`-md`, at most {k} draft tokens, no
minimum draft probability) or the n-gram drafter `ngram-simple`, each beside the same server without
speculation.  The audit speaks llama-server's native API (`specverify audit --api llama-server`):
`POST /completion` with a token-id prompt, `return_tokens`, `ignore_eos` and a seed per
continuation, every stage of llama.cpp's sampler chain set explicitly; the target's law after each
prefix is the same server's raw law (`n_probs` = the vocabulary, `post_sampling_probs: false`),
one prefix per request, processed with llama.cpp's documented chain (`--law-of llama.cpp`:
logit bias, penalties over the whole context including the prompt, top-k, top-p and min-p on the
untempered softmax, then the temperature).  A GBNF grammar is compared with a second server without
speculation in two-sample mode: llama.cpp's grammar law (sample, check, resample from the masked
chain) is not the mask-first law the exact mode applies.  Seed {seed}, tier {tier}.

## Results

| configuration | what | verdict | evidence | requests | laws per request | drafts accepted (server log) | start + audit |
|---|---|---|---|---|---|---|---|
{rows}

Logprob fidelity: {fidelity}.

## Findings

{findings}

## Commands

{serve_commands}
"""


def _drafts(drafts: dict | None) -> str:
    if not drafts or not drafts.get("draft_tokens"):
        return "-"
    return f"{drafts['accepted_tokens']:,} / {drafts['draft_tokens']:,} ({100 * drafts['acceptance']:.1f} %)"


def _run(out: Path, name: str) -> dict | None:
    path = out / name / "run.json"
    return json.loads(path.read_text()).get("drafts") if path.exists() else None


def readme_rows(out: Path, configs: Sequence) -> list[str]:
    rows = []
    for config, run, rep in read_runs(out, configs):
        if rep is None:
            rows.append(f"| `{config.name}` | {_cell(config.what)} | **NOT RUN** | {_cell(str(run.get('error')))} | - | - "
                        f"| - | {run.get('wall_seconds', 0):.0f} s |")  # fmt: skip
            continue
        endpoint = rep.get("extra", {}).get("endpoint", {})
        verdict = rep["verdict"].upper()
        fidelity = rep.get("extra", {}).get("logprob_fidelity")
        if fidelity:
            verdict += f"; logprob fidelity {fidelity['verdict'].upper()}"
        rows.append(
            f"| [`{config.name}`]({config.name}/report.md) | {_cell(config.what)} | **{verdict}** | "
            f"{_cell(table_evidence(rep))} | {_requests(endpoint)} | {_memo(endpoint)} | {_drafts(run.get('drafts'))} | "
            f"{run['startup_seconds']:.0f} s + {run['audit_seconds']:.0f} s |"
        )
    return rows


def _version(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return "llama-server: not installed here"
    text = (done.stdout + done.stderr).strip().splitlines()
    return " ".join(line.strip() for line in text if "version" in line or "built with" in line) or "unknown version"


def render_readme(out: Path, configs: Sequence, *, binary: str, seed: int, tier: str) -> str:
    records = [json.loads((out / c.name / "run.json").read_text()) for c in configs if (out / c.name / "run.json").exists()]
    seconds = sum(r.get("wall_seconds", 0) for r in records)
    command = f"python -m tools.reports.llamaserver_served --out {out.as_posix()} --seed {seed} --tier {tier}"
    command += only_flags(out, configs)
    serve = "\n".join(
        f"- `{r['name']}`: `{r['serve_command']}`"
        + (f"; reference: `{r['reference_serve_command']}`" if r.get("reference_serve_command") else "")
        for r in records
    )
    from tools.reports.llamaserver_served import K

    return TEMPLATE.format(
        minutes=max(1, round(seconds / 60)), tier=tier, command=command, llama_cpp_python=LLAMA_CPP_PYTHON,
        commit=LLAMA_CPP_COMMIT[:7], install=INSTALL, version=_version(binary), k=K, seed=seed,
        rows="\n".join(readme_rows(out, configs)), fidelity=fidelity_summary(out, configs),
        findings=FINDINGS.format(draft_t1=_drafts(_run(out, "draft_k3_t1.0")), ngram_t1=_drafts(_run(out, "ngram_simple_k3_t1.0"))),
        serve_commands=serve,
    )  # fmt: skip


def write_readme(out: Path, configs: Sequence, *, binary: str, seed: int, tier: str) -> Path:
    return atomic_write_text(out / "README.md", render_readme(out, configs, binary=binary, seed=seed, tier=tier))

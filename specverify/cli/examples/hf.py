"""Audit of Hugging Face transformers' assisted generation with sampling (issue 8): reports + README.

``generate_hf_reports(out_dir, *, seed=0, tier="smoke", quick=False)`` runs

* :func:`specverify.verifier.battery.check_verifier` on transformers' verifier kernel
  ``_speculative_sampling`` (through :func:`specverify.adapters.hf.speculative_sampling_verifier`,
  float32 logits as in ``generate``), and
* :func:`specverify.decoder.check_decoder` on end-to-end
  ``model.generate(assistant_model=...)`` (:class:`specverify.adapters.hf.HFAssistedDecoder`)
  against the target's exact processed conditionals (:class:`specverify.adapters.hf.HFTarget`)
  for a small matrix of configurations (:data:`CONFIGS`): temperatures, top-k / top-p on and
  off, draft lengths 1..5, greedy assisted decoding, and a lossy negative control
  (``assistant_ensemble_weight``) that must fail,

and writes each report to ``out_dir/<config>/report.{json,md,html}``, two reproducer
scripts for findings of code reading (:data:`REPRO_SCRIPTS`, executed in-process so their
output lands in the README) and a generated ``out_dir/README.md``.

The models are the offline tiny Llama pair of :mod:`specverify.adapters.hf_models`
(V = 32, target 2 layers, assistant = its first layer: same tokenizer), weights seed
:data:`MODEL_SEED`.  HF assisted generation is batch-1, so the decoder checks use fewer
samples than check_decoder's smoke plan (:data:`SIZES`); the README states every size and
the minimum detectable TV that goes with it.  Deterministic: same seed, same verdicts.

Regenerate: ``python -m specverify.cli.examples.hf --out reports/hf-transformers``.

References: Leviathan, Kalman & Matias (ICML 2023); transformers ``generation/utils.py``
(``_assisted_decoding``, ``_speculative_sampling``); design.md; bugs.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import platform
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specverify.adapters.hf import TRANSFORMERS_VERSION, HFAssistedDecoder, speculative_sampling_verifier
from specverify.adapters.hf_models import tiny_llama_pair
from specverify.core.errors import InvalidArgument
from specverify.decoder import check_decoder
from specverify.report import write_report
from specverify.report.io import atomic_write_text
from specverify.verifier.battery import check_verifier

__all__ = [
    "DecoderConfig",
    "CONFIGS",
    "SIZES",
    "HFGreedyAssistedDecoder",
    "tiny_greedy_assisted_decoder",
    "generate_hf_reports",
    "main",
]

#: Seed of the tiny models' weights (fixed; the run seed drives sampling only).
MODEL_SEED = 0
VOCAB_SIZE = 32
DEFAULT_OUT = "reports/hf-transformers"
KERNEL_NAME = "kernel_speculative_sampling"
#: Samples per prompt and new tokens per sample of the decoder checks (2 prompts each).
#: 6 new tokens: the first round of every K <= 5 covers all in-block positions and the bonus.
SIZES = {
    "full": {"num_samples": 800, "max_new_tokens": 6, "control_samples": 300},
    "quick": {"num_samples": 120, "max_new_tokens": 3, "control_samples": 120},
}
#: Sample multiplier of the decoder checks per tier (smoke sizes are :data:`SIZES`).
TIER_FACTOR = {"smoke": 1, "standard": 10, "deep": 100}
#: Verifier scenarios run in quick mode (the full run uses the whole battery).
QUICK_SCENARIOS = ("pos2_least_likely_k2",)


@dataclass(frozen=True)
class DecoderConfig:
    """One end-to-end assisted-generation configuration.

    ``temperature=None`` is greedy assisted decoding (``do_sample=False``).  ``expect`` is
    the verdict a correct implementation must get: "pass", or "fail" for a lossy control.
    """

    name: str
    k: int
    temperature: float | None = 1.0
    top_k: int = 0
    top_p: float = 1.0
    assistant_ensemble_weight: float | None = None
    expect: str = "pass"
    description: str = ""

    def options(self) -> str:
        if self.temperature is None:
            parts = ["do_sample=False (greedy)"]
        else:
            parts = [
                f"do_sample=True, temperature={self.temperature:g}",
                f"top_k={self.top_k}" if self.top_k else "top_k off",
                f"top_p={self.top_p:g}" if self.top_p < 1 else "top_p off",
            ]
        if self.assistant_ensemble_weight is not None:
            parts.append(f"assistant_ensemble_weight={self.assistant_ensemble_weight:g}")
        return ", ".join(parts) + f", K={self.k}"


CONFIGS = (
    DecoderConfig("sample_t1.0_k4", k=4, description="plain sampling, the baseline"),
    DecoderConfig("sample_t0.7_topk8_k2", k=2, temperature=0.7, top_k=8, description="sharpened + top-k truncation"),
    DecoderConfig("sample_t1.0_topp0.9_k1", k=1, top_p=0.9, description="nucleus truncation, one draft per round"),
    DecoderConfig(
        "sample_t1.3_topk12_topp0.95_k5",
        k=5,
        temperature=1.3,
        top_k=12,
        top_p=0.95,
        description="flattened, both truncations, longest block",
    ),
    DecoderConfig("greedy_k3", k=3, temperature=None, description="greedy assisted decoding (temperature 0)"),
    DecoderConfig(
        "control_ensemble_w0.5_k4",
        k=4,
        assistant_ensemble_weight=0.5,
        expect="fail",
        description="negative control: HF's lossy ensemble verification; the suite must fail it",
    ),
)
QUICK_CONFIGS = ("sample_t0.7_topk8_k2", "greedy_k3")


# ---------------------------------------------------------------------------- decoders


class HFGreedyAssistedDecoder(HFAssistedDecoder):
    """Greedy assisted decoding: ``generate(assistant_model=..., do_sample=False)``.

    Same protocol, seeding and validation as :class:`~specverify.adapters.hf.HFAssistedDecoder`
    (fixed draft length ``k``); only the generation config differs: no sampling options,
    so the assistant drafts by argmax and the target verifies by argmax matching.
    Check it with ``check_decoder(decoder, decoder.target(), greedy=True)``.
    """

    def __init__(self, model, assistant, *, k: int = 4, num_threads: int | None = 1):
        super().__init__(model, assistant, k=k, num_threads=num_threads)
        self._config_kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None)


HFGreedyAssistedDecoder.__module__ = "specverify.cli.examples.hf"  # also under ``python -m`` (reports name it)


def tiny_greedy_assisted_decoder(
    *, k: int = 4, vocab_size: int = VOCAB_SIZE, seed: int = MODEL_SEED, num_threads: int | None = 1
) -> HFGreedyAssistedDecoder:
    """CLI factory: greedy assisted decoding on the tiny pair (pair it with ``specverify.adapters.hf:tiny_target``
    of the same ``seed`` and ``--greedy``)."""
    model, assistant = tiny_llama_pair(vocab_size=vocab_size, seed=seed)
    return HFGreedyAssistedDecoder(model, assistant, k=k, num_threads=num_threads)


def build_decoder(config: DecoderConfig):
    """(decoder, target) of one configuration on a fresh tiny Llama pair (weights seed :data:`MODEL_SEED`)."""
    model, assistant = tiny_llama_pair(vocab_size=VOCAB_SIZE, seed=MODEL_SEED)
    if config.temperature is None:
        decoder = HFGreedyAssistedDecoder(model, assistant, k=config.k, num_threads=1)
    else:
        decoder = HFAssistedDecoder(
            model,
            assistant,
            k=config.k,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            assistant_ensemble_weight=config.assistant_ensemble_weight,
            num_threads=1,
        )
    return decoder, decoder.target()


# ---------------------------------------------------------------------------- summaries


def _gof_stats(report) -> dict:
    """N range and detectable-TV summary of the binned GOF tests that have power (at least two bins)."""
    gof = [r for r in report.results if r.family == "gof" and r.mde_tv is not None]
    finite = [r for r in gof if math.isfinite(float(r.mde_tv))]
    stats = {
        "n_min": None,
        "n_max": None,
        "tv_min": None,
        "tv_median": None,
        "tv_max": None,
        "tv_first": None,
        "powerless": len(gof) - len(finite),
    }
    if finite:
        tvs = sorted(float(r.mde_tv) for r in finite)
        first = [float(r.mde_tv) for r in finite if r.position == "abs=1"] if report.kind == "decoder" else []
        stats.update(
            n_min=min(r.n for r in finite),
            n_max=max(r.n for r in finite),
            tv_min=tvs[0],
            tv_median=tvs[len(tvs) // 2],
            tv_max=tvs[-1],
            tv_first=max(first) if first else None,
        )
    return stats


def _summarise(name: str, report, *, what: str, expect: str, sizes: str) -> dict:
    flagged = [
        r.summary()
        for r in sorted(report.results, key=lambda r: r.adjusted_pvalue if r.adjusted_pvalue is not None else r.pvalue)
        if r.grade in ("fail", "suspicious")
    ]
    decoder = report.extra.get("decoder") or {}
    rates = (
        [
            report.scenarios[i]["n"] / s["generate_seconds"]
            for i, s in enumerate(decoder.values())
            if isinstance(s, dict) and s.get("generate_seconds")
        ]
        if decoder
        else []
    )
    return {
        "name": name,
        "kind": report.kind,
        "what": what,
        "expect": expect,
        "verdict": report.verdict,
        "tests": len(report.results),
        "errors": list(report.errors),
        "flagged": flagged,
        "sizes": sizes,
        "greedy_n": next((r.n for r in report.results if r.family == "greedy"), None),
        "seconds": float(report.timings.get("total", 0.0)),
        "samples_per_second": min(rates) if rates else None,
        **_gof_stats(report),
    }


def _fmt_range(lo, hi, fmt="{:.3g}") -> str:
    if lo is None:
        return "-"
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} - {fmt.format(hi)}"


def _found(rows: list[dict]) -> list[str]:
    lossless = [r for r in rows if r["expect"] == "pass"]
    controls = [r for r in rows if r["expect"] == "fail"]
    unexpected = [r for r in rows if (r["verdict"] == "fail") != (r["expect"] == "fail")]
    lines = []
    passed = [r for r in lossless if r["verdict"] != "fail"]
    if passed:
        kernel = [r["tv_median"] for r in passed if r["kind"] == "verifier" and r["tv_median"] is not None]
        first = [r["tv_first"] for r in passed if r["tv_first"] is not None]
        power = []
        if kernel:
            power.append(f"median detectable binned TV {kernel[0]:.3g} in the kernel battery")
        if first:
            nodes = max(r["tv_max"] for r in passed if r["tv_first"] is not None)
            power.append(
                f"{_fmt_range(min(first), max(first))} at position 1 (up to {nodes:.3g} for later positions "
                "and prefix nodes) in the sampling decoder runs"
            )
        lines.append(
            f"- No deviation from the target's law in {len(passed)} of {len(lossless)} lossless runs "
            f"({', '.join(r['name'] for r in passed)}): no test failed at the run's family-wise alpha. "
            + (f"Power (0.9): {'; '.join(power)}; smaller deviations were not ruled out." if power else "")
        )
    for r in lossless:
        if r["verdict"] == "suspicious":
            lines.append(f"- `{r['name']}` is SUSPICIOUS (warns, passes the gate): " + "; ".join(r["flagged"][:3]))
    for r in controls:
        if r["verdict"] == "fail":
            lines.append(
                f"- The negative control `{r['name']}` FAILED, as it must (lossy by design), at "
                f"{r['sizes']}: the sample sizes have power against a real lossy rule. Strongest evidence: "
                + "; ".join(r["flagged"][:2])
            )
        else:
            lines.append(
                f"- The negative control `{r['name']}` was NOT caught ({r['verdict']}) at {r['sizes']}: "
                "these sample sizes lack power against it."
            )
    for r in unexpected:
        if r["expect"] == "pass":
            lines.append(
                f"- `{r['name']}` FAILED: "
                + "; ".join((r["errors"] + r["flagged"])[:5])
                + f" (details: `{r['name']}/report.md`)."
            )
    return lines


# ---------------------------------------------------------------------------- reproducers

FINDINGS = (
    (
        "repro_zero_uniform_support.py",
        "Zero uniform accepts a forbidden draft (support violation, ~2**-24 per draft with p(x) = 0)",
        "`_speculative_sampling` accepts draft token x iff `r <= p(x)/q(x)` with `r = torch.rand_like(...)` in "
        "float32. For a draft the target forbids (p(x) = 0 < q(x), e.g. a token outside the target's top-k / top-p "
        "set that the assistant proposes) the ratio is 0 and the draft is accepted iff r == 0 exactly. A float32 "
        "`torch.rand` on CPU is a multiple of 2**-24 in [0, 1), so this happens with probability 2**-24 ~ 5.96e-8 "
        "per such draft: an emitted token with target probability 0 at a rate of 2**-24 times the assistant's mass "
        "outside the target's support, per drafted position (e.g. one per ~1.7e8 drafted positions when that mass is "
        "0.1). The canonical rule `u * q(x) < p(x)` (strict) never does. Far too rare for a statistical battery to "
        "observe; found by reading the code and demonstrated "
        "deterministically by forcing r = 0:",
    ),
    (
        "repro_zero_residual_nan.py",
        "All-zero float32 residual on rejection: 0/0 = NaN and `torch.multinomial` raises",
        "On rejection the kernel divides `clamp(p - q, min=0)` by its sum without a zero check (the ensemble "
        "path has one, the lossless path does not). In exact arithmetic a rejection needs p(x) < q(x), which forces "
        "p(y) > q(y) for some y, so the residual has positive mass; in float32 the residual is all zero whenever "
        "p <= q elementwise at the rejected position. Two ways this happens: (A) both laws so peaked that p(a) and "
        "q(a) round to exactly 1.0 while q keeps a tiny tail, and the assistant drafts a tail token x with "
        "p(x) < q(x) (probability ~q(x) per position, then rejected with probability 1 - p(x)/q(x)); the exact "
        "answer is token a, the kernel raises `RuntimeError` and `generate` crashes; (B) p and q equal up to float32 "
        "rounding (e.g. the same logits up to an additive constant, as in the demonstration). p(x) = q(x) = 0 alone "
        "cannot trigger it in `generate` (the draft is sampled from q, so q(x) > 0). Probabilities are ~1e-9 per "
        "verification, so not observable statistically; demonstrated deterministically:",
    ),
)

REPRO_SCRIPTS = {
    "repro_zero_uniform_support.py": r'''"""transformers' _speculative_sampling accepts a draft token that has target probability 0 when its uniform is 0.

The kernel accepts draft token x iff ``r <= p(x) / q(x)`` with ``r = torch.rand_like(ratio)``.
For ``p(x) = 0`` the ratio is 0, so x is accepted iff r == 0.  A float32 ``torch.rand`` on
CPU is a multiple of 2**-24 in [0, 1) (24 random bits), so P(r == 0) = 2**-24 ~ 5.96e-8 per
such draft: a support violation (an emitted token the target forbids, e.g. one outside its
top-k / top-p set) at rate 2**-24 * q(outside the target's support) per drafted position.
The canonical rule ``u * q(x) < p(x)`` (strict) never accepts it.  This script forces r = 0
(a deterministic stand-in for the 2**-24 event) and shows the forbidden token being emitted.
Run: python repro_zero_uniform_support.py [--measure]   (--measure counts zeros in 2**28 CPU draws)
"""
import sys
from unittest import mock

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

target_probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0],      # p_1: token 2 is forbidden (p = 0), e.g. cut by top-k
                              [0.25, 0.25, 0.25, 0.25]]])  # p_2: bonus row
draft_probs = torch.tensor([[[0.25, 0.25, 0.5, 0.0]]])     # q_1: the assistant likes token 2
candidate_input_ids = torch.tensor([[9, 2]])               # prompt token 9, then draft token 2 (q = 0.5, p = 0)
kernel_args = (candidate_input_ids, draft_probs.log(), 1, target_probs.log())  # logits = log probs (float32)

print(f"transformers {transformers.__version__}, torch {torch.__version__}")
torch.manual_seed(0)
tokens, n_matches = _speculative_sampling(*kernel_args)
print(f"ordinary uniform: n_matches={int(n_matches)}, emitted {tokens[0].tolist()} (draft rejected, as it must be)")
with mock.patch.object(torch, "rand_like", lambda t, **kw: torch.zeros_like(t)):
    tokens, n_matches = _speculative_sampling(*kernel_args)
emitted = tokens[0].tolist()
print(f"uniform r = 0:    n_matches={int(n_matches)}, emitted {emitted}; p_1(token {emitted[0]}) = "
      f"{float(target_probs[0, 0, emitted[0]])} -> {'SUPPORT VIOLATION' if target_probs[0, 0, emitted[0]] == 0 else 'ok'}")
print(f"P(r == 0) for a float32 torch.rand on CPU = 2**-24 = {2.0 ** -24:.3g} per draft with p(x) = 0")
if "--measure" in sys.argv:
    gen, zeros, draws = torch.Generator().manual_seed(0), 0, 0
    for _ in range(16):
        x = torch.rand(1 << 24, generator=gen)
        zeros += int((x == 0).sum()); draws += x.numel()
    print(f"measured: {zeros} zeros in {draws} float32 draws (expected {draws * 2.0 ** -24:.1f})")
''',
    "repro_zero_residual_nan.py": r'''"""transformers' _speculative_sampling raises when a rejected position's float32 residual (p - q)+ is all zero.

On rejection the kernel computes ``p' = clamp(p - q, min=0)`` and divides by ``p'.sum()`` with
no zero check, so an all-zero residual gives 0/0 = NaN and ``torch.multinomial`` raises
RuntimeError: assisted generation crashes.  In exact arithmetic this cannot happen: a
rejection needs p(x) < q(x), and sum p = sum q = 1 then forces p(y) > q(y) somewhere.  In
float32 it happens whenever p <= q elementwise while p(x) < q(x) at the draft, e.g.

A. both laws peaked: p(a) and q(a) round to exactly 1.0 while q keeps a tiny tail mass; a
   tail draft x with p(x) < q(x) is rejected with probability 1 - p(x)/q(x).  The exact
   residual is a point mass on a (the answer is token a); the kernel raises instead.
B. p and q equal up to float32 rounding (same logits up to a constant shift, or a target
   used as its own assistant): the residual is rounding noise and is all zero in a sizeable
   fraction of rows (measured below); a rejection there (probability ~1e-7) crashes.

p(x) = q(x) = 0 alone is harmless: the draft was sampled from q, so q(x) > 0 in the generate path.
Run: python repro_zero_residual_nan.py
"""
import contextlib
from unittest import mock

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

print(f"transformers {transformers.__version__}, torch {torch.__version__}")

# ---- A: peaked laws, V = 2, K = 1
draft_logits = torch.tensor([[[0.0, -20.7]]])           # q = [1.0, 1.02e-9] in float32
target_logits = torch.tensor([[[0.0, -23.0], [0.0, 0.0]]])  # p_1 = [1.0, 1.03e-10]; p_2 = bonus row
q, p = draft_logits.softmax(-1)[0, 0], target_logits.softmax(-1)[0, 0]
print(f"A: q = {q.tolist()}, p = {p.tolist()}, float32 residual (p - q)+ = {(p - q).clamp(min=0).tolist()}; "
      f"exact residual = point mass on token 0")
candidate_input_ids = torch.tensor([[5, 1]])  # draft token 1 (the tail token)
for label, patch in (("seeded torch.manual_seed(0)", None), ("rand_like -> 0.5", lambda t, **kw: torch.full_like(t, 0.5))):
    torch.manual_seed(0)
    try:
        with mock.patch.object(torch, "rand_like", patch) if patch else contextlib.nullcontext():
            tokens, n_matches = _speculative_sampling(candidate_input_ids, draft_logits, 1, target_logits)
        print(f"   {label}: n_matches={int(n_matches)}, emitted {tokens[0].tolist()}")
    except RuntimeError as exc:
        print(f"   {label}: RuntimeError: {exc}")
print(f"   P(crash | draft = tail token) = 1 - p(x)/q(x) = {1 - float(p[1] / q[1]):.3f}; "
      f"P(draft = tail token) = q(x) = {float(q[1]):.3g}")

# ---- B: same law up to rounding (logits l and l + c), V = 32
gen = torch.Generator().manual_seed(0)
rows, zero_rows, crash = 20000, 0, 0.0
for _ in range(rows):
    logits = torch.randn(32, generator=gen) * 3
    q_row = logits.softmax(-1)
    p_row = (logits + torch.rand(1, generator=gen) * 10).softmax(-1)
    if float((p_row - q_row).clamp(min=0).sum()) == 0.0:
        zero_rows += 1
        ratio = (p_row / q_row).double()  # float32 ratio; accept iff r <= ratio, r uniform on the 2**-24 grid
        accept = torch.clamp(torch.floor(ratio * 2**24) + 1, max=2**24) / 2**24
        crash += float((q_row.double() * (1 - accept)).sum())
print(f"B: {zero_rows}/{rows} random V=32 rows with p = q mathematically have an all-zero float32 residual; "
      f"mean crash probability per K=1 verification over all rows = {crash / rows:.3g}")
''',
}


def run_repro(path: Path) -> str:
    """Run a reproducer script in-process (global RNG, threads and argv restored); return its output."""
    buffer = io.StringIO()
    argv, threads = sys.argv, torch.get_num_threads()
    try:
        sys.argv = [str(path)]
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(buffer):
            runpy.run_path(str(path), run_name="__main__")
    except Exception as exc:  # a reproducer that stops reproducing is reported, not fatal
        buffer.write(f"[the script raised {type(exc).__name__}: {exc}]\n")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)
    return buffer.getvalue()


# ---------------------------------------------------------------------------- README


def render_readme(
    rows: list[dict],
    *,
    command: str,
    seed: int,
    tier: str,
    alpha: float,
    quick: bool,
    sizes: dict,
    total_seconds: float,
    repro_outputs: dict[str, str],
) -> str:
    """The generated README of the audit (deterministic apart from the measured runtimes)."""
    out = [
        "# Hugging Face transformers: assisted generation with sampling -- specverify audit",
        "",
        f"Generated by `{command}`; do not edit by hand (rerun the command).",
        "",
        f"- transformers {TRANSFORMERS_VERSION}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()} CPU, torch threads 1 per call",
        f"- run seed {seed}, tier `{tier}`{' (quick mode: tiny sizes, a subset of configs)' if quick else ''}, "
        f"family-wise alpha {alpha:g} per report (weighted Holm); total runtime {total_seconds:.0f} s",
        f"- models: offline tiny Llama pair (`specverify.adapters.hf_models.tiny_llama_pair`, V={VOCAB_SIZE}, "
        f"weights seed {MODEL_SEED}): target 2 layers, assistant = its first layer (same tokenizer, per-token "
        "acceptance ~0.57); EOS suppressed so every sample has exactly max_new_tokens tokens",
        "",
        "## What was tested",
        "",
        f"- `{KERNEL_NAME}`: the verifier kernel `transformers.generation.utils._speculative_sampling` "
        "(float32 logits, as `generate` hands it) through `specverify.adapters.hf:speculative_sampling_verifier`, "
        f"under `check_verifier` ({'quick subset ' + ', '.join(QUICK_SCENARIOS) if quick else 'the whole battery'}: "
        "table models with exact laws, output law per absolute / in-block position and context, acceptance "
        "rates vs sum min(p, q), support, directed and independence tests).",
        f"- decoder configs: `model.generate(input_ids, assistant_model=assistant, ...)` end to end "
        "(`specverify.adapters.hf.HFAssistedDecoder`: fixed K via `num_assistant_tokens`, constant schedule, "
        "no confidence stop), checked by `check_decoder` against the target's exact processed conditionals "
        "(`HFTarget`, transformers' own logits processors): per-position and per-prefix-node GOF, PIT and "
        "entropy scores over every token, exact support, collisions; greedy: token-for-token equality with the "
        f"target's argmax continuation. Samples: {sizes['num_samples']} continuations of {sizes['max_new_tokens']} "
        f"new tokens per prompt, 2 prompts derived from the seed (negative control: {sizes['control_samples']}; "
        "greedy: check_decoder's 32 per prompt); check_decoder's smoke plan (4000 x 8) is reduced because HF "
        "assisted generation is batch-1 (one `generate` call per sample).",
        "",
        "## Results",
        "",
        "| config | generate options | expected | verdict | N per test | min detectable TV (power 0.9) | tests | "
        "samples/s | runtime |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = _fmt_range(r["n_min"], r["n_max"], "{:d}")
        tv = _fmt_range(r["tv_min"], r["tv_max"])
        if r["tv_median"] is not None and r["tv_min"] != r["tv_max"]:
            tv += f", median {r['tv_median']:.3g}"
        if r["tv_first"] is not None:
            tv += f"; position 1: {r['tv_first']:.3g}"
        if r["powerless"]:
            tv += f"; {r['powerless']} single-bin tests without power"
        if r["greedy_n"] is not None:
            n = f"{r['greedy_n']} tokens per prompt (exact)"
        rate = f"{r['samples_per_second']:.0f}" if r["samples_per_second"] else "-"
        out.append(
            f"| [`{r['name']}`]({r['name']}/report.md) | {r['what']} | {r['expect']} | "
            f"**{r['verdict'].upper()}** | {n} | {tv} | {r['tests']} | {rate} | {r['seconds']:.0f} s |"
        )
    out += [
        "",
        "N per test: samples in each binned goodness-of-fit test (per position and per context node; the "
        "directed tests use every emitted token). Min detectable TV: the binned total variation a GOF test "
        "detects with power 0.9 at its level (`sqrt(lambda*/(4N))`); smaller deviations were not ruled out. "
        "Single-bin tests (a one-hot law) have no GOF power; the exact support test covers them. "
        "Greedy runs are exact equality checks (no TV).",
        "",
        "## What the suite found",
        "",
    ]
    out += _found(rows)
    out += ["", "## Findings from reading the code (not observable at these sample sizes)", ""]
    for i, (script, title, text) in enumerate(FINDINGS, 1):
        out += [
            f"### {i}. {title}",
            "",
            text,
            "",
            f"`python {script}` ([{script}]({script})) printed:",
            "",
            "```",
            repro_outputs.get(script, "(not run)").rstrip(),
            "```",
            "",
        ]
    out += [
        "## Reproduce",
        "",
        "```",
        command,
        "```",
        "",
        "Each report directory holds `report.json` (the record), `report.md` and `report.html`. The same seed "
        "gives the same verdicts and statistics; only the runtimes change.",
        "",
    ]
    return "\n".join(out)


# ---------------------------------------------------------------------------- driver


def _command(out_dir, seed: int, tier: str, quick: bool, configs) -> str:
    cmd = f"python -m specverify.cli.examples.hf --out {out_dir} --seed {seed} --tier {tier}"
    if quick:
        cmd += " --quick"
    for name in configs or ():
        cmd += f" --config {name}"
    return cmd


def generate_hf_reports(
    out_dir=DEFAULT_OUT,
    *,
    seed: int = 0,
    tier: str = "smoke",
    quick: bool = False,
    plots: bool = True,
    configs=None,
    alpha: float = 1e-3,
    progress=None,
) -> list:
    """Run the HF audit and write its reports and README; return ``[(name, Report), ...]``.

    Parameters
    ----------
    out_dir : path
        Reports go to ``out_dir/<name>/``, plus ``out_dir/README.md`` and the reproducer scripts.
    seed : int
        Root seed of every check (the models' weights are fixed, seed :data:`MODEL_SEED`).
    tier : {"smoke", "standard", "deep"}
        Tier of the verifier battery; decoder sample sizes are :data:`SIZES` times :data:`TIER_FACTOR`.
    quick : bool
        Tiny sizes and a subset (:data:`QUICK_SCENARIOS`, :data:`QUICK_CONFIGS`): a smoke test of this module.
    plots : bool
        Embed PNG plots in ``report.html`` (needs matplotlib).
    configs : sequence of str, optional
        Only these names (``kernel_speculative_sampling`` and / or :data:`CONFIGS` names).
    alpha : float
        Family-wise false-alarm rate of each report.
    progress : callable, optional
        ``progress(message)`` before each stage.
    """
    if tier not in TIER_FACTOR:
        raise InvalidArgument(f"tier must be one of {tuple(TIER_FACTOR)}, got {tier!r}")
    known = (KERNEL_NAME, *(c.name for c in CONFIGS))
    if configs is not None:
        configs = tuple(configs)
        bad = [c for c in configs if c not in known]
        if bad:
            raise InvalidArgument(f"configs must be names among {known}, got {bad!r}")
    wanted = configs or ((KERNEL_NAME, *QUICK_CONFIGS) if quick else known)
    sizes = dict(SIZES["quick" if quick else "full"])
    sizes["num_samples"] *= TIER_FACTOR[tier]
    sizes["control_samples"] *= TIER_FACTOR[tier]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = _command(out_dir, seed, tier, quick, configs)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    reports, rows = [], []

    def finish(name, report, *, what, expect, size_text, extra):
        report = dataclasses.replace(
            report,
            command=command,
            environment={**report.environment, "transformers": TRANSFORMERS_VERSION},
            extra={**report.extra, "hf_audit": {"config": name, **extra, "sizes": size_text}},
        )
        write_report(report, out_dir / name, plots=plots)
        reports.append((name, report))
        rows.append(_summarise(name, report, what=what, expect=expect, sizes=size_text))
        say(f"{name}: {report.verdict} in {report.timings.get('total', 0.0):.0f} s")

    if KERNEL_NAME in wanted:
        say(f"{KERNEL_NAME}: check_verifier tier={tier}")
        report = check_verifier(
            speculative_sampling_verifier,
            tier=tier,
            seed=seed,
            alpha=alpha,
            scenarios=QUICK_SCENARIOS if quick else None,
            implementation=f"transformers {TRANSFORMERS_VERSION} "
            "generation.utils._speculative_sampling (float32 logits)",
        )
        finish(
            KERNEL_NAME,
            report,
            what="`_speculative_sampling` kernel, verifier battery",
            expect="pass",
            size_text=f"check_verifier tier {tier}",
            extra={"kernel": "_speculative_sampling", "dtype": "float32"},
        )
    for config in CONFIGS:
        if config.name not in wanted:
            continue
        decoder, target = build_decoder(config)
        greedy = config.temperature is None
        n = sizes["control_samples"] if config.expect == "fail" else sizes["num_samples"]
        say(
            f"{config.name}: check_decoder ({config.options()}; N={'32 (greedy plan)' if greedy else n}, "
            f"L={sizes['max_new_tokens']})"
        )
        report = check_decoder(
            decoder,
            target,
            tier=tier,
            seed=seed,
            alpha=alpha,
            greedy=True if greedy else None,
            num_samples=n,
            max_new_tokens=sizes["max_new_tokens"],
        )
        size_text = (
            f"{report.scenarios[0]['n'] if report.scenarios else n} samples x "
            f"{sizes['max_new_tokens']} new tokens per prompt, {len(report.scenarios)} prompts"
        )
        finish(
            config.name,
            report,
            what=config.options(),
            expect=config.expect,
            size_text=size_text,
            extra={**dataclasses.asdict(config), "model_seed": MODEL_SEED, "vocab_size": VOCAB_SIZE},
        )

    repro_outputs = {}
    for script, source in REPRO_SCRIPTS.items():
        path = out_dir / script
        atomic_write_text(path, source)
        say(f"{script}: running")
        repro_outputs[script] = run_repro(path)
    readme = render_readme(
        rows,
        command=command,
        seed=seed,
        tier=tier,
        alpha=alpha,
        quick=quick,
        sizes=sizes,
        total_seconds=time.perf_counter() - started,
        repro_outputs=repro_outputs,
    )
    atomic_write_text(out_dir / "README.md", readme)
    return reports


def main(argv=None) -> int:
    """``python -m specverify.cli.examples.hf --out DIR``: regenerate the HF audit; exit 1 on an unexpected verdict."""
    parser = argparse.ArgumentParser(prog="python -m specverify.cli.examples.hf", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", choices=tuple(TIER_FACTOR), default="smoke")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a subset of configs (seconds)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots in report.html")
    parser.add_argument("--config", action="append", metavar="NAME", help="run only this config (repeatable)")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

    try:
        reports = generate_hf_reports(
            args.out,
            seed=args.seed,
            tier=args.tier,
            quick=args.quick,
            plots=not args.no_plots,
            configs=args.config,
            progress=say,
        )
    except InvalidArgument as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    expected = {c.name: c.expect for c in CONFIGS}
    unexpected = 0
    for name, report in reports:
        want = expected.get(name, "pass")
        ok = (report.verdict == "fail") == (want == "fail")
        unexpected += not ok
        print(
            f"{name:34s} {report.verdict.upper():10s} expected {want:5s} {report.timings.get('total', 0.0):6.1f} s"
            f"{'' if ok else '  UNEXPECTED'}"
        )
    print(f"wrote {Path(args.out) / 'README.md'} in {time.perf_counter() - start:.0f} s")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())

"""The generated README of the HF transformers audit: per-report summaries and the Markdown.

:func:`summarise` reduces each report to the numbers the README tabulates (verdict, N per
test, detectable TV, throughput); :func:`render_readme` writes the README from those rows:
the environment, what was tested, the results table, what the suite found, the findings of
code reading with their scripts' output, and each report's reproducing command.
"""

from __future__ import annotations

import math
import platform

import torch

from specverify.adapters.hf import TRANSFORMERS_VERSION
from tools.reports.hf_config import KERNEL_NAME, MODEL_SEED, QUICK_SCENARIOS, VOCAB_SIZE
from tools.reports.hf_findings import FINDINGS, REPRO_INSTALL, UPSTREAM_CHECKED

__all__ = ["summarise", "render_readme"]


def _gof_stats(report) -> dict:
    """N range and detectable-TV summary of the binned GOF tests that have power (at least two bins)."""
    gof = [r for r in report.results if r.family == "gof" and r.mde_tv is not None]
    finite = [r for r in gof if math.isfinite(float(r.mde_tv))]
    stats: dict[str, float | None] = {
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


def summarise(name: str, report, *, what: str, expect: str, sizes: str) -> dict:
    """The README row of one report (verdict, flagged tests, N and detectable-TV ranges, throughput, command)."""
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
        "command": report.command,
        **_gof_stats(report),
    }


def _fmt_range(lo, hi, fmt="{:.3g}") -> str:
    if lo is None:
        return "-"
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)} - {fmt.format(hi)}"


def _found(rows: list[dict]) -> list[str]:
    lossless = [r for r in rows if r["expect"] == "pass"]
    controls = [r for r in rows if r["expect"] == "fail"]
    unexpected = [r for r in rows if (r["verdict"] in ("fail", "error")) != (r["expect"] == "fail")]
    lines = []
    passed = [r for r in lossless if r["verdict"] in ("pass", "suspicious")]
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
        if r["expect"] == "pass" and r["verdict"] == "error":
            lines.append(
                f"- `{r['name']}` could not be tested (ERROR): "
                + "; ".join(r["errors"][:1])[:500]
                + f" (details: `{r['name']}/report.md`)."
            )
        elif r["expect"] == "pass":
            lines.append(
                f"- `{r['name']}` FAILED: "
                + "; ".join((r["errors"] + r["flagged"])[:5])
                + f" (details: `{r['name']}/report.md`)."
            )
    return lines


# ---------------------------------------------------------------------------- README sections


def _header(
    *,
    command: str,
    seed: int,
    tier: str,
    alpha: float,
    quick: bool,
    total_seconds: float,
    runtimes_summed: bool = False,
) -> list[str]:
    runtime = f"total runtime {total_seconds:.0f} s"
    if runtimes_summed:
        runtime += " (the reports' runtimes summed: this README was rewritten with `--readme-only`)"
    return [
        "# Hugging Face transformers: assisted generation with sampling -- specverify audit",
        "",
        f"Generated by `{command}`; do not edit by hand (rerun the command).",
        "",
        f"- transformers {TRANSFORMERS_VERSION}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()} CPU, torch threads 1 per call",
        f"- run seed {seed}, tier `{tier}`{' (quick mode: tiny sizes, a subset of configs)' if quick else ''}, "
        f"family-wise alpha {alpha:g} per report (weighted Holm); {runtime}",
        f"- models: offline tiny Llama pair (`specverify.adapters.fixtures.llama.tiny_llama_pair`, V={VOCAB_SIZE}, "
        f"weights seed {MODEL_SEED}): target 2 layers, assistant = its first layer (same tokenizer, per-token "
        "acceptance ~0.57); EOS suppressed so every sample has exactly max_new_tokens tokens",
        "",
    ]


def _tested(*, quick: bool, sizes: dict) -> list[str]:
    return [
        "## What was tested",
        "",
        f"- `{KERNEL_NAME}`: the verifier kernel `transformers.generation.utils._speculative_sampling` "
        "(float32 logits, as `generate` hands it) through `specverify.adapters.hf:speculative_sampling_verifier`, "
        f"under `check_verifier` ({'quick subset ' + ', '.join(QUICK_SCENARIOS) if quick else 'the whole battery'}: "
        "table models with exact laws, output law per absolute / in-block position and context, acceptance "
        "rates vs sum min(p, q), support, directed and independence tests).",
        "- decoder configs: `model.generate(input_ids, assistant_model=assistant, ...)` end to end "
        "(`specverify.adapters.hf.HFAssistedDecoder`: fixed K via `num_assistant_tokens`, constant schedule, "
        "no confidence stop), checked by `check_decoder` against the target's exact processed conditionals "
        "(`HFTarget`, transformers' own logits processors): per-position and per-prefix-node GOF, PIT and "
        "entropy scores over every token, exact support, collisions; greedy: token-for-token equality with the "
        f"target's argmax continuation. Samples: {sizes['num_samples']} continuations of {sizes['max_new_tokens']} "
        f"new tokens per prompt, 2 prompts derived from the seed (negative control: {sizes['control_samples']}; "
        "greedy: check_decoder's 32 per prompt); check_decoder's smoke plan (4000 x 8) is reduced because HF "
        "assisted generation is batch-1 (one `generate` call per sample).",
        "",
    ]


def _result_row(r: dict) -> str:
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
    return (
        f"| [`{r['name']}`]({r['name']}/report.md) | {r['what']} | {r['expect']} | "
        f"**{r['verdict'].upper()}** | {n} | {tv} | {r['tests']} | {rate} | {r['seconds']:.0f} s |"
    )


def _results(rows: list[dict]) -> list[str]:
    return [
        "## Results",
        "",
        "| config | generate options | expected | verdict | N per test | min detectable TV (power 0.9) | tests | "
        "samples/s | runtime |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_result_row(r) for r in rows),
        "",
        "N per test: samples in each binned goodness-of-fit test (per position and per context node; the "
        "directed tests use every emitted token). Min detectable TV: the binned total variation a GOF test "
        "detects with power 0.9 at its level (`sqrt(lambda*/(4N))`); smaller deviations were not ruled out. "
        "Single-bin tests (a one-hot law) have no GOF power; the exact support test covers them. "
        "Greedy runs are exact equality checks (no TV).",
        "",
    ]


def _exit_text(code: int | None) -> str:
    if code is None:
        return "not run"
    return {0: "exit status 0: the bug no longer shows", 1: "exit status 1: the bug shows"}.get(
        code, f"exit status {code}: the script itself failed"
    )


def _findings(repro_outputs: dict[str, tuple[str, int]]) -> list[str]:
    out = [
        "## Findings from reading the code (not observable at these sample sizes)",
        "",
        f"| # | finding | repro (exit 1 while the bug shows) | on transformers {TRANSFORMERS_VERSION} | upstream status |",
        "|---|---|---|---|---|",
    ]
    for i, (script, title, _, upstream) in enumerate(FINDINGS, 1):
        code = repro_outputs.get(script, ("", None))[1]
        out.append(f"| {i} | {title} | [`{script}`]({script}) | {_exit_text(code)} | {upstream} |")
    out += [
        "",
        f"Upstream status checked against {UPSTREAM_CHECKED}. Each script is standalone (torch and transformers, "
        f"no specverify): `{REPRO_INSTALL}`, then `python <script>`; its docstring says what it shows and what it "
        "prints, and it exits 1 while the bug shows.",
        "",
    ]
    for i, (script, title, text, _) in enumerate(FINDINGS, 1):
        output, code = repro_outputs.get(script, ("(not run)", None))
        out += [
            f"### {i}. {title}",
            "",
            text,
            "",
            f"`python {script}` ([{script}]({script})) printed ({_exit_text(code)}):",
            "",
            "```",
            output.rstrip(),
            "```",
            "",
        ]
    return out


def _reproduce(rows: list[dict], command: str) -> list[str]:
    out = [
        "## Reproduce",
        "",
        "Each report records the `specverify audit` command that made it (its `command` field and its "
        "Reproduce section); the same seed gives the same verdicts and statistics, only the runtimes change:",
        "",
        "```sh",
    ]
    for r in rows:
        out += [f"# {r['name']}", r["command"]]
    out += [
        "```",
        "",
        "Everything in this directory, README included:",
        "",
        "```sh",
        command,
        "```",
        "",
        "Each report directory holds `report.json` (the record), `report.md` and `report.html`.",
        "",
    ]
    return out


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
    repro_outputs: dict[str, tuple[str, int]],
    runtimes_summed: bool = False,
) -> str:
    """The generated README of the audit (deterministic apart from the measured runtimes).

    Parameters
    ----------
    rows : list of dict
        :func:`summarise` of every report, in table order.
    command : str
        The command that regenerates the whole directory.
    seed, tier, alpha, quick, sizes, total_seconds
        How the audit ran (for the header and the "What was tested" section).
    repro_outputs : dict
        ``(output, exit status)`` of each reproducer script (:data:`~tools.reports.hf_findings.FINDINGS`).
    runtimes_summed : bool
        ``total_seconds`` is the reports' runtimes summed (``--readme-only`` without a stated runtime).
    """
    out = _header(
        command=command,
        seed=seed,
        tier=tier,
        alpha=alpha,
        quick=quick,
        total_seconds=total_seconds,
        runtimes_summed=runtimes_summed,
    )
    out += _tested(quick=quick, sizes=sizes)
    out += _results(rows)
    out += ["## What the suite found", "", *_found(rows), ""]
    out += _findings(repro_outputs)
    out += _reproduce(rows, command)
    return "\n".join(out)

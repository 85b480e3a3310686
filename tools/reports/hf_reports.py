"""Audit of Hugging Face transformers' assisted generation with sampling: reports + README.

``generate_hf_reports(out_dir, *, seed=0, tier="smoke", quick=False)`` runs, each as one
``specverify audit`` command (:mod:`tools.reports.hf_config`), so every report
records the command line that reproduces it:

* the verifier battery on transformers' kernel ``_speculative_sampling`` (through
  ``specverify.adapters.hf:speculative_sampling_verifier``, float32 logits as in ``generate``), and
* ``check_decoder`` on end-to-end ``model.generate(assistant_model=...)``
  (``specverify.adapters.hf:tiny_assisted_decoder``) against the target's exact processed
  conditionals (``specverify.adapters.hf:tiny_target``) for a small matrix of configurations
  (:data:`CONFIGS`): temperatures, top-k / top-p on and off, draft lengths 1..5, greedy
  assisted decoding (:func:`tiny_greedy_assisted_decoder`), and a lossy negative control
  (``assistant_ensemble_weight``) that must fail,

and writes each report to ``out_dir/<config>/report.{json,md,html}``, runs the reproducer
scripts of the findings of code reading (``reports/hf-transformers/repro_*.py``, copied to
``out_dir`` when it is elsewhere; :mod:`tools.reports.hf_findings`) so their output
lands in the README, and writes a generated ``out_dir/README.md``
(:mod:`tools.reports.hf_readme`).  ``--readme-only`` rewrites the README from the
reports already in ``out_dir`` (and reruns the scripts) without rerunning the audits.

The models are the offline tiny Llama pair of :mod:`specverify.adapters.fixtures.llama`
(V = 32, target 2 layers, assistant = its first layer: same tokenizer), weights seed
:data:`MODEL_SEED`.  HF assisted generation is batch-1, so the decoder checks use fewer
samples than check_decoder's smoke plan (:data:`SIZES`); the README states every size and
the minimum detectable TV that goes with it.  Deterministic: same seed, same verdicts.

The candidate-generator matrix (:mod:`tools.reports.hf_generators`: every other path ``generate``
can take with a draft, each with an engagement probe) runs in the same command.

Regenerate: ``python -m tools.reports.hf_reports --out reports/hf-transformers`` (about
60 minutes on one busy CPU core: 39 minutes for the first 39 reports, 26 for the 23 extra-seed and
T = 0.7 generator configurations; ``--quick`` takes about a minute).  It exits 1 when a lossless configuration does not pass.

References: Leviathan, Kalman & Matias (ICML 2023); transformers ``generation/utils.py``
(``_assisted_decoding``, ``_speculative_sampling``); docs/design.md; docs/bugs.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import sys
import time
from pathlib import Path

from specverify.adapters.hf import TRANSFORMERS_VERSION, HFAssistedDecoder
from specverify.adapters.fixtures.llama import tiny_llama_pair
from tools.reports.hf_config import (
    CONFIGS,
    DEFAULT_OUT,
    KERNEL_NAME,
    MODEL_SEED,
    QUICK_CONFIGS,
    QUICK_SCENARIOS,
    SIZES,
    TIER_FACTOR,
    VOCAB_SIZE,
    DecoderConfig,
    decoder_argv,
    kernel_argv,
)
from tools.reports.hf_findings import REPRO_SCRIPTS, repro_source, run_repro
from tools.reports.hf_generators import (
    GENERATOR_CONFIGS,
    PROBE_SAMPLES,
    QUICK_GENERATOR_CONFIGS,
    generator_argv,
    probe,
    relevant_repros,
    render_generators,
)
from tools.reports.hf_readme import render_readme, summarise
from tools.reports.common import package_version
from specverify.core.errors import InvalidArgument
from specverify.core.files import atomic_write_text

__all__ = [
    "DecoderConfig",
    "CONFIGS",
    "QUICK_CONFIGS",
    "QUICK_SCENARIOS",
    "SIZES",
    "TIER_FACTOR",
    "KERNEL_NAME",
    "MODEL_SEED",
    "VOCAB_SIZE",
    "REPRO_SCRIPTS",
    "TRANSFORMERS_VERSION",
    "audit_jobs",
    "generate_hf_reports",
    "main",
]


# ---------------------------------------------------------------------------- driver


@dataclasses.dataclass(frozen=True)
class Job:
    """One report of the audit: its ``specverify audit`` arguments and how the README describes it."""

    name: str
    argv: list[str]
    what: str
    expect: str
    size_text: str
    extra: dict


def _sizes(tier: str, quick: bool) -> dict:
    sizes = dict(SIZES["quick" if quick else "full"])
    sizes["num_samples"] *= TIER_FACTOR[tier]
    sizes["control_samples"] *= TIER_FACTOR[tier]
    return sizes


def _wanted(configs, quick: bool) -> tuple[str, ...]:
    known = (KERNEL_NAME, *(c.name for c in CONFIGS), *(c.name for c in GENERATOR_CONFIGS))
    if configs is None:
        return (KERNEL_NAME, *QUICK_CONFIGS, *QUICK_GENERATOR_CONFIGS) if quick else known
    configs = tuple(configs)
    bad = [c for c in configs if c not in known]
    if bad:
        raise InvalidArgument(f"configs must be names among {known}, got {bad!r}")
    return configs


def audit_jobs(*, seed: int = 0, tier: str = "smoke", alpha: float = 1e-3, quick: bool = False, configs=None):
    """The :class:`Job` of every report to make, in README order (validates ``tier`` and ``configs``)."""
    if tier not in TIER_FACTOR:
        raise InvalidArgument(f"tier must be one of {tuple(TIER_FACTOR)}, got {tier!r}")
    wanted, sizes = _wanted(configs, quick), _sizes(tier, quick)
    def run_args(run_seed: int) -> list[str]:
        return ["--tier", tier, "--seed", str(run_seed), "--alpha", f"{alpha:g}"]

    run = run_args(seed)
    jobs = []
    if KERNEL_NAME in wanted:
        jobs.append(
            Job(
                KERNEL_NAME,
                kernel_argv(quick=quick) + run,
                what="`_speculative_sampling` kernel, verifier battery",
                expect="pass",
                size_text=f"check_verifier tier {tier}",
                extra={"kernel": "_speculative_sampling", "dtype": "float32"},
            )
        )
    for config in CONFIGS:
        if config.name not in wanted:
            continue
        n = sizes["control_samples"] if config.expect == "fail" else sizes["num_samples"]
        argv = decoder_argv(config, num_samples=n, max_new_tokens=sizes["max_new_tokens"]) + run
        extra = {**dataclasses.asdict(config), "model_seed": MODEL_SEED, "vocab_size": VOCAB_SIZE}
        jobs.append(Job(config.name, argv, config.options(), config.expect, "", extra))
    for gconfig in GENERATOR_CONFIGS:
        if gconfig.name not in wanted:
            continue
        argv = generator_argv(gconfig, num_samples=sizes["num_samples"], max_new_tokens=sizes["max_new_tokens"])
        argv += run_args(seed + gconfig.seed_offset)
        extra = {**dataclasses.asdict(gconfig), "model_seed": MODEL_SEED}
        jobs.append(Job(gconfig.name, argv, gconfig.options(), gconfig.expect, "", extra))
    return jobs, sizes


def _size_text(job: Job, report, max_new_tokens: int) -> str:
    if job.size_text:
        return job.size_text
    n = report.scenarios[0]["n"] if report.scenarios else "?"
    return f"{n} samples x {max_new_tokens} new tokens per prompt, {len(report.scenarios)} prompts"


def _recorded_runtime(out_dir: Path, reports) -> tuple[float, bool]:
    """``--readme-only``: the reports' runtimes summed (a README written by a ``--config`` run states only
    that run's time, so no total is carried over).  Returns ``(seconds, summed)``."""
    return sum(float(r.timings.get("total", 0.0)) for _, r in reports), True


def _recorded_size(report) -> str:
    return str((report.extra.get("hf_audit") or {}).get("sizes", "?"))


def _command(out_dir, seed: int, tier: str, quick: bool, configs) -> str:
    cmd = f"python -m tools.reports.hf_reports --out {out_dir} --seed {seed} --tier {tier}"
    if quick:
        cmd += " --quick"
    for name in configs or ():
        cmd += f" --config {name}"
    return cmd


def _run_findings(out_dir: Path, say, scripts=REPRO_SCRIPTS) -> dict[str, tuple[str, int]]:
    """Run every repro script from ``out_dir`` (copied there from the checkout if needed): (output, exit status)."""
    outputs = {}
    for script in scripts:
        source, path = repro_source(script), out_dir / script
        if not path.exists() or not path.samefile(source):
            shutil.copyfile(source, path)
        say(f"{script}: running")
        outputs[script] = run_repro(path)
    return outputs


def _insert_generators(readme: str, section: str) -> str:
    """Put the candidate-generator section before the code-reading findings."""
    marker = "## Findings from reading the code"
    head, found, tail = readme.partition(marker)
    return head + section + "\n" + found + tail if found else readme + "\n" + section


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
    readme_only: bool = False,
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
    readme_only : bool
        Load the reports already in ``out_dir`` instead of running the audits, rerun the repro
        scripts and rewrite the README (keeping the total runtime it states; else the reports'
        runtimes summed).
    """
    from specverify.cli.commands import audit_report
    from specverify.report import load_report, write_report

    jobs, sizes = audit_jobs(seed=seed, tier=tier, alpha=alpha, quick=quick, configs=configs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = _command(out_dir, seed, tier, quick, configs)
    say = progress or (lambda message: None)
    started = time.perf_counter()
    reports, rows = [], []
    generator_configs = {c.name: c for c in GENERATOR_CONFIGS}
    generator_names = set(generator_configs)
    for job in jobs:
        if readme_only:
            report = load_report(out_dir / job.name / "report.json")
            reports.append((job.name, report))
            rows.append(summarise(job.name, report, what=job.what, expect=job.expect, sizes=_recorded_size(report)))
            continue
        say(f"{job.name}: specverify audit {' '.join(job.argv)}")
        report = audit_report(job.argv)
        size_text = _size_text(job, report, sizes["max_new_tokens"])
        audit = {"config": job.name, **job.extra, "sizes": size_text}
        if job.name in generator_names:
            audit["probe"] = probe(generator_configs[job.name], samples=20 if quick else PROBE_SAMPLES)
        report = dataclasses.replace(
            report,
            environment={**report.environment, "transformers": TRANSFORMERS_VERSION, "scikit-learn": package_version("scikit-learn")},
            extra={**report.extra, "hf_audit": audit},
        )
        write_report(report, out_dir / job.name, plots=plots)
        reports.append((job.name, report))
        rows.append(summarise(job.name, report, what=job.what, expect=job.expect, sizes=size_text))
        say(f"{job.name}: {report.verdict} in {report.timings.get('total', 0.0):.0f} s")
    total_seconds, summed = (
        _recorded_runtime(out_dir, reports) if readme_only else (time.perf_counter() - started, False)
    )
    readme = render_readme(
        rows,
        command=command,
        seed=seed,
        tier=tier,
        alpha=alpha,
        quick=quick,
        sizes=sizes,
        total_seconds=total_seconds,
        repro_outputs=_run_findings(out_dir, say),
        runtimes_summed=summed,
    )
    generated = [(name, report) for name, report in reports if name in generator_names]
    if generated:
        readme = _insert_generators(readme, render_generators(generated, _run_findings(out_dir, say, relevant_repros(generated))))
    atomic_write_text(out_dir / "README.md", readme)
    return reports


def main(argv=None) -> int:
    """``python -m tools.reports.hf_reports --out DIR``: regenerate the HF audit; exit 1 on an unexpected verdict."""
    parser = argparse.ArgumentParser(prog="python -m tools.reports.hf_reports", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", choices=tuple(TIER_FACTOR), default="smoke")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a subset of configs (seconds)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots in report.html")
    parser.add_argument("--config", action="append", metavar="NAME", help="run only this config (repeatable)")
    parser.add_argument(
        "--readme-only", action="store_true", help="rewrite README.md from the reports in --out (no audit rerun)"
    )
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
            readme_only=args.readme_only,
        )
    except InvalidArgument as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    expected = {c.name: c.expect for c in (*CONFIGS, *GENERATOR_CONFIGS)}
    unexpected = 0
    for name, report in reports:
        want = expected.get(name, "pass")
        ok = report.passed == (want != "fail")
        unexpected += not ok
        print(
            f"{name:34s} {report.verdict.upper():10s} expected {want:5s} {report.timings.get('total', 0.0):6.1f} s"
            f"{'' if ok else '  UNEXPECTED'}"
        )
    print(f"wrote {Path(args.out) / 'README.md'} in {time.perf_counter() - start:.0f} s")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())

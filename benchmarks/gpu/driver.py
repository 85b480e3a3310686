"""The prepared accelerator check of issue 16: one run, everything written under one folder.

Sections (each timed, each skipped with a note when the time budget would be exceeded):

1. ``environment.json`` -- torch/CUDA versions, the device, and ``nvidia_smi.txt`` (written by run.sh);
2. ``decoder.json`` -- the reference decoder (``reference.decoder.SpeculativeDecoder``) in
   bfloat16 vs direct sampling (``reference.direct.DirectSampler``): new tokens/s at each batch
   size, tokens per target pass, time per target pass (a direct step) against the
   memory-bound estimate of ``specverify.measure.costmodel.target_pass_seconds``;
3. ``check_verifier.json`` (+ ``check_verifier/report.{json,md}``) --
   ``check_verifier(reference.rules.verify, device=...)`` at the smoke tier: verdict, wall time
   and detectable TV;
4. ``kernels.json`` (+ ``kernel_<name>/report.{json,md}``) -- the FlashInfer and vLLM adapters of
   ``specverify.adapters.flashinfer`` audited on the device when their packages import;
5. ``check_verifier_standard.json`` (+ ``check_verifier_standard/``) -- the same audit at the
   standard tier, run only when its time projected from the smoke run (x the tiers' sample
   ratio) fits in what is left of the budget;
6. ``summary.json`` -- the figures above in one place, what was skipped and why, and the result
   of the suite's CUDA tests (``--gpu-tests``: the JUnit XML of ``pytest -m gpu``, run by
   run.sh before the driver); rewritten after every section, so a run stopped by its time
   limit keeps what it finished.

``--dry-run``: the same code paths on the CPU with tiny sizes (CI runs it, < 30 s).

Usage: python benchmarks/gpu/driver.py --out DIR [--dry-run] [--device cuda:0] [--budget 200] [--gpu-tests XML]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

import specverify as sv
from specverify.measure.costmodel import target_pass_seconds
from specverify.report import write_report
from specverify.verifier.scenarios import TIER_SCALE
from specverify_reference.decoder import SpeculativeDecoder
from specverify_reference.direct import DirectSampler
from specverify_reference.models import make_pair
from specverify_reference.processors import SamplingConfig
from specverify_reference.rules import verify as reference_verify

#: Sizes of the real run and of the dry run.
SIZES = {
    "gpu": dict(
        vocab=32000, d_model=2048, layers=16, heads=16, draft_layers=2, batches=(1, 64), k=4, max_new=128,
        repeats=3, scenarios=None, kernel_tier="smoke", bytes_per_param=2.0,
        kernel_scenarios=["pos8_uniform_k4", "markov8_temperature_k2", "pos32_adversary_k4", "pos32_topk_disjoint_k4"],
    ),
    "dry": dict(
        vocab=64, d_model=32, layers=2, heads=2, draft_layers=1, batches=(1, 4), k=2, max_new=8,
        repeats=1, scenarios=["pos8_uniform_k4"], kernel_tier="smoke", bytes_per_param=2.0,
        kernel_scenarios=["pos8_uniform_k4"],
    ),
}  # fmt: skip
#: HBM bandwidth (bytes/s) by device-name substring, for the memory-bound estimate.
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40": 0.864e12, "A10": 0.6e12, "T4": 0.32e12}
#: The kernel packages' modules and distributions (their versions go into environment.json).
KERNEL_PACKAGES = {"flashinfer": "flashinfer-python", "vllm": "vllm"}
#: The standard tier's time projected from the smoke tier's: the ratio of their samples, with a margin.
STANDARD_OVER_SMOKE = 1.25 * TIER_SCALE["standard"] / TIER_SCALE["smoke"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, repeats: int, device: torch.device):
    fn()  # warm-up (compilation, allocator)
    times, result = [], None
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def environment(device: torch.device) -> dict:
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "specverify": sv.__version__,
        "threads": torch.get_num_threads(),
        "kernel_packages": _package_versions(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_name=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
        )
    return env


def standard_tier_veto(smoke_seconds: float | None, seconds_left: float) -> str | None:
    """Why the standard-tier audit is skipped, or None to run it: its time projected from the smoke run's."""
    if smoke_seconds is None:
        return "the smoke-tier audit did not finish"
    projected = smoke_seconds * STANDARD_OVER_SMOKE
    if projected <= seconds_left:
        return None
    return f"projected {projected:.0f} s (smoke tier {smoke_seconds:.1f} s), {seconds_left:.0f} s left of the budget"


def gpu_tests(xml_path: str | None) -> dict | None:
    """Counts and failed test ids of a JUnit XML report (``pytest --junitxml``); None without one.

    A missing or unreadable file (pytest absent, or stopped by its time limit) is reported as such.
    """
    if xml_path is None:
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as exc:
        return dict(error=f"no test results: {type(exc).__name__}: {exc}"[:500])
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return dict(error="no testsuite in the test results")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return dict(**counts, failed=failed)


def _package_versions() -> dict:
    """``{module: version or None}`` of the kernel packages, found without importing them."""
    from importlib import metadata, util

    found = {}
    for module, dist in KERNEL_PACKAGES.items():
        try:
            found[module] = metadata.version(dist) if util.find_spec(module) else None
        except metadata.PackageNotFoundError:
            found[module] = "unknown version"
    return found


def bench_decoder(device: torch.device, size: dict, dtype: torch.dtype, bandwidth: float) -> dict:
    """Speculative vs direct tokens/s per batch size; tokens per pass; time per target pass vs the estimate."""
    target, drafter = make_pair(
        vocab_size=size["vocab"], seed=0, device=device, dtype=dtype, d_model=size["d_model"],
        n_layers=size["layers"], n_heads=size["heads"], draft_layers=size["draft_layers"],
    )  # fmt: skip
    params = sum(p.numel() for p in target.parameters())
    estimate = target_pass_seconds(params, bytes_per_parameter=size["bytes_per_param"], bandwidth_bytes_per_s=bandwidth)
    sampling = SamplingConfig(temperature=1.0)
    rows = []
    prompt_gen = torch.Generator().manual_seed(0)
    for B in size["batches"]:
        prompts = torch.randint(0, size["vocab"], (B, 8), generator=prompt_gen).to(device)  # (B, 8)
        L = size["max_new"]

        def gen():
            return torch.Generator(device=device).manual_seed(1)

        direct = DirectSampler(target, sampling)
        t_direct, _ = _timed(lambda: direct.generate_batch(prompts, L, generator=gen()), size["repeats"], device)
        spec = SpeculativeDecoder(target, drafter, k=size["k"], sampling=sampling)
        t_spec, result = _timed(lambda: spec.generate_batch(prompts, L, generator=gen()), size["repeats"], device)
        stats = result.stats
        rows.append(
            dict(
                batch=B,
                k=size["k"],
                new_tokens=L,
                direct_tokens_per_s=B * L / t_direct,
                speculative_tokens_per_s=B * L / t_spec,
                speedup=t_direct / t_spec,
                tokens_per_target_pass=stats.tokens_per_pass,
                acceptance_by_position=list(stats.acceptance_rate),
                seconds_per_target_pass=t_direct / L,
                memory_bound_seconds_per_pass=estimate,
                pass_over_estimate=(t_direct / L) / estimate,
            )
        )
    return dict(dtype=str(dtype).removeprefix("torch."), parameters=params, bandwidth_bytes_per_s=bandwidth, rows=rows)


def audit(verify, out: Path, device: torch.device, tier: str, scenarios) -> dict:
    start = time.perf_counter()
    report = sv.check_verifier(verify, tier=tier, seed=0, device=device, scenarios=scenarios)
    seconds = time.perf_counter() - start
    write_report(report, out, plots=False)
    tvs = sorted(r.mde_tv for r in report.results if isinstance(r.mde_tv, float) and r.mde_tv == r.mde_tv)
    return dict(
        verdict=report.verdict,
        errors=list(report.errors),
        seconds=seconds,
        tests=len(report.results),
        detectable_tv_median=statistics.median(tvs) if tvs else None,
        detectable_tv_best=tvs[0] if tvs else None,
        tier=tier,
    )


def kernels(out: Path, device: torch.device, tier: str, scenarios, dry_run: bool) -> dict:
    """Audit each GPU kernel adapter whose package imports (on CPU in a dry run: only the import probe)."""
    from specverify.adapters import flashinfer, vllm

    found = {}
    for name, build in (
        ("flashinfer_chain", flashinfer.flashinfer_chain_verifier),
        ("vllm_rejection_sample", vllm.vllm_rejection_sample_verifier),
    ):
        try:
            verify = build()
        except Exception as exc:  # not installed (ImportError) or an unknown version
            found[name] = dict(status="not available", reason=f"{type(exc).__name__}: {exc}"[:500])
            continue
        if dry_run or device.type != "cuda":
            found[name] = dict(status="importable; not run off CUDA")
            continue
        try:
            found[name] = dict(status="audited", **audit(verify, out / f"kernel_{name}", device, tier, scenarios))
        except Exception as exc:
            found[name] = dict(status="audit raised", reason="".join(traceback.format_exception(exc))[-2000:])
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for every output")
    parser.add_argument("--dry-run", action="store_true", help="same code paths on the CPU, tiny sizes")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run (sections skip past it)")
    parser.add_argument(
        "--gpu-tests", metavar="XML", help="JUnit XML of the suite's CUDA tests, reported in the summary"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = SIZES["dry" if args.dry_run else "gpu"]
    device = torch.device("cpu" if args.dry_run else args.device)
    started = time.perf_counter()
    summary: dict = {"dry_run": args.dry_run, "device": str(device), "sections": {}, "skipped": {}}
    summary["gpu_tests"] = gpu_tests(args.gpu_tests)
    env = environment(device)
    (out / "environment.json").write_text(json.dumps(env, indent=2))
    name = env.get("device_name", "")
    bandwidth = next((bw for key, bw in BANDWIDTH.items() if key in name), 3.35e12)

    def write_summary() -> None:
        summary["seconds"] = time.perf_counter() - started
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))

    def standard_fits() -> str | None:
        if args.dry_run:
            return "dry run"
        smoke = summary["sections"].get("check_verifier", {}).get("result")
        return standard_tier_veto(
            None if smoke is None else smoke["seconds"], args.budget - (time.perf_counter() - started)
        )

    # (section, estimated seconds, function, extra reason to skip or None)
    sections = [
        ("decoder", 90.0, lambda: bench_decoder(device, size, torch.bfloat16, bandwidth), None),
        ("check_verifier", 20.0, lambda: audit(reference_verify, out / "check_verifier", device, "smoke", size["scenarios"]), None),
        ("kernels", 90.0, lambda: kernels(out, device, size["kernel_tier"], size["kernel_scenarios"], args.dry_run), None),
        ("check_verifier_standard", 0.0, lambda: audit(reference_verify, out / "check_verifier_standard", device, "standard", size["scenarios"]), standard_fits),
    ]  # fmt: skip
    for section, estimate, fn, veto in sections:
        left = args.budget - (time.perf_counter() - started)
        reason = veto() if veto is not None else None
        if reason is None and not args.dry_run and left < estimate:
            reason = f"{left:.0f} s left of the budget, the section needs about {estimate:.0f} s"
        if reason is not None:
            summary["skipped"][section] = reason
            write_summary()
            continue
        t0 = time.perf_counter()
        try:
            result = fn()
            (out / f"{section}.json").write_text(json.dumps(result, indent=2, default=str))
            summary["sections"][section] = dict(seconds=time.perf_counter() - t0, result=result)
        except Exception as exc:
            summary["sections"][section] = dict(error="".join(traceback.format_exception(exc))[-3000:])
        write_summary()
        print(f"{section}: {time.perf_counter() - t0:.1f} s", flush=True)
    write_summary()
    failed = [s for s, v in summary["sections"].items() if "error" in v]
    tests = summary["gpu_tests"] or {}
    if tests.get("failures") or tests.get("errors") or "error" in tests:
        failed.append("gpu_tests")
    print(
        f"done in {summary['seconds']:.1f} s; errors in: {failed or 'none'}; skipped: {list(summary['skipped']) or 'none'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

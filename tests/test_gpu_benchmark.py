"""benchmarks/gpu/run.sh --dry-run: the prepared accelerator check runs end to end on the CPU (tiny sizes)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"
RUN_SH = GPU_DIR / "run.sh"
#: What a lent machine returns at most (the device tool's limit): the packed output must fit.
RETURNED_FILES = 8


def _run(out: Path, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(RUN_SH), "--dry-run", *options], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_run_sh_dry_run_writes_every_output_packed_into_a_few_files(tmp_path):
    out = tmp_path / "out"
    _run(out)
    returned = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert returned == ["exit_code.txt", "gpu_check.tar.gz", "log.txt", "summary.json"]
    assert len(returned) <= RETURNED_FILES and (out / "exit_code.txt").read_text().strip() == "0"
    with tarfile.open(out / "gpu_check.tar.gz") as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    tree = tmp_path / "unpacked" / "gpu_check"
    for name in ("log.txt", "exit_code.txt", "nvidia_smi.txt", "gpu_tests.txt", "gpu_tests.xml", "environment.json",
                 "decoder.json", "check_verifier.json", "kernels.json", "summary.json", "check_verifier/report.json",
                 "check_verifier/report.md"):  # fmt: skip
        assert (tree / name).is_file(), name
    summary = json.loads((tree / "summary.json").read_text())
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["device"] == "cpu"
    assert summary["skipped"] == {"check_verifier_standard": "dry run"}
    tests = summary["gpu_tests"]  # the suite's CUDA tests ran (pytest -m gpu) and skipped on the CPU
    assert tests["tests"] >= 1 and tests["skipped"] == tests["tests"] and tests["failed"] == []
    assert all("error" not in s for s in summary["sections"].values()), summary
    decoder = json.loads((tree / "decoder.json").read_text())
    assert decoder["dtype"] == "bfloat16" and [r["batch"] for r in decoder["rows"]] == [1, 4]
    for row in decoder["rows"]:
        assert row["direct_tokens_per_s"] > 0 and row["speculative_tokens_per_s"] > 0
        assert 1.0 <= row["tokens_per_target_pass"] <= row["k"] + 1
        assert row["memory_bound_seconds_per_pass"] > 0
    audit = json.loads((tree / "check_verifier.json").read_text())
    assert audit["verdict"] == "pass" and audit["detectable_tv_median"] > 0 and audit["tier"] == "smoke"
    kernels = json.loads((tree / "kernels.json").read_text())
    assert set(kernels) == {"flashinfer_chain", "vllm_rejection_sample"}
    environment = json.loads((tree / "environment.json").read_text())
    assert set(environment["kernel_packages"]) == {"flashinfer", "vllm"}


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_driver", GPU_DIR / "driver.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    return driver


def test_gpu_test_results_are_read_from_junit_xml(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_devices" name="test_a"/>'
        '<testcase classname="tests.test_devices" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_gpu_kernels" name="test_c"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    read = _driver().gpu_tests(str(xml))
    assert read == dict(tests=3, failures=1, errors=0, skipped=1, failed=["tests.test_devices::test_b"])
    assert "no test results" in _driver().gpu_tests(str(tmp_path / "missing.xml"))["error"]
    assert _driver().gpu_tests(None) is None


def test_standard_tier_runs_only_when_its_projection_fits():
    driver = _driver()
    ratio = driver.STANDARD_OVER_SMOKE
    assert ratio >= 16  # the standard tier has 16x the smoke tier's samples
    assert driver.standard_tier_veto(10.0, 10.0 * ratio) is None
    assert "projected" in driver.standard_tier_veto(10.0, 10.0 * ratio - 1)
    assert "did not finish" in driver.standard_tier_veto(None, 1e9)

"""benchmarks/gpu/run.sh --dry-run: the prepared accelerator check runs end to end on the CPU (tiny sizes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RUN_SH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_run_sh_dry_run_writes_every_output(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    done = subprocess.run(["bash", str(RUN_SH), "--dry-run"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("log.txt", "nvidia_smi.txt", "environment.json", "decoder.json", "check_verifier.json",
                 "kernels.json", "summary.json", "check_verifier/report.json", "check_verifier/report.md"):  # fmt: skip
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["device"] == "cpu" and not summary["skipped"]
    assert all("error" not in s for s in summary["sections"].values()), summary
    decoder = json.loads((out / "decoder.json").read_text())
    assert decoder["dtype"] == "bfloat16" and [r["batch"] for r in decoder["rows"]] == [1, 4]
    for row in decoder["rows"]:
        assert row["direct_tokens_per_s"] > 0 and row["speculative_tokens_per_s"] > 0
        assert 1.0 <= row["tokens_per_target_pass"] <= row["k"] + 1
        assert row["memory_bound_seconds_per_pass"] > 0
    audit = json.loads((out / "check_verifier.json").read_text())
    assert audit["verdict"] == "pass" and audit["detectable_tv_median"] > 0
    kernels = json.loads((out / "kernels.json").read_text())
    assert set(kernels) == {"flashinfer_chain", "vllm_rejection_sample"}
    assert (out / "exit_code.txt").read_text().strip() == "0"

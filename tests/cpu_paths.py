"""The CPU code paths torch and numpy dispatch to, as environment settings, and a check of the recording on each.

torch picks its vector kernels by ``ATEN_CPU_CAPABILITY`` (``avx512``, ``avx2``, ``default``
= scalar); numpy by the dispatch targets that ``NPY_DISABLE_CPU_FEATURES`` leaves on.  A path
is emulated on any x86-64 machine that has it or a better one:

* ``native``  -- the machine's own choice;
* ``avx2``    -- torch's AVX2 kernels, numpy without its AVX-512 targets, MKL's AVX2 code
  (an AVX2-only CPU);
* ``default`` -- torch's scalar kernels, numpy with no dispatch target (baseline code only),
  MKL's SSE4.2 code.

Only features this machine supports are named (numpy warns about the others), so the settings
are valid everywhere.  ``python tests/cpu_paths.py PATH`` prints them as shell assignments;
``python tests/cpu_paths.py --check`` (run under those settings) reruns the reference verifier's
smoke run at seed 0, fails (exit 1) unless it reproduces the recording as
``tests/test_devices.py::test_cpu_is_bit_identical_to_the_recorded_run`` requires, and prints how
many of the recorded numbers it reproduced to the bit.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

PATHS = ("native", "avx2", "default")
RECORDING = Path(__file__).parent / "data" / "reference_smoke_seed0.json"


def _numpy_targets_on() -> list[str]:
    """numpy's dispatch targets that this CPU supports (the ones a setting can turn off)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def environment(path: str) -> dict[str, str]:
    """The environment variables that select ``path`` (empty for ``native``)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "native":
        return {}
    targets = _numpy_targets_on()
    if path == "avx2":
        off = [t for t in targets if t.startswith("AVX512") or t == "X86_V4"]
        env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    else:
        off = targets
        env = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    if off:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(off)
    return env


def check_recording() -> tuple[int, int, float]:
    """Rerun the recorded smoke run; (numbers equal to the bit, numbers compared, largest relative difference).

    Raises AssertionError when a label differs or a number moved by more than
    ``_results.assert_same_statistics`` allows (1e-9 relative): the check CI runs on each path.
    """
    from _results import assert_same_statistics

    import specverify as sv
    from specverify_reference.rules import verify

    recorded = json.loads(RECORDING.read_text())["results"]
    report = sv.check_verifier(verify, tier="smoke", seed=0, device="cpu", dtype="float32")
    assert_same_statistics(recorded, report.results)
    same, total, worst = 0, 0, 0.0
    for old, new in zip(recorded, report.results, strict=True):
        for key in ("statistic", "pvalue"):
            a, b = float(old[key]), float(getattr(new, key))
            total += 1
            if a == b or (math.isnan(a) and math.isnan(b)):
                same += 1
            else:
                worst = max(worst, abs(a - b) / max(abs(a), abs(b)))
    return same, total, worst


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        import torch

        same, total, worst = check_recording()
        print(
            f"torch {torch.backends.cpu.get_cpu_capability()}, numpy targets on: {' '.join(_numpy_targets_on()) or 'none'}: "
            f"{same}/{total} recorded numbers reproduced to the bit, largest relative difference {worst:.2g}"
        )
        return 0
    if len(argv) != 1:
        print("usage: python tests/cpu_paths.py native|avx2|default  |  --check", file=sys.stderr)
        return 2
    print(" ".join(f"{key}='{value}'" for key, value in environment(argv[0]).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Compare a regenerated report directory with the committed one, report by report.

::

    python -m tools.reports.compare reports/llama-cpp /path/to/fresh/clone/reports/llama-cpp

For every ``<config>/report.json`` present in both: the verdicts, the tests (labels and sample
sizes) and the largest relative difference of any statistic (on the scale of at least 1, so a z-score
near 0 is compared absolutely) or p-value (those below 1e-12 are not compared).  A run whose exact law is a
float32 model forward reproduces within 1e-3 relative on another CPU, with equal tokens and the
same verdict; a float64-table run to the last bits (docs/reproducibility.md).  Prints one line per
report and exits 1 when a verdict or a test's labels differ, or a number moves by more than
``--rtol`` (default 1e-3).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

LABELS = ("family", "name", "scenario", "position", "n")


def _relative(a: float, b: float, floor: float = 1e-300) -> float:
    """``|a - b|`` relative to ``max(|a|, |b|, floor)``."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), floor)


def compare_report(old: dict, new: dict) -> dict:
    """``verdicts`` (old, new), ``same_tests``, ``max_rel`` over statistics and p-values, ``where`` it is."""
    same = len(old["results"]) == len(new["results"]) and all(
        [a.get(k) for k in LABELS] == [b.get(k) for k in LABELS] for a, b in zip(old["results"], new["results"])
    )
    worst, where = 0.0, ""
    if same:
        for a, b in zip(old["results"], new["results"]):
            for key in ("statistic", "pvalue"):
                if a.get(key) is None or b.get(key) is None:
                    continue
                # p-values below 1e-12 are compared absolutely (a p-value of 1e-15 against 1e-16 is the same verdict)
                if key == "pvalue" and max(float(a[key]), float(b[key])) < 1e-12:
                    continue
                # a statistic near 0 (a z-score) on the scale of 1: -0.00231 against -0.00232 is no change
                rel = _relative(float(a[key]), float(b[key]), 1.0 if key == "statistic" else 1e-300)
                if rel > worst:
                    worst, where = rel, f"{a['family']}/{a['name']} {a['scenario']}/{a['position']} {key}"
    return {"verdicts": (old["verdict"], new["verdict"]), "same_tests": same, "max_rel": worst, "where": where}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.reports.compare")
    parser.add_argument("committed", type=Path)
    parser.add_argument("regenerated", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args(argv)
    bad = 0
    names = sorted(p.parent.name for p in args.committed.glob("*/report.json"))
    for name in names:
        path = args.regenerated / name / "report.json"
        if not path.exists():
            print(f"{name}: missing in {args.regenerated}")
            bad += 1
            continue
        c = compare_report(json.loads((args.committed / name / "report.json").read_text()), json.loads(path.read_text()))
        ok = c["verdicts"][0] == c["verdicts"][1] and c["same_tests"] and c["max_rel"] <= args.rtol
        bad += not ok
        print(
            f"{'ok  ' if ok else 'DIFF'} {name}: verdict {c['verdicts'][0]} -> {c['verdicts'][1]}; "
            f"tests {'same' if c['same_tests'] else 'DIFFER'}; max relative change {c['max_rel']:.2g} {c['where']}"
        )
    print(f"{len(names) - bad} of {len(names)} reports reproduce (verdict, tests, numbers within {args.rtol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

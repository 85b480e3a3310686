"""Family-wise calibration at scale: many seeded smoke runs of each battery on the reference implementations.

Each run is the battery exactly as a user runs it (``check_verifier(reference.rules.verify)``,
``check_tree_verifier(reference.tree_rules.verify_tree)``, ``check_decoder`` of the reference
decoder at T = 0.8, top-k 20 with its exact target), smoke tier, alpha = 1e-3, seeds 0, 1, ....
A run's verdict is a Bernoulli trial: FAIL with probability <= alpha when the battery is valid
(weighted Holm controls the family-wise error rate), FAIL or SUSPICIOUS with probability <=
100 alpha (an adjusted p-value <= 100 alpha).  Every run's p-values are stored with their
families, so a change of the grading alone (the budget, not the tests) is re-graded offline.

    python -m tools.reports.calibration run --battery chain --seeds 0:1000 --workers 2
    python -m tools.reports.calibration render --out reports/calibration

``run`` appends to ``build/calibration/<battery>.jsonl`` and skips seeds already there, so it
resumes and can be split across machines (``--seeds 0:500`` and ``--seeds 500:1000``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

STORE = Path("build/calibration")
BATTERIES = ("chain", "tree", "decoder")
ALPHA = 1e-3
COMMANDS = {
    "chain": "specverify audit --verifier reference.rules:verify --tier smoke --seed {seed}",
    "tree": "specverify audit --tree-verifier reference.tree_rules:verify_tree --tier smoke --seed {seed}",
    "decoder": (
        "specverify audit --decoder specverify.cli.factories:reference_decoder --decoder-option temperature=0.8 "
        "--decoder-option top_k=20 --target specverify.cli.factories:reference_target --target-option "
        "temperature=0.8 --target-option top_k=20 --tier smoke --seed {seed}"
    ),
}


def _one(battery: str, seed: int) -> dict:
    """One smoke run: its verdict, grade counts and every test's (family, p-value)."""
    import torch

    torch.set_num_threads(1)
    import specverify as sv

    start = time.perf_counter()
    if battery == "chain":
        from reference.rules import verify

        report = sv.check_verifier(verify, tier="smoke", seed=seed, alpha=ALPHA)
    elif battery == "tree":
        from reference.tree_rules import verify_tree

        report = sv.check_tree_verifier(verify_tree, tier="smoke", seed=seed, alpha=ALPHA)
    else:
        from specverify.cli.factories import reference_decoder, reference_target

        decoder = reference_decoder(temperature=0.8, top_k=20)
        target = reference_target(temperature=0.8, top_k=20)
        report = sv.check_decoder(decoder, target, tier="smoke", seed=seed, alpha=ALPHA)
    grades: dict[str, int] = {}
    for r in report.results:
        grades[r.grade] = grades.get(r.grade, 0) + 1
    flagged = [
        {"family": r.family, "name": r.name, "scenario": r.scenario, "position": r.position, "p": r.pvalue,
         "adjusted": r.adjusted_pvalue, "grade": r.grade}
        for r in report.results if r.grade != "pass"
    ]  # fmt: skip
    return {
        "battery": battery,
        "seed": seed,
        "verdict": report.verdict,
        "grades": grades,
        "min_adjusted": min((r.adjusted_pvalue for r in report.results), default=1.0),
        "flagged": flagged,
        "families": [r.family for r in report.results],
        "labels": [f"{r.name}|{r.scenario}|{r.position}" for r in report.results],
        "pvalues": [r.pvalue for r in report.results],
        "errors": list(report.errors),
        "seconds": time.perf_counter() - start,
    }


def _done(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {json.loads(line)["seed"] for line in path.read_text().splitlines() if line.strip()}


def run(batteries, seeds: range, workers: int) -> None:
    STORE.mkdir(parents=True, exist_ok=True)
    todo = []
    for seed in seeds:  # interleaved, so every battery advances together
        for battery in batteries:
            if seed not in _done(STORE / f"{battery}.jsonl"):
                todo.append((battery, seed))
    print(f"{len(todo)} runs to do", flush=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [(b, s, pool.submit(_one, b, s)) for b, s in todo]
        for battery, seed, future in futures:
            record = future.result()
            with open(STORE / f"{battery}.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
            print(f"{battery} seed {seed}: {record['verdict']} ({record['seconds']:.1f} s)", flush=True)


def _interval(k: int, n: int) -> tuple[float, float]:
    from specverify.selftest.calibration import clopper_pearson

    return clopper_pearson(k, n)


def summarise(records: list[dict]) -> dict:
    """Run-level rates with exact 95% intervals, and the families of what was flagged."""
    n = len(records)
    fail = sum(r["verdict"] == "fail" for r in records)
    flagged = sum(r["verdict"] in ("fail", "suspicious") for r in records)
    errors = sum(r["verdict"] == "error" for r in records)
    families: dict[str, int] = {}
    for r in records:
        for f in {x["family"] for x in r["flagged"]}:
            families[f] = families.get(f, 0) + 1
    tests = sum(len(r["pvalues"]) for r in records) / max(1, n)
    return {
        "runs": n,
        "seeds": [min(r["seed"] for r in records), max(r["seed"] for r in records)] if records else [],
        "tests_per_run": tests,
        "fail": fail,
        "fail_rate": fail / n if n else None,
        "fail_interval": _interval(fail, n) if n else None,
        "fail_or_suspicious": flagged,
        "flag_rate": flagged / n if n else None,
        "flag_interval": _interval(flagged, n) if n else None,
        "errors": errors,
        "alpha": ALPHA,
        "suspicious_level": 100 * ALPHA,
        "flagged_families": families,
        "median_adjusted_min": sorted(r["min_adjusted"] for r in records)[n // 2] if n else None,
        "mean_seconds": sum(r["seconds"] for r in records) / n if n else None,
    }


def render(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for battery in BATTERIES:
        path = STORE / f"{battery}.jsonl"
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            summary[battery] = summarise(records)
            (out / f"{battery}.jsonl").write_text(
                "".join(
                    json.dumps({k: r[k] for k in ("seed", "verdict", "grades", "min_adjusted", "flagged", "seconds")})
                    + "\n"
                    for r in sorted(records, key=lambda r: r["seed"])
                )
            )
    meta = {"python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count()}
    (out / "summary.json").write_text(json.dumps({"batteries": summary, "environment": meta}, indent=2) + "\n")
    lines = [
        "# Family-wise calibration of the smoke batteries",
        "",
        "Seeded smoke runs of each battery on the reference implementations, alpha = 1e-3 (one budget per",
        "run, weighted Holm).  A run FAILS with probability <= alpha and is FAIL or SUSPICIOUS (an",
        "adjusted p-value <= 100 alpha = 0.1) with probability <= 0.1 when the battery is valid.  Intervals",
        "are exact (Clopper-Pearson, 95%).  Regenerate: `python -m tools.reports.calibration run --battery",
        "chain --battery tree --battery decoder --seeds 0:1000 --workers 2`, then `python -m",
        "tools.reports.calibration render --out reports/calibration`; the per-run records are",
        "`<battery>.jsonl` here.",
        "",
        "| battery | runs (seeds) | tests per run | FAIL | rate [95% CI] | alpha inside or above? |"
        " FAIL or SUSPICIOUS | rate [95% CI] | 100 alpha | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for battery, s in summary.items():
        lo, hi = s["fail_interval"]
        flo, fhi = s["flag_interval"]
        lines.append(
            f"| {battery} | {s['runs']} ({s['seeds'][0]}-{s['seeds'][1]}) | {s['tests_per_run']:.0f} | {s['fail']} | "
            f"{s['fail_rate']:.4f} [{lo:.4f}, {hi:.4f}] | {'yes' if hi >= ALPHA else 'no: conservative'} | "
            f"{s['fail_or_suspicious']} | {s['flag_rate']:.4f} [{flo:.4f}, {fhi:.4f}] | 0.1 | {s['errors']} |"
        )
    lines += ["", "Families flagged (runs with at least one non-pass test of that family):", ""]
    for battery, s in summary.items():
        lines.append(f"- {battery}: {s['flagged_families'] or 'none'}")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print((out / "README.md").read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.reports.calibration")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--battery", action="append", choices=BATTERIES)
    r.add_argument("--seeds", default="0:1000", help="start:stop")
    r.add_argument("--workers", type=int, default=2)
    d = sub.add_parser("render")
    d.add_argument("--out", type=Path, default=Path("reports/calibration"))
    args = parser.parse_args(argv)
    if args.command == "run":
        start, stop = (int(x) for x in args.seeds.split(":"))
        run(args.battery or list(BATTERIES), range(start, stop), args.workers)
    else:
        render(args.out)


if __name__ == "__main__":
    main()

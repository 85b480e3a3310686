"""Family-wise calibration at scale: many seeded smoke runs of each battery on the reference implementations.

Each run is the battery exactly as a user runs it (``check_verifier(reference.rules.verify)``,
``check_tree_verifier(reference.tree_rules.verify_tree)``, ``check_decoder`` of the reference
decoder at T = 0.8, top-k 20 with its exact target, float32 forward), smoke tier, alpha = 1e-3, seeds 0, 1, ....
A run's verdict is a Bernoulli trial: FAIL with probability <= alpha when the battery is valid
(weighted Holm controls the family-wise error rate), FAIL or SUSPICIOUS with probability <=
100 alpha (an adjusted p-value <= 100 alpha).  Every run's p-values are stored with their
families, so a change of the grading alone (the budget, not the tests) is re-graded offline.

    python -m tools.reports.calibration run --battery chain --seeds 0:1000 --workers 2
    python -m tools.reports.calibration render --out reports/calibration

``run`` appends to ``build/calibration/<battery>.jsonl`` and skips seeds already there or already
committed under ``reports/calibration/``, so it resumes (also on a fresh clone, whose ``build/`` is
empty) and can be split across machines (``--seeds 0:500`` and ``--seeds 500:1000``).  ``render``
takes a seed's raw record from the store when it is there (graded again by the current budget) and
its committed, graded record otherwise.
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
COMMITTED = Path("reports/calibration")
#: Raw p-values at or below this are kept in the committed records (``tails``), with each test kind's count.
TAIL = 0.01
TAIL_LEVELS = (1e-2, 1e-3, 1e-4)
BATTERIES = ("chain", "tree", "decoder")
ALPHA = 1e-3
COMMANDS = {
    "chain": "specverify audit --verifier reference.rules:verify --tier smoke --seed {seed}",
    "tree": "specverify audit --tree-verifier reference.tree_rules:verify_tree --tier smoke --seed {seed}",
    "decoder": (
        "specverify audit --decoder specverify.cli.factories:reference_decoder --decoder-option temperature=0.8 "
        "--decoder-option top_k=20 --decoder-option dtype=float32 --target specverify.cli.factories:reference_target "
        "--target-option temperature=0.8 --target-option top_k=20 --target-option dtype=float32 --tier smoke --seed {seed}"
    ),
}


#: Batteries whose committed records were made by an earlier revision whose implementation this
#: checkout no longer reproduces: (revision, why).  ``run`` refuses to add to them here, so a series
#: never mixes two implementations; ``render`` states the revision.
FROZEN = {
    "decoder": (
        "13cc390",
        "the reference decoder's weights were then drawn with float32 torch.randn (since made CPU-portable "
        "float64 uniforms); the battery itself is unchanged",
    ),
}


#: Screen flags followed up on a page of their own: (battery, test kind) -> (page, one-line finding).
FOLLOW_UPS = {
    ("tree", "dependence/pairs_lag128"): (
        "lag128.md",
        "the statistic is calibrated under its exact null and each of the eight contributing scenarios "
        "gives its nominal rate on 1,024 runs outside the screened seeds: an excess of the screened "
        "seeds, not of the test",
    ),
}


def follow_up_lines(summary: dict) -> list[str]:
    """One line per screened kind (Poisson p < 0.01) that has a follow-up page, linking it."""
    return [
        f"- {battery} `{kind}`: [{page}]({page}): {finding}."
        for (battery, kind), (page, finding) in FOLLOW_UPS.items()
        if summary.get(battery, {}).get("tails", {}).get("kinds", {}).get(kind, {}).get("excess_p", 1.0) < 0.01
    ]


def refuse_frozen(batteries) -> None:
    """Raise ``SystemExit`` naming the revision to run from when a battery's series is frozen."""
    for battery in batteries:
        if battery in FROZEN:
            revision, why = FROZEN[battery]
            raise SystemExit(
                f"the committed {battery} records were made at commit {revision} ({why}): run "
                f"`git worktree add ../calib-{battery} {revision}` and the same command there, then copy its "
                f"build/calibration/{battery}.jsonl here; or move reports/calibration/{battery}.jsonl aside "
                "and start a new series"
            )


def _one(battery: str, seed: int) -> dict:
    """One smoke run: its verdict, grade counts and every test's (family, p-value)."""
    import torch

    torch.set_num_threads(1)
    import specverify as sv

    start = time.perf_counter()
    if battery == "chain":
        from specverify_reference.rules import verify

        report = sv.check_verifier(verify, tier="smoke", seed=seed, alpha=ALPHA)
    elif battery == "tree":
        from specverify_reference.tree_rules import verify_tree

        report = sv.check_tree_verifier(verify_tree, tier="smoke", seed=seed, alpha=ALPHA)
    else:
        from specverify.cli.factories import reference_decoder, reference_target

        # float32 forward (the factories' default is float64): twice as fast, and the battery's
        # false-alarm rate does not depend on which CPU's last bits the tokens follow
        decoder = reference_decoder(temperature=0.8, top_k=20, dtype="float32")
        target = reference_target(temperature=0.8, top_k=20, dtype="float32")
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


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _done(battery: str) -> set[int]:
    """Seeds with a raw record in the store or a graded one committed."""
    return {r["seed"] for r in _records(STORE / f"{battery}.jsonl") + _records(COMMITTED / f"{battery}.jsonl")}


def load(battery: str) -> list[dict]:
    """Every seed's record, by seed: the store's raw record where there is one, else the committed graded one."""
    by_seed = {r["seed"]: r for r in _records(COMMITTED / f"{battery}.jsonl")}
    by_seed.update({r["seed"]: r for r in _records(STORE / f"{battery}.jsonl")})
    return [by_seed[s] for s in sorted(by_seed)]


def run(batteries, seeds: range, workers: int) -> None:
    refuse_frozen(batteries)
    STORE.mkdir(parents=True, exist_ok=True)
    done = {battery: _done(battery) for battery in batteries}  # read each store once
    todo = []
    for seed in seeds:  # interleaved, so every battery advances together
        for battery in batteries:
            if seed not in done[battery]:
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


def regrade(record: dict) -> dict:
    """The run graded again from its stored p-values by the current budget (law and conformance apart).

    ``verdict`` the law verdict, ``min_law_adjusted`` the smallest adjusted p-value of a law
    test, ``conformance`` FAIL / SUSPICIOUS / PASS of the rule-conformance tests, ``law_families``
    the families of the law tests that were not PASS.  A committed record (no p-values, graded when
    it was run) is returned as it was graded.
    """
    if "pvalues" not in record:
        return {k: record[k] for k in ("verdict", "min_law_adjusted", "conformance", "law_families")}
    from specverify import stats
    from specverify.core.conformance import is_conformance
    from specverify.core.results import TestResult

    results = []
    for family, label, p in zip(record["families"], record["labels"], record["pvalues"]):
        name, scenario, position = label.split("|", 2)
        results.append(TestResult(0.0, p, name, family, "", 1, scenario=scenario, position=position))
    graded, verdict = stats.grade_run(results, record["errors"], alpha=ALPHA)
    law = [r for r in graded if not is_conformance(r)]
    rule = [r for r in graded if is_conformance(r)]
    return {
        "verdict": verdict,
        "min_law_adjusted": min((float(r.adjusted_pvalue or 1.0) for r in law), default=1.0),
        "conformance": stats.verdict(rule, gate_conformance=True) if rule else None,
        "law_families": sorted({r.family for r in law if r.grade != "pass"}),
    }


def _kind(family: str, label: str) -> str:
    return f"{family}/{label.split('|', 1)[0]}"


def tails(record: dict) -> dict | None:
    """``counts`` {test kind: tests run} and ``small`` [[kind, label, p], ...] for p <= :data:`TAIL`.

    From a raw record; a committed record returns what it kept (``None`` when it predates this).
    """
    if "pvalues" not in record:
        return record.get("tails")
    counts: dict[str, int] = {}
    small = []
    for family, label, p in zip(record["families"], record["labels"], record["pvalues"]):
        kind = _kind(family, label)
        counts[kind] = counts.get(kind, 0) + 1
        if p is not None and p <= TAIL:
            small.append([kind, label, p])
    return {"counts": counts, "small": small}


def tail_table(records: list[dict]) -> dict:
    """Per test kind, over the runs whose tails are recorded: tests run, and p-values <= each level.

    Under the null every p-value is (super-)uniform, so the count at level t is at most Poisson-ish
    with mean ``tests * t``; ``excess_p`` is the exact Poisson upper tail of the count at 1e-3 (a
    screening number for the investigation, not a test the verdict uses).
    """
    from scipy import stats as st

    runs = [t for t in (tails(r) for r in records) if t is not None]
    table: dict[str, dict] = {}
    for t in runs:
        for kind, n in t["counts"].items():
            row = table.setdefault(kind, {"tests": 0, **{f"{lv:g}": 0 for lv in TAIL_LEVELS}})
            row["tests"] += n
        for kind, _label, p in t["small"]:
            for lv in TAIL_LEVELS:
                if p <= lv:
                    table[kind][f"{lv:g}"] += 1
    for row in table.values():
        k, mean = row["0.001"], row["tests"] * 1e-3
        row["excess_p"] = float(st.poisson.sf(k - 1, mean)) if k else 1.0
    return {"runs": len(runs), "kinds": dict(sorted(table.items()))}


def seed_ranges(seeds: list[int]) -> list[list[int]]:
    """Sorted seeds as ``[[first, last], ...]`` runs of consecutive seeds."""
    out: list[list[int]] = []
    for seed in seeds:
        if out and seed == out[-1][1] + 1:
            out[-1][1] = seed
        else:
            out.append([seed, seed])
    return out


def summarise(records: list[dict]) -> dict:
    """Run-level rates with exact 95% intervals, the law's min-adjusted-p curve, and conformance."""
    n = len(records)
    graded = [regrade(r) for r in records]
    fail = sum(g["verdict"] == "fail" for g in graded)
    flagged = sum(g["verdict"] in ("fail", "suspicious") for g in graded)
    errors = sum(g["verdict"] == "error" for g in graded)
    families: dict[str, int] = {}
    for g in graded:
        for f in g["law_families"]:
            families[f] = families.get(f, 0) + 1
    curve = {str(t): sum(g["min_law_adjusted"] <= t for g in graded) / n for t in (0.01, 0.05, 0.1, 0.2, 0.5)}
    rule = [g["conformance"] for g in graded if g["conformance"] is not None]
    return {
        "runs": n,
        "seeds": seed_ranges(sorted(r["seed"] for r in records)),
        "tests_per_run": sum(sum(r["grades"].values()) for r in records) / n,
        "fail": fail,
        "fail_rate": fail / n,
        "fail_interval": _interval(fail, n),
        "fail_or_suspicious": flagged,
        "flag_rate": flagged / n,
        "flag_interval": _interval(flagged, n),
        "errors": errors,
        "alpha": ALPHA,
        "suspicious_level": 100 * ALPHA,
        "min_adjusted_curve": curve,
        "law_families_flagged": families,
        "conformance_runs": len(rule),
        "conformance_fail": sum(v == "fail" for v in rule),
        "conformance_flagged": sum(v in ("fail", "suspicious") for v in rule),
        "mean_seconds": sum(r["seconds"] for r in records) / n,
        "tails": tail_table(records),
    }


def render(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for battery in BATTERIES:
        records = load(battery)
        if records:
            summary[battery] = summarise(records)
            (out / f"{battery}.jsonl").write_text(
                "".join(
                    json.dumps(
                        {**{k: r[k] for k in ("seed", "grades", "flagged", "seconds")}, **regrade(r), "tails": tails(r)}
                    )
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
        *(
            f"The {battery} runs were made at commit {revision}: {why}; `run` reproduces them from a checkout of it."
            for battery, (revision, why) in FROZEN.items()
            if battery in summary
        ),
        "",
        "| battery | runs (seeds) | tests per run | FAIL | rate [95% CI] | alpha inside or above? |"
        " FAIL or SUSPICIOUS | rate [95% CI] | 100 alpha | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for battery, s in summary.items():
        lo, hi = s["fail_interval"]
        flo, fhi = s["flag_interval"]
        lines.append(
            f"| {battery} | {s['runs']} ({', '.join(f'{a}-{b}' for a, b in s['seeds'])}) | {s['tests_per_run']:.0f} | {s['fail']} | "
            f"{s['fail_rate']:.4f} [{lo:.4f}, {hi:.4f}] | {'yes' if hi >= ALPHA else 'no: conservative'} | "
            f"{s['fail_or_suspicious']} | {s['flag_rate']:.4f} [{flo:.4f}, {fhi:.4f}] | 0.1 | {s['errors']} |"
        )
    lines += [
        "",
        "How conservative the grading is: the share of runs whose smallest adjusted p-value of a law test",
        "is at most t.  A valid procedure keeps it at most t; an exact one reaches t.  Far below t is power",
        "left on the table (the budget could be spent more boldly).",
        "",
        "| battery | t = 0.01 | 0.05 | 0.1 | 0.2 | 0.5 |",
        "|---|---|---|---|---|---|",
    ]
    for battery, s in summary.items():
        c = s["min_adjusted_curve"]
        lines.append(
            f"| {battery} | " + " | ".join(f"{c[k]:.3f}" for k in ("0.01", "0.05", "0.1", "0.2", "0.5")) + " |"
        )
    lines += ["", "Rule conformance (its own budget, not in the verdict): runs with a conformance FAIL / FAIL or", ""]
    lines[-2] += " SUSPICIOUS:"
    for battery, s in summary.items():
        if s["conformance_runs"]:
            lines.append(
                f"- {battery}: {s['conformance_fail']} / {s['conformance_flagged']} of {s['conformance_runs']} runs"
            )
    lines += ["", "Families of the law tests that were not PASS (runs with at least one):", ""]
    for battery, s in summary.items():
        lines.append(f"- {battery}: {s['law_families_flagged'] or 'none'}")
    lines += [
        "",
        "Per-test tails (the runs whose small p-values are recorded): how many raw p-values of each kind of",
        "test fell at or below 1e-2, 1e-3 and 1e-4, against the expectation `tests x level` under a valid",
        "test; `Poisson p` is the upper tail of the 1e-3 count (a screen for miscalibrated tests; kinds",
        "with Poisson p < 0.01 are listed).",
        "",
        "| battery | runs | test kind | tests | <= 1e-2 (expected) | <= 1e-3 (expected) | <= 1e-4 (expected) | Poisson p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for battery, s in summary.items():
        t = s["tails"]
        for kind, row in t["kinds"].items():
            if row["excess_p"] < 0.01:
                n = row["tests"]
                lines.append(
                    f"| {battery} | {t['runs']} | {kind} | {n} | {row['0.01']} ({n * 1e-2:.1f}) | "
                    f"{row['0.001']} ({n * 1e-3:.2f}) | {row['0.0001']} ({n * 1e-4:.2f}) | {row['excess_p']:.2g} |"
                )
    followed = follow_up_lines(summary)
    if followed:
        lines += ["", "Followed up:", "", *followed]
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

"""The emitted tokens at which the verifier battery first kills a below-tier mutant (a script, not a test).

A mutant whose catalogue entry has ``tokens_to_detect`` changes the law by less than the smoke
tier can see (docs/bugs.md, "Large vocabularies").  This runs the smoke battery on the mutant's
witness scenario with its rows doubled from the smoke tier's (same tables, seed 0, alpha 1e-3)
until the battery kills it or ``--max-rows`` is passed, one JSON line per size: the rows, the
emitted tokens, whether it was killed, and the statistical test that came closest (its adjusted
p-value).  The largest size not killed is the entry's ``tokens_to_detect`` (a lower bound).

Usage: python benchmarks/bench_mutant_detection.py NAME [--max-rows 32768] [--json-lines FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from specverify import mutants, stats
from specverify.core.results import FAIL
from specverify.selftest.entry_scenarios import mutant_scenarios
from specverify.selftest.verifiers import scaled_scenario, scenario_tokens
from specverify.verifier.battery import run_scenario
from specverify.verifier.scenarios import get_scenarios

ALPHA = 1e-3


def doubling(name: str, max_rows: int):
    """Yield one record per size, smallest first, until a kill or ``max_rows``."""
    entry = mutants.by_name(name)
    (scenario,) = get_scenarios(list(mutant_scenarios(name, "smoke")))
    rows = scenario.batch_size * scenario.num_groups("smoke")
    while rows <= max_rows:
        scaled = scaled_scenario(scenario, rows)
        start = time.perf_counter()
        results, errors, _ = run_scenario(entry.fn, scaled, tier="smoke", seed=0, alpha=ALPHA)
        graded = stats.grade(results, alpha=ALPHA)
        killed = bool(errors) or stats.verdict(graded) == FAIL
        tested = [r for r in graded if r.adjusted_pvalue is not None and r.family != "protocol"]
        closest = min(tested, key=lambda r: r.adjusted_pvalue)
        yield {
            "name": name,
            "scenario": scenario.name,
            "rows": rows,
            "tokens": scenario_tokens(scaled, "smoke"),
            "killed": killed,
            "errors": errors[:1],
            "closest": [closest.family, closest.name, closest.position, closest.adjusted_pvalue],
            "seconds": round(time.perf_counter() - start, 1),
        }
        if killed:
            return
        rows *= 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--max-rows", type=int, default=32768)
    parser.add_argument("--json-lines", default=None)
    args = parser.parse_args(argv)
    out = open(args.json_lines, "a") if args.json_lines else None
    for record in doubling(args.name, args.max_rows):
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

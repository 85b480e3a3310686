"""The crash drill: an endpoint audit killed with SIGKILL at random points, resumed each time, ends as if never killed.

Each point is a seeded random number of stored lines (plus a random 0-20 ms), or, one time in five,
a random moment of the start-up, so that kills land in start-up, in the preflight, between requests
and in the middle of a store write.  After every kill the same command is started again: it must
accept the store it finds (a store it refused would end the drill with exit 2).  The final run's
statistics must equal those of one uninterrupted run, and its store must hold each reply once.
The CI-sized drill kills 4 times; ``-m slow`` runs 50 kills.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from _servers import Server

from specverify.cli import main
from specverify.endpoint.store import STORE_NAME, read_store

#: The run of the 50-kill drill (157 stored lines); the CI-sized drill's is smaller (57 lines).
ARGS = ["--model", "tiny-reference", "--num-samples", "300", "--max-new-tokens", "3", "--samples-per-request", "10",
        "--concurrency", "4", "--no-plots"]  # fmt: skip
SMALL_ARGS = [*ARGS[:2], "--num-samples", "120", "--max-new-tokens", "2", *ARGS[6:]]


@pytest.fixture(scope="module")
def server():
    started = Server("--max-logprobs", "-1")
    yield started
    started.close()


def _statistics(out) -> list:
    report = json.loads((out / "report.json").read_text())
    return [(r["family"], r["scenario"], r["position"], r["statistic"], r["pvalue"]) for r in report["results"]]


def _lines(path) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except FileNotFoundError:
        return 0


def crash_drill(url: str, out, *, kills: int, seed: int, total_lines: int, args: list[str]) -> list[dict]:
    """Kill the audit ``kills`` times at seeded random points, resuming each time; what each kill hit."""
    rng = random.Random(seed)
    command = [sys.executable, "-m", "specverify", "audit", "--endpoint", url, *args, "--out", str(out)]
    store = out / STORE_NAME
    points = sorted(rng.randrange(1, total_lines) for _ in range(kills))  # stored lines at which to kill
    record = []
    for point in points:
        before = _lines(store)
        during_start = rng.random() < 0.2
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        started = time.monotonic()
        if during_start:
            time.sleep(rng.uniform(0.0, 2.5))
        else:
            while process.poll() is None and _lines(store) < point and time.monotonic() - started < 60:
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.02))
        if process.poll() is not None:  # it finished (or failed) before the point was reached
            assert process.returncode == 0, process.stderr.read().decode()[-2000:]
            break
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stderr.close()
        record.append({"lines_before": before, "lines_at_kill": _lines(store), "during_start": during_start})
    finished = subprocess.run(command, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]
    return record


def _run_drill(server, tmp_path, kills: int, seed: int, args: list[str]):
    whole = tmp_path / "whole"
    assert main(["audit", "--endpoint", server.url, *args, "--out", str(whole)]) == 0  # uninterrupted, in this process
    total = _lines(whole / STORE_NAME)
    drilled = tmp_path / "drilled"
    kills_made = crash_drill(server.url, drilled, kills=kills, seed=seed, total_lines=total, args=args)
    assert len(kills_made) == kills, kills_made  # every point lies before the run's end
    assert _statistics(drilled) == _statistics(whole)
    contents = read_store(drilled / STORE_NAME)
    keys = [key for key, _, _ in contents.records]
    assert len(keys) == len(set(keys)) and len(keys) == len(read_store(whole / STORE_NAME).records)
    return kills_made


def test_a_run_killed_four_times_ends_as_if_never_killed(server, tmp_path):
    _run_drill(server, tmp_path, kills=4, seed=0, args=SMALL_ARGS)


@pytest.mark.slow
def test_a_run_killed_fifty_times_ends_as_if_never_killed(server, tmp_path):
    kills = _run_drill(server, tmp_path, kills=50, seed=1, args=ARGS)
    mid_write = sum(k["lines_at_kill"] > k["lines_before"] for k in kills)
    assert mid_write > 0

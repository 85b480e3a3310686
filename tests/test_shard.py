"""Sharded batteries (specverify.shard): plans, exact merges, backends, lost workers, anytime stopping.

The claim under test: the report's statistics do not depend on how the work was cut or run --
one process, N local processes or a Ray cluster, with or without a worker killed mid-shard --
and an implementation error inside a shard is a finding, never a retry.
"""

from __future__ import annotations

import sys

import pytest
import torch

import specverify as sv
from specverify.core.errors import InvalidArgument
from specverify.core.seeds import group_seed
from specverify.mutants import by_name
from specverify.shard import Job, ShardError, execute, plan_shards, run_shard
from specverify.shard.collect import Parallel, collect_runs
from specverify.shard.faults import KillOnce
from specverify.verifier.runs import ChainRunner, merge_runs
from specverify.verifier.scenarios import get_scenarios
from specverify_reference.rules import verify

SCENARIOS = ["pos8_uniform_k4", "pos2_least_likely_k2"]


def _job(verify, seed, fault=None, names=tuple(SCENARIOS) + ("pos16_noisy_k1",)):
    """A job running the chain harness of ``names`` with ``verify`` (the runner carries its scenarios)."""
    return Job(ChainRunner(verify, seed, tuple(get_scenarios(list(names)))), fault=fault)


def _stats(report):
    return [(r.family, r.name, r.scenario, r.position, r.n, r.statistic, r.pvalue) for r in report.results]


def test_plan_covers_every_group_once_contiguously():
    spec = [("a", 5, 1.0), ("b", 3, 4.0), ("c", 1, 2.0)]
    for num_shards in (1, 2, 3, 4, 9, 50):
        plan = plan_shards(spec, num_shards)
        assert len(plan) == min(num_shards, 9) and all(shard.items for shard in plan)
        units = [(item.scenario, g) for shard in plan for item in shard.items for g in item.groups]
        assert units == [(name, g) for name, n, _ in spec for g in range(n)]  # each once, in order
    costs = [shard.cost for shard in plan_shards([("a", 64, 1.0)], 4)]
    assert costs == [16.0] * 4
    with pytest.raises(InvalidArgument, match="num_shards"):
        plan_shards(spec, 0)
    with pytest.raises(InvalidArgument, match="num_groups"):
        plan_shards([("a", 0, 1.0)], 2)


def test_group_seeds_are_distinct_and_stable():
    seeds = {group_seed(0, name, g) for name in SCENARIOS for g in range(16)}
    assert len(seeds) == 32
    assert group_seed(3, "x", 1) == group_seed(3, "x", 1) != group_seed(4, "x", 1)


def test_merge_is_concatenation_in_group_order():
    (scenario,) = get_scenarios(["pos8_uniform_k4"])
    job = _job(verify, 0)
    shards = plan_shards([(scenario.name, 3, 1.0)], 3)
    parts = [run_shard(job, shard).groups[0].run for shard in shards]
    merged = merge_runs(parts)
    assert torch.equal(merged.tokens, torch.cat([p.tokens for p in parts]))
    assert merged.num_calls == sum(p.num_calls for p in parts) and merged.num_groups == 3
    whole = collect_runs(job, [scenario], tier="smoke", parallel=Parallel(shards=5)).runs[
        scenario.name
    ]  # 8 groups, 5 shards
    inline = collect_runs(job, [scenario], tier="smoke").runs[scenario.name]
    assert torch.equal(whole.tokens, inline.tokens) and torch.equal(whole.trial_accepted, inline.trial_accepted)
    with pytest.raises(InvalidArgument):
        merge_runs([])


def test_worker_processes_give_the_inline_report():
    inline = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=SCENARIOS)
    sharded = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=SCENARIOS, workers=2, shards=5)
    assert _stats(sharded) == _stats(inline) and sharded.verdict == inline.verdict == "pass"
    record = sharded.extra["sharding"]
    assert record["backend"] == "processes" and record["shards"] == 5 and record["incidents"] == []
    assert "workers=2" in sharded.command and "sharding" not in inline.extra


def test_threads_give_the_inline_report_and_restore_torch_threads():
    inline = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=SCENARIOS)
    previous = torch.get_num_threads()
    seen = []

    def watched(target_probs, draft_probs, draft_tokens, *, generator):  # a local function: nothing is pickled
        seen.append(torch.get_num_threads())
        return verify(target_probs, draft_probs, draft_tokens, generator=generator)

    threaded = sv.check_verifier(watched, tier="smoke", seed=0, scenarios=SCENARIOS, workers=2, backend="threads")
    assert _stats(threaded) == _stats(inline) and threaded.verdict == inline.verdict == "pass"
    assert threaded.extra["sharding"]["backend"] == "threads" and threaded.extra["sharding"]["shards"] == 8
    assert set(seen) == {1} and torch.get_num_threads() == previous  # serial operators during the run only
    stopped = sv.check_verifier(
        by_name("residual_is_p").fn, scenarios=["pos8_uniform_k4", "pos16_noisy_k1"], until_decisive=True,
        workers=2, backend="threads",
    )  # fmt: skip
    assert stopped.verdict == "fail" and stopped.extra["anytime"]["decisive"] is not None
    assert torch.get_num_threads() == previous


def test_a_killed_worker_is_retried_and_changes_nothing(tmp_path):
    fault = KillOnce(str(tmp_path / "killed"), shard=2)
    job = _job(verify, 1, fault=fault)
    collected = collect_runs(job, get_scenarios(SCENARIOS), tier="smoke", parallel=Parallel(shards=4, workers=2))
    assert fault.fired()
    incidents = collected.record["incidents"]
    assert incidents and all("BrokenProcessPool" in i["error"] for i in incidents)
    undisturbed = collect_runs(_job(verify, 1), get_scenarios(SCENARIOS), tier="smoke").runs
    for name in SCENARIOS:  # the merged runs, hence every statistic, are the undisturbed ones
        assert torch.equal(collected.runs[name].tokens, undisturbed[name].tokens)
        assert collected.runs[name].num_calls == undisturbed[name].num_calls


def test_implementation_errors_are_findings_not_retries():
    raising = by_name("residual_is_p").fn  # a real finding first: the law is wrong
    report = sv.check_verifier(raising, tier="smoke", seed=0, scenarios=["pos8_uniform_k4"], workers=2)
    assert report.verdict == "fail" and report.extra["sharding"]["incidents"] == []
    broken = sv.check_verifier(_raises, tier="smoke", seed=0, scenarios=SCENARIOS, workers=2, shards=4)
    assert broken.verdict == "error" and len(broken.errors) == 2 and "raised" in broken.errors[0]
    assert broken.extra["sharding"]["incidents"] == []


def _raises(target_probs, draft_probs, draft_tokens, *, generator):
    raise RuntimeError("kernel exploded")


def _infrastructure_failure(shard_index):
    raise OSError("disk full")


def test_infrastructure_errors_are_retried_then_reported():
    job = _job(verify, 0, fault=_infrastructure_failure)
    shards = plan_shards([("pos8_uniform_k4", 2, 1.0)], 2)
    with pytest.raises(ShardError, match="failed 2 times; last: OSError: disk full"):
        execute(job, shards, backend="processes", workers=2, on_output=lambda out: None, retries=1)
    with pytest.raises(OSError, match="disk full"):  # in this process nothing is lost: no retries
        execute(job, shards, backend="threads", workers=2, on_output=lambda out: None, retries=1)


def test_ctrl_c_stops_the_workers():
    shards = plan_shards([("pos8_uniform_k4", 4, 1.0)], 4)

    def interrupt(output):
        raise KeyboardInterrupt

    import multiprocessing
    import time

    before = set(multiprocessing.active_children())
    with pytest.raises(KeyboardInterrupt):
        execute(_job(verify, 0), shards, backend="processes", workers=2, on_output=interrupt)
    # The workers were sent SIGKILL and joined for up to 10 s; once, on a machine busy with another
    # heavy job, one was still alive right after the call, so the test gives them time to go.
    # Workers that were not killed would idle in their pool forever and fail it.
    deadline = time.monotonic() + 60
    while (alive := [p for p in multiprocessing.active_children() if p.is_alive() and p not in before]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not alive


def test_tree_battery_sharded_equals_inline():
    from specverify_reference.tree_rules import verify_tree

    names = ["markov8_iid_2x2", "markov8_topk_3x2"]
    inline = sv.check_tree_verifier(verify_tree, scenarios=names)
    sharded = sv.check_tree_verifier(verify_tree, scenarios=names, workers=2, shards=3)
    assert _stats(sharded) == _stats(inline) and inline.verdict == "pass"
    assert sharded.extra["trees"] == inline.extra["trees"]


def test_until_decisive_stops_a_wrong_rule_early_and_lets_a_right_one_finish():
    wrong = sv.check_verifier(
        by_name("residual_is_p").fn, scenarios=["pos8_uniform_k4", "pos16_noisy_k1"], until_decisive=True
    )
    anytime = wrong.extra["anytime"]
    assert wrong.verdict == "fail" and anytime["decisive"] is not None
    assert anytime["tokens_used"] < anytime["tokens_planned"]
    assert any(r.family == "anytime" and r.grade == "fail" for r in wrong.results)
    right = sv.check_verifier(verify, scenarios=SCENARIOS, until_decisive=True)
    assert right.verdict == "pass" and right.extra["anytime"]["decisive"] is None
    assert right.extra["anytime"]["tokens_used"] == right.extra["anytime"]["tokens_planned"]
    assert {r.family for r in right.results} >= {"gof", "anytime"}


def test_bad_parallel_options_name_the_argument(monkeypatch):
    for kwargs, name in (
        ({"workers": 0}, "workers"),
        ({"backend": "mpi"}, "backend"),
        ({"backend": "inline", "workers": 2}, "workers"),
        ({"shards": 0}, "shards"),
        ({"ray_address": "auto"}, "ray_address"),
    ):
        with pytest.raises(InvalidArgument, match=name):
            Parallel(**kwargs)
    with pytest.raises(InvalidArgument, match="greedy"):
        sv.check_verifier(verify, greedy=True, workers=2)
    with pytest.raises(InvalidArgument, match="pickling"):
        sv.check_verifier(lambda *a, **k: verify(*a, **k), scenarios=SCENARIOS, workers=2)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(InvalidArgument, match="pip install"):
        sv.check_verifier(verify, scenarios=SCENARIOS, backend="ray")


def test_decoder_prompts_in_worker_processes_give_the_inline_report(capsys):
    from specverify.cli.commands import main
    from specverify.cli.factories import reference_decoder, reference_target

    decoder, target = reference_decoder(top_k=20), reference_target(top_k=20)
    inline = sv.check_decoder(decoder, target, num_samples=600, max_new_tokens=3)
    sharded = sv.check_decoder(decoder, target, num_samples=600, max_new_tokens=3, workers=2)
    assert _stats(sharded) == _stats(inline) and inline.verdict == "pass"
    assert sharded.scenarios == inline.scenarios and sharded.extra["sharding"]["shards"] == 2
    argv = ["audit", "--decoder", "specverify.cli.factories:reference_decoder", "--target",
            "specverify.cli.factories:reference_target", "--workers", "2", "--until-decisive", "--out", "none"]  # fmt: skip
    assert main(argv) == 2 and "--until-decisive (verifier and tree-verifier audits)" in capsys.readouterr().err


#: The Ray test's scenarios: six small ones (the whole smoke battery is the inline tests' business).
RAY_SCENARIOS = ["pos8_uniform_k4", "pos16_noisy_k1", "markov8_temperature_k2", "ngram3_v6_stale_k4",
                 "markov4_oracle_k8", "pos2_least_likely_k2"]  # fmt: skip


@pytest.mark.ray
def test_ray_cluster_with_a_killed_worker_reproduces_the_one_process_report(tmp_path, monkeypatch):
    """A local Ray cluster of 2 CPUs runs six scenarios of the reference verifier's smoke battery as 4
    shards; the worker running shard 1 is killed (SIGKILL) after its first group.  Statistics and
    verdict equal the 1-process run's, and the report records the lost worker."""
    pytest.importorskip("ray")
    six = RAY_SCENARIOS
    one = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=six)
    marker = tmp_path / "killed"
    monkeypatch.setenv("SPECVERIFY_FAULT", f"kill-once:{marker}:1")  # inherited by the Ray workers
    cluster = sv.check_verifier(verify, tier="smoke", seed=0, scenarios=six, workers=2, shards=4, backend="ray")
    assert marker.exists()
    record = cluster.extra["sharding"]
    assert record["backend"] == "ray" and record["shards"] == 4
    assert [i["shard"] for i in record["incidents"]] == [1], record
    assert _stats(cluster) == _stats(one) and cluster.verdict == one.verdict == "pass"


def test_a_resized_scenario_runs_at_its_own_size():
    """The selftest's doubling levels and calibration runs resize registry scenarios: the workers must run them
    as given, not the registry's namesake (a worker used to look every scenario up by name)."""
    from specverify.selftest.verifiers import scaled_scenario
    from specverify.verifier.battery import run_scenario
    from specverify.verifier.scenarios import get_scenarios

    small = scaled_scenario(get_scenarios(["pos8_uniform_k4"])[0], 8)
    results, errors, _ = run_scenario(verify, small, tier="smoke", seed=0, alpha=1e-3)
    assert not errors
    assert {r.n for r in results if r.name == "gof" and r.position.startswith("abs=")} == {8}


def test_default_parallelism_follows_the_tier_and_the_machine(monkeypatch):
    """Smoke in this process; larger tiers one worker process per CPU, if the job pickles and there are several."""
    from specverify.shard import backends

    job = _job(verify, 0)
    monkeypatch.setattr(backends, "available_cpus", lambda: 3)
    assert backends.default_parallelism("smoke", job) == ("inline", 1)
    assert backends.default_parallelism("standard", job) == ("processes", 3)
    assert backends.default_parallelism("deep", job) == ("processes", 3)
    unpicklable = _job(lambda *a, **k: verify(*a, **k), 0)
    assert backends.default_parallelism("standard", unpicklable) == ("inline", 1)
    monkeypatch.setattr(backends, "available_cpus", lambda: 1)
    assert backends.default_parallelism("deep", job) == ("inline", 1)
    assert backends.check_backend(None, None) == (None, None)
    assert backends.check_backend("inline", None) == ("inline", 1)
    assert backends.check_backend("threads", None) == ("threads", 1)  # one per CPU: 1 here
    assert backends.check_backend(None, 2) == ("processes", 2)


def test_inline_runs_on_one_torch_thread_and_restores_the_setting():
    seen = set()

    def spy(target_probs, draft_probs, draft_tokens, *, generator):
        seen.add(torch.get_num_threads())
        return verify(target_probs, draft_probs, draft_tokens, generator=generator)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = sv.check_verifier(spy, tier="smoke", seed=0, scenarios=["pos8_uniform_k4"])
        assert report.passed and seen == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------- progress
class _Recorder:
    """A progress callback recording every call (``done``, ``total``, ``name``)."""

    def __init__(self):
        self.calls = []

    def __call__(self, done, total, name):
        self.calls.append((done, total, name))

    def check(self, total_tokens: int, *, moves_at_least: int) -> None:
        dones = [d for d, _, _ in self.calls]
        assert self.calls[0][0] == 0 and self.calls[-1] == (total_tokens, total_tokens, "")
        assert dones == sorted(dones) and all(t == total_tokens for _, t, _ in self.calls)
        inside = {d for d in dones if 0 < d < total_tokens}  # the bar moved between start and end
        assert len(inside) >= moves_at_least, self.calls


def _tokens(names) -> int:
    return sum(s.num_groups("smoke") * s.batch_size * s.length for s in get_scenarios(names))


@pytest.mark.parametrize(
    "parallel",
    [Parallel(), Parallel(workers=2, backend="threads", shards=2), Parallel(workers=2, shards=2)],
    ids=["inline", "threads", "processes"],
)
def test_progress_moves_group_by_group_on_every_local_backend(parallel):
    """Every group is reported as it finishes: 20 groups in 1 or 2 shards give >= 19 steps in between."""
    recorder = _Recorder()
    collect_runs(_job(verify, 0), get_scenarios(SCENARIOS), tier="smoke", parallel=parallel,
                 progress=recorder)  # fmt: skip
    groups = sum(s.num_groups("smoke") for s in get_scenarios(SCENARIOS))
    recorder.check(_tokens(SCENARIOS), moves_at_least=groups - 1)
    names = [name for _, _, name in recorder.calls[1:-1]]
    assert any("(1/2 scenarios done)" in name for name in names)


def test_progress_counts_a_retried_shard_once(tmp_path):
    recorder = _Recorder()
    fault = KillOnce(str(tmp_path / "killed"), shard=1)
    collect_runs(_job(verify, 1, fault=fault), get_scenarios(SCENARIOS), tier="smoke",
                 parallel=Parallel(shards=4, workers=2), progress=recorder)  # fmt: skip
    assert fault.fired()
    recorder.check(_tokens(SCENARIOS), moves_at_least=4)

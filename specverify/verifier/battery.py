"""``check_verifier``: the statistical conformance battery for a verifier kernel.

For every scenario of :mod:`specverify.verifier.scenarios` the harness
(:mod:`specverify.verifier.harness`) drives full speculative decoding around the verifier
under test on exact table models; :func:`analyse_run` turns the run into tests:

* ``support`` -- no token with conditional probability 0 in its context (exact);
* ``gof`` per absolute position (exact marginal, propagated through the model's
  contexts), per in-block position 1..K+1 (expected = sum of the tokens' exact
  conditionals: a valid, conservative conditional test) and per context node with
  enough expected visits (the first ``m`` visits in (position, row) order, ``m``
  fixed from expected visits only, are i.i.d. from the node's row);
* ``directed`` -- randomised PIT ordered by p and by q/p, entropy and ratio
  scores (mean 0 under H0), on a capped prefix of rows; at vocabularies of 8,192 ids or more,
  every token's count in the tail beyond its law's top 1,024 ids and every drafted token's count
  outside the draft law's support, against their exact masses (:mod:`.mass_sets`);
* ``acceptance`` per in-block position -- accepted drafts vs the exact per-trial
  probabilities sum_x min(p, q): rule conformance (is the rule the declared one?), graded
  under its own budget and out of the verdict unless ``gate_conformance=True``
  (:mod:`specverify.core.conformance`);
* ``independence`` -- collisions between the first tokens of the rows of each batch;
* ``dependence`` -- rows of one verify call in pairs (adjacent, offsets of 32..256 and the
  declared block size, tile edges, first and last, random): their first tokens and bonus
  tokens against the product of the exact laws (:mod:`specverify.verifier.pairs`);
* ``protocol`` -- the verifier's outputs passed validation (shapes, dtypes, range,
  emitted prefix = drafts, determinism for a fixed generator seed).

Bins depend only on expected values.  All results of a run are graded together
(:func:`specverify.stats.grade`, weighted Holm at ``alpha``; the conformance tests in a budget
of their own).  Same code and seed
give the same verdict: every scenario's generator is seeded from
``(seed, scenario name)`` (:func:`specverify.verifier.scenarios.scenario_seed`).

Greedy verifiers (``greedy=True``): every call's output must equal
:func:`reference.rules.greedy_verify` on the same inputs -- the longest draft
prefix equal to argmax p, then argmax p; ties in argmax resolve to the lowest token id.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specverify import stats
from specverify.core.devices import check_device, check_prob_dtype, device_extra, device_keywords
from specverify.core.environment import callable_name, environment
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.progress import ProgressTracker
from specverify.core.repro import python_repro
from specverify.core.results import Report, TestResult, protocol_result
from specverify.core.seeds import scenario_seed
from specverify.core.tables import TableModel
from specverify.core.validation import check_alpha, check_bool, check_int, check_run_options
from specverify.shard.collect import Parallel, collect_runs
from specverify.shard.work import Job
from specverify.verifier.harness import HarnessRun, run_harness
from specverify.verifier.mass_sets import mass_set_results
from specverify.verifier.pairs import declared_block_size, dependence_results
from specverify.verifier.runs import ChainRunner, run_battery
from specverify.verifier.scenarios import TIERS, Scenario, get_scenarios
from specverify_reference.rules import greedy_verify

__all__ = [
    "check_verifier",
    "check_greedy_verifier",
    "check_verifier_on",
    "list_scenarios",
    "analyse_run",
    "run_scenario",
    "analyse_scenario",
    "environment",
]

#: Cells (tokens x V) of per-token probability rows the directed tests may materialise per scenario.
DIRECTED_CELLS = 1 << 22
#: Minimum expected visits of a context node to get its own GOF test, and the most nodes tested.
NODE_MIN_VISITS, MAX_NODES = 400, 12


# ------------------------------------------------------------------ analysis
def analyse_run(
    run: HarnessRun,
    target: TableModel,
    drafter: TableModel,
    *,
    scenario: str,
    alpha: float,
    seed: int,
    block_size: int | None = None,
) -> list[TestResult]:
    """All tests of one harness run (ungraded TestResults); see the module docstring."""
    results: list[TestResult] = []
    common: dict[str, Any] = dict(scenario=scenario, alpha=alpha)
    V, C, K, L = target.vocab_size, target.num_contexts, run.k, run.length
    R = run.tokens.shape[0]
    tokens = run.tokens.numpy()
    tctx = run.target_contexts.numpy()
    bpos = run.block_positions.numpy()
    table = target.table.numpy()
    flat_tok, flat_ctx = tokens.reshape(-1), tctx.reshape(-1)

    # support: every (context, token) pair observed must have positive probability
    pair_counts = np.bincount(flat_ctx * V + flat_tok, minlength=C * V)
    res = stats.support_test(pair_counts, table.reshape(-1), scenario=scenario, position="all")
    if res.pvalue == 0.0:
        bad = [int(i) for i in np.flatnonzero((pair_counts > 0) & (table.reshape(-1) <= 0))[:10]]
        res = res.replace(details={**res.details, "pairs": [{"context": i // V, "token": i % V} for i in bad]})
    results.append(res)

    # GOF per absolute position against the exact marginal
    marg_ctx = target.context_marginals(L).numpy()  # (L, C)
    marg_tok = marg_ctx @ table  # (L, V)
    for t in range(L):
        counts = np.bincount(tokens[:, t], minlength=V)
        results += stats.gof_pair(counts, marg_tok[t], position=f"abs={t}", **common)

    # GOF per in-block position: expected = sum of the exact conditionals of the stratum
    for j in range(1, K + 2):
        sel = flat_ctx[bpos.reshape(-1) == j]
        if sel.size == 0:
            continue
        counts = np.bincount(flat_tok[bpos.reshape(-1) == j], minlength=V)
        expected = np.bincount(sel, minlength=C) @ table  # (V,) expected counts
        results += stats.gof_pair(counts, expected, position=f"block={j}", **common)

    # GOF per context node (context-dependent targets only)
    if not target.token_independent:
        visits = R * marg_ctx.sum(0)  # (C,) expected visits
        nodes = [
            int(c) for c in np.argsort(-visits, kind="stable")[:MAX_NODES] if visits[c] >= max(NODE_MIN_VISITS, 20 * V)
        ]
        order_tok, order_ctx = tokens.T.reshape(-1), tctx.T.reshape(-1)  # (position, row) order
        for c in nodes:
            m = int(0.9 * visits[c])
            toks = order_tok[order_ctx == c][:m]
            pair = stats.gof_pair(
                np.bincount(toks, minlength=V), table[c], position=f"node={_node_label(target, c)}", **common
            )
            node = {"context": c, "expected_visits": float(visits[c])}
            results += [res.replace(details={**res.details, **node}) for res in pair]

    results += _directed(run, target, drafter, common=common, seed=seed)
    results += mass_set_results(run, target, drafter, common=common)

    # acceptance per in-block position
    tp = run.trial_positions.numpy()
    tprob = run.trial_accept_probs.numpy()
    tacc = run.trial_accepted.numpy()
    for j in range(1, K + 1):
        sel = tp == j
        if sel.any():
            results.append(stats.acceptance_test(int(tacc[sel].sum()), tprob[sel], position=f"block={j}", **common))

    # independence: first tokens of the rows of each batch share the law of position 0
    if run.batch_size >= 2:
        first = tokens[:, 0].reshape(run.num_groups, run.batch_size)
        results.append(stats.collision_test(first, marg_tok[0], position="abs=0 within batch", **common))
    results += dependence_results(
        run, target.table, scenario=scenario, alpha=alpha, seed=seed, block_size=block_size, bonus_position=K + 1
    )
    return results


def _node_label(target: TableModel, c: int) -> str:
    if hasattr(target, "context_tokens"):
        toks = target.context_tokens(torch.tensor(c)).tolist()
        return "(" + ",".join("BOS" if x == target.vocab_size else str(x) for x in toks) + ")"
    return str(c)


def _directed(run: HarnessRun, target, drafter, *, common, seed) -> list[TestResult]:
    V = target.vocab_size
    rows = max(1, min(run.tokens.shape[0], DIRECTED_CELLS // (V * run.length)))
    tok = run.tokens[:rows].reshape(-1)  # (N,)
    tctx = run.target_contexts[:rows].reshape(-1)
    dctx = run.draft_contexts[:rows].reshape(-1)
    if tok.numel() < 50:
        return []
    gen = torch.Generator().manual_seed(scenario_seed(seed, "directed/" + common["scenario"]))
    p = target.table[tctx]  # (N, V)
    out = []
    pos = f"rows<{rows}"
    pit = stats.randomised_pit(p, tok, generator=gen, order="p")
    out.append(stats.pit_test(pit, name="pit_p", position=pos, **common))
    scores, var, bound = stats.entropy_scores(p, tok)
    if var.sum() > 1e-12:
        out.append(stats.score_test(scores, var, name="entropy_score", position=pos, bound=bound, **common))
    drafted = dctx >= 0  # positions 1..K (the bonus has no draft law)
    if int(drafted.sum()) >= 50 and not torch.equal(target.table, drafter.table):
        pd, qd, xd = p[drafted], drafter.table[dctx[drafted]], tok[drafted]
        scores, var, bound = stats.ratio_scores(pd, qd, xd)
        if var.sum() > 1e-12:
            out.append(stats.score_test(scores, var, name="ratio_score", position=pos, bound=bound, **common))
            pit = stats.randomised_pit(pd, xd, generator=gen, order="ratio", draft_probs=qd)
            out.append(stats.pit_test(pit, name="pit_ratio", position=pos, **common))
    return out


# ------------------------------------------------------------------ running
PROTOCOL_METHOD = (
    "verifier output validation: shapes, dtypes, num_emitted in [1, K+1], ids in [0, V), "
    "emitted prefix = drafts, same output for the same generator seed (exact)"
)


def _protocol_result(scenario: str, ok: bool, n: int, message: str = "") -> TestResult:
    return protocol_result(scenario, None if ok else message, n, method=PROTOCOL_METHOD, position="all")


def _drive(verify, scenario: Scenario, target, drafter, *, tier: str, seed: int, device=None, dtype=None) -> HarnessRun:
    """Run the harness on one scenario, its generator seeded from (root seed, scenario name)."""
    generator = torch.Generator().manual_seed(scenario_seed(seed, scenario.name))
    return run_harness(
        verify,
        target,
        drafter,
        k=scenario.k,
        batch_size=scenario.batch_size,
        length=scenario.length,
        generator=generator,
        num_groups=scenario.num_groups(tier),
        verifier_dtype=torch.float32 if dtype is None else dtype,
        device=device,
    )


def analyse_scenario(
    scenario: Scenario, run: HarnessRun | None, error: str | None, *, alpha: float, seed: int, block_size=None
):
    """``(results, errors, summary)`` of one scenario's merged run: the protocol result and every test.

    Picklable through ``functools.partial``: shard workers run it on the scenarios they hold whole.
    """
    if run is None:
        return [_protocol_result(scenario.name, False, 0, error or "")], [error or f"{scenario.name}: no run"], {}
    target, drafter = scenario.build()
    results = [_protocol_result(scenario.name, True, run.num_calls)]
    analysed = analyse_run(run, target, drafter, scenario=scenario.name, alpha=alpha, seed=seed, block_size=block_size)
    return results + analysed, [], {}


def run_scenario(verify, scenario: Scenario, *, tier: str, seed: int, alpha: float, device=None, dtype=None):
    """Run one scenario in this process: ``(results, errors, seconds)``.

    Its groups are seeded from (seed, scenario, group) as in every sharded run
    (:mod:`specverify.shard`), so this is the scenario's part of :func:`check_verifier`.
    """
    start = time.perf_counter()
    runner = ChainRunner(verify, seed, (scenario,), device, dtype)
    collected = collect_runs(Job(runner), [scenario], tier=tier)
    run, error = collected.runs.get(scenario.name), collected.errors.get(scenario.name)
    block = declared_block_size(verify)
    results, errors, _ = analyse_scenario(scenario, run, error, alpha=alpha, seed=seed, block_size=block)
    return results, errors, time.perf_counter() - start


def _run_greedy_scenario(verify, scenario: Scenario, *, tier: str, seed: int, device=None, dtype=None):
    start = time.perf_counter()
    target, drafter = scenario.build()
    tally: dict[str, Any] = {"calls": 0, "rows": 0, "tokens": 0, "mismatched_rows": 0, "first": None}

    def checked(target_probs, draft_probs, draft_tokens, *, generator):
        output = verify(target_probs, draft_probs, draft_tokens, generator=generator)
        from specverify.verifier.harness import validate_verifier_output

        tokens, num = validate_verifier_output(output, draft_tokens, target_probs.shape[-1])
        want_tokens, want_num = greedy_verify(target_probs, draft_tokens, check=False)
        want_tokens, want_num = want_tokens.cpu(), want_num.cpu()
        mask = torch.arange(tokens.shape[1])[None] < want_num[:, None]
        bad = (num != want_num) | ((tokens != want_tokens) & mask).any(-1)
        tally["calls"] += 1
        tally["rows"] += int(num.numel())
        tally["tokens"] += int(want_num.sum())
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            tally["mismatched_rows"] += int(bad.sum())
            if tally["first"] is None:
                tally["first"] = (
                    f"call {tally['calls']}, row {b}: emitted {tokens[b, : int(num[b])].tolist()}, greedy "
                    f"continuation {want_tokens[b, : int(want_num[b])].tolist()}"
                )
        return output

    try:
        _drive(checked, scenario, target, drafter, tier=tier, seed=seed, device=device, dtype=dtype)
    except ImplementationError as exc:
        message = f"{scenario.name}: {exc}"
        return [_protocol_result(scenario.name, False, 0, message)], [message], time.perf_counter() - start
    ok = tally["mismatched_rows"] == 0
    res = TestResult(
        statistic=float(tally["mismatched_rows"]),
        pvalue=1.0 if ok else 0.0,
        name="greedy_match",
        family="greedy",
        method="exact equality with the greedy continuation (reference.rules.greedy_verify; argmax ties -> lowest id)",
        n=tally["tokens"],
        scenario=scenario.name,
        position="all",
        details={k: v for k, v in tally.items() if v is not None},
    )
    return [_protocol_result(scenario.name, True, tally["calls"]), res], [], time.perf_counter() - start


def list_scenarios(tier: str = "smoke", *, greedy: bool = False) -> list[str]:
    """Names of the scenarios ``check_verifier`` runs at ``tier`` (without running anything).

    Every tier runs the same scenarios (tiers scale the number of batches), so
    ``tier`` is only validated; it is an argument so callers such as the pytest
    plugin need not know that.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    return [s.name for s in get_scenarios(greedy=greedy)]


def check_verifier(
    verify,
    *,
    tier: str = "smoke",
    seed: int = 0,
    alpha: float = 1e-3,
    greedy: bool = False,
    scenarios=None,
    progress=None,
    implementation: str | None = None,
    device=None,
    dtype=None,
    workers: int | None = None,
    backend: str | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    until_decisive: bool = False,
    gate_conformance: bool = False,
) -> Report:
    """Statistically audit a speculative-sampling verifier; return a :class:`~specverify.core.results.Report`.

    Parameters
    ----------
    verify : callable
        ``verify(target_probs (B,K+1,V), draft_probs (B,K,V), draft_tokens (B,K), *, generator)
        -> (tokens (B,K+1) long, num_emitted (B,) long)``; it receives float32 probabilities.
    tier : {"smoke", "standard", "deep"}
        Budget: smoke <= 60 s on 2 CPU cores and catches every catalogued verifier bug;
        standard 16x the smoke samples (nightly); deep 512x (sized for an accelerator).
    seed : int
        Root seed; each scenario's generator is derived from (seed, scenario name).
        Same code and seed give the same verdict.
    alpha : float
        Family-wise error rate of the whole run (weighted Holm across all tests).
    greedy : bool
        Audit a greedy verifier instead: outputs must equal the greedy continuation exactly.
    scenarios : sequence of str, optional
        Run only these scenarios (by name).
    progress : callable, optional
        Told as each group of the harness finishes (:mod:`specverify.core.progress`):
        ``progress(done, total, name)`` in emitted tokens, ``name`` the running scenario and
        how many are done (``""`` at the end), or ``progress.update(state)`` when it has an
        ``update`` method; first with nothing done, last with everything.  The greedy battery
        counts scenarios.
    implementation : str, optional
        Name recorded in the report (default: ``module:qualname`` of ``verify``).
    device : str or torch.device, optional
        Where ``verify`` runs (``"cuda:0"``; default the CPU): inputs are built there and it
        gets a generator of that device (see :func:`~specverify.verifier.harness.run_harness`).
    dtype : torch.dtype or str, optional
        dtype of the probabilities handed to ``verify``: float32 (default), bfloat16 or
        float16.  The exact law stays the float64 tables: rounding to bfloat16 moves a row
        by at most its unit roundoff (TV <= 2^-9), below the smoke and standard tiers'
        detectable TV; a deep-tier failure in bfloat16 alone can be that rounding.
    workers, backend, shards, ray_address : optional
        Run the sampling scenarios as shards (:mod:`specverify.shard`): ``workers`` local
        processes (``backend="processes"``, the default for workers > 1), threads of this
        process (``backend="threads"``: no start-up cost, for a thread-safe ``verify``) or Ray
        tasks (``backend="ray"``; a local Ray instance of ``workers`` CPUs unless
        ``ray_address`` names a cluster), ``shards`` pieces (default 4 per worker).  The statistics and the
        verdict are the same for every choice: each group of rows is seeded from (seed,
        scenario, group).  A lost worker's shard is retried (``report.extra["sharding"]``).
        With neither ``workers`` nor ``backend`` given, the smoke tier runs in this process on
        one torch thread and larger tiers on one worker process per CPU this process may use
        (:func:`specverify.shard.backends.default_parallelism`, chosen from measurement).
    until_decisive : bool
        Anytime stopping (:mod:`specverify.verifier.anytime`): e-processes get 10% of alpha and
        the run stops at the first decisive one (``report.extra["anytime"]`` says how many
        samples it used); otherwise the battery is graded at 90% of alpha.
    gate_conformance : bool
        Make rule conformance part of the verdict: a verifier whose acceptance differs from
        the canonical rule's (a lossless rule that is not the declared one, such as
        sample-and-match with a stochastic drafter) then fails.  By default the verdict
        answers only whether the target distribution is preserved, and conformance is
        reported on its own line (``report.conformance``), graded under its own budget.

    Returns
    -------
    Report
        ``kind="verifier"``; ``verdict`` "fail" when any test of the law fails after the error
        budget (or a conformance test, with ``gate_conformance``) or the verifier violated its
        protocol (messages in ``errors``).
    """
    if not callable(verify):
        raise InvalidArgument(f"verify must be callable, got {verify!r}")
    seed, alpha = check_run_options(tier, TIERS, seed, alpha, progress)
    gate = check_bool("gate_conformance", gate_conformance)
    dev, prob_dtype = check_device("device", device), check_prob_dtype("dtype", dtype)
    chosen = get_scenarios(scenarios, greedy=greedy)
    parallel = Parallel(workers, backend, shards, ray_address, until_decisive=until_decisive)
    if greedy and not parallel.default:
        raise InvalidArgument(
            "greedy audits run in this process: workers, backend, shards and until_decisive do not apply"
        )
    start, cpu_start = time.perf_counter(), time.process_time()
    results, errors, timings, cpu, extra = [], [], {}, {}, {}
    if greedy:
        tracker = ProgressTracker(progress, [(s.name, 1, 1) for s in chosen], unit="scenarios")
        tracker.begin()
        for scenario in chosen:
            cpu_scenario = time.process_time()
            res, errs, secs = _run_greedy_scenario(verify, scenario, tier=tier, seed=seed, device=dev, dtype=prob_dtype)
            results += res
            errors += errs
            timings[scenario.name] = secs
            cpu[scenario.name] = time.process_time() - cpu_scenario
            tracker.group_done(scenario.name, 0)
        tracker.finish()
        graded: Sequence[TestResult] = stats.grade(results, alpha=alpha)
    else:
        block = declared_block_size(verify)
        analyse = functools.partial(analyse_scenario, alpha=alpha, seed=seed, block_size=block)
        outcome = run_battery(
            ChainRunner(verify, seed, tuple(chosen), dev, prob_dtype),
            chosen,
            tier=tier,
            alpha=alpha,
            parallel=parallel,
            progress=progress,
            analyse=analyse,
        )
        graded, errors, timings, cpu, extra = (
            outcome.results,
            outcome.errors,
            outcome.timings,
            outcome.cpu_seconds,
            outcome.extra,
        )
    verdict = stats.run_verdict(graded, errors, gate_conformance=gate)
    timings["total"] = time.perf_counter() - start
    cpu["total"] = time.process_time() - cpu_start
    return Report(
        kind="verifier",
        implementation=implementation or callable_name(verify),
        tier=tier,
        seed=seed,
        alpha=alpha,
        verdict=verdict,
        results=tuple(graded),
        errors=tuple(errors),
        scenarios=tuple(s.config(tier) for s in chosen),
        timings=timings,
        environment=environment(),
        extra={
            "mode": "greedy" if greedy else "sampling",
            "cpu_seconds": cpu,
            **device_extra(dev, prob_dtype),
            **extra,
        },
        command=python_repro(
            "specverify:check_verifier",
            {"verify": verify},
            dict(
                tier=tier,
                seed=seed,
                alpha=alpha,
                greedy=greedy,
                scenarios=scenarios,
                implementation=implementation,
                **device_keywords(dev, prob_dtype),
                **parallel.keywords(),
                gate_conformance=gate or None,
            ),
        ),
        gate_conformance=gate,
    )


def check_greedy_verifier(
    verify, *, tier: str = "smoke", seed: int = 0, alpha: float = 1e-3, progress=None, implementation: str | None = None
) -> Report:
    """``check_verifier(verify, greedy=True, ...)``: exact equality with the greedy continuation."""
    return check_verifier(
        verify, tier=tier, seed=seed, alpha=alpha, greedy=True, progress=progress, implementation=implementation
    )


def check_verifier_on(
    verify,
    target: TableModel,
    drafter: TableModel,
    *,
    k: int = 4,
    batch_size: int = 1024,
    length: int = 8,
    num_groups: int = 1,
    seed: int = 0,
    alpha: float = 1e-3,
    name: str = "custom",
    gate_conformance: bool = False,
) -> Report:
    """One-scenario audit of ``verify`` on user-supplied table models (same tests as :func:`check_verifier`)."""
    if not callable(verify):
        raise InvalidArgument(f"verify must be callable, got {verify!r}")
    gate = check_bool("gate_conformance", gate_conformance)
    seed = check_int("seed", seed, minimum=0)
    alpha = check_alpha("alpha", alpha)
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(scenario_seed(seed, name))
    errors: list[str] = []
    try:
        run = run_harness(
            verify, target, drafter, k=k, batch_size=batch_size, length=length, generator=gen, num_groups=num_groups
        )
        results = [_protocol_result(name, True, run.num_calls)]
        block = declared_block_size(verify)
        results += analyse_run(run, target, drafter, scenario=name, alpha=alpha, seed=seed, block_size=block)
    except ImplementationError as exc:
        errors.append(f"{name}: {exc}")
        results = [_protocol_result(name, False, 0, errors[-1])]
    graded = stats.grade(results, alpha=alpha)
    config = {
        "name": name,
        "target": target.config(),
        "drafter": drafter.config(),
        "k": k,
        "batch_size": batch_size,
        "length": length,
        "num_groups": num_groups,
    }
    return Report(
        kind="verifier",
        implementation=callable_name(verify),
        tier="custom",
        seed=seed,
        alpha=alpha,
        verdict=stats.run_verdict(graded, errors, gate_conformance=gate),
        results=tuple(graded),
        errors=tuple(errors),
        scenarios=(config,),
        timings={name: time.perf_counter() - start, "total": time.perf_counter() - start},
        environment=environment(),
        extra={"mode": "sampling"},
        gate_conformance=gate,
    )

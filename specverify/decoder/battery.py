"""Whole-decoder check: does ``decoder.generate`` emit exactly the target's processed law?

``check_decoder(decoder, target, *, reference=None, tier="smoke", seed=0, alpha=1e-3,
progress=None, prompts=None, greedy=None) -> Report``

The decoder (protocol ``generate(prompt (T,), *, num_samples, max_new_tokens, seed) ->
(num_samples, max_new_tokens) long``) is run from fixed prompts derived from the seed
and the vocabulary size (V is learned from one ``target.next_token_probs`` call), or
from ``prompts=``.  Each prompt is one scenario:

1. protocol: the output is validated (shape, integer dtype, ids in [0, V)) and the
   same seed is run twice on a few samples (outputs must be identical).  A violation,
   or an exception from the decoder or the target, becomes an ``ImplementationError``
   message in ``Report.errors`` and the verdict ``"fail"`` -- never a crash;
2. exact mode (a ``target`` is given): the target's exact conditionals at every
   sampled prefix (its batched ``conditionals`` if it has one, else
   ``next_token_probs`` per position) feed per-position and per-prefix-node
   goodness of fit, the directed PIT / entropy-score tests over every token, the
   exact support check and the collision test on the first tokens
   (:mod:`.exact`).  When every conditional is one-hot (temperature 0), or with
   ``greedy=True``, a ``greedy`` test compares every row with the target's argmax
   continuation (p-value 0 on any mismatch);
3. two-sample mode (``reference`` given, ``target`` None): per-position, pair and
   per-node two-sample tests against m = 4 n reference samples (:mod:`.twosample`).
4. batch invariance (exact mode, for a decoder with ``generate_requests``): the first prompt's
   continuations alone and among 1..128 neighbour requests, seeded and unseeded mixed, against
   the exact law and against each other; a seeded request's tokens must not depend on its
   neighbours when the decoder declares ``per_request_seeds`` (:mod:`.compositions`).

All results are graded together (weighted Holm, :func:`specverify.stats.grade`) at the
run's family-wise ``alpha``.  Deterministic: same decoder, seed and tier, same report.

Tiers: ``smoke`` (<= 60 s on 2 CPU cores for the reference decoder with its tiny
models), ``standard`` (<= 10 min), ``deep`` (sized for a GPU).

References: Leviathan, Kalman & Matias (ICML 2023); Chen et al. (2023); ``docs/design.md``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specverify import stats
from specverify.core.devices import check_device
from specverify.core.environment import callable_name, environment
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.repro import python_repro
from specverify.core.results import ERROR, Report, TestResult, protocol_result
from specverify.core.seeds import derive_seed
from specverify.core.validation import check_bool, check_int, check_run_options
from specverify.shard.collect import Parallel, TaskUnits, collect_runs
from specverify.shard.work import Job

from .compositions import COMPOSITIONS, composition_results
from .conditionals import ExactPlan, analyse_exact
from .protocol import (
    ProgressTicker,
    TargetOn,
    call_generate,
    check_determinism,
    generate_fn,
    generate_on,
    make_prompts,
    next_token_probs,
    normalise_prompts,
    vocab_size_of,
)
from .twosample import analyse_two_sample

__all__ = ["check_decoder", "TierPlan", "TIER_PLANS"]


@dataclass(frozen=True)
class TierPlan:
    """Sample sizes of a tier (per scenario = per prompt)."""

    num_prompts: int
    num_samples: int
    max_new_tokens: int
    determinism_samples: int
    max_nodes: int
    min_node_visits: int
    greedy_samples: int
    reference_factor: int = 4


# fmt: off
TIER_PLANS = {
    "smoke": TierPlan(num_prompts=2, num_samples=4000, max_new_tokens=8, determinism_samples=16, max_nodes=6,
                      min_node_visits=200, greedy_samples=32),
    "standard": TierPlan(num_prompts=4, num_samples=40_000, max_new_tokens=16, determinism_samples=32, max_nodes=24,
                         min_node_visits=400, greedy_samples=128),
    "deep": TierPlan(num_prompts=8, num_samples=400_000, max_new_tokens=32, determinism_samples=64, max_nodes=64,
                     min_node_visits=1000, greedy_samples=1024),
}
# fmt: on


def _greedy_result(target, prompt: torch.Tensor, tokens: torch.Tensor, vocab_size: int, scenario: str) -> TestResult:
    """Every row must equal the target's argmax continuation (lowest id on ties); p-value 0 on any mismatch."""
    N, L = tokens.shape
    seq = prompt[None].clone()  # (1, T)
    for _ in range(L):
        probs = next_token_probs(target, seq, vocab_size)  # (1, V)
        seq = torch.cat([seq, probs.argmax(-1, keepdim=True)], dim=1)
    expected = seq[0, prompt.numel() :]  # (L,)
    wrong = tokens != expected[None]  # (N, L)
    bad_rows = wrong.any(1).nonzero().flatten()
    details = {
        "expected": expected.tolist(),
        "mismatched_rows": int(bad_rows.numel()),
        "mismatched_tokens": int(wrong.sum()),
    }
    if bad_rows.numel():
        row = int(bad_rows[0])
        details.update(first_row=row, first_position=int(wrong[row].nonzero()[0]) + 1, observed=tokens[row].tolist())
    return TestResult(
        statistic=float(wrong.sum()),
        pvalue=0.0 if bad_rows.numel() else 1.0,
        name="greedy",
        family="greedy",
        method="greedy: every row must equal the target's argmax continuation token for token (exact)",
        n=N * L,
        scenario=scenario,
        position="all",
        details=details,
    )


PROTOCOL_METHOD = "protocol: shape, integer dtype, token ids in [0, V), same seed -> same output (exact)"


def _protocol_result(scenario: str, error: str | None, n: int) -> TestResult:
    return protocol_result(scenario, error, n, method=PROTOCOL_METHOD)


def check_decoder(
    decoder,
    target=None,
    *,
    reference=None,
    tier: str = "smoke",
    seed: int = 0,
    alpha: float = 1e-3,
    progress=None,
    prompts=None,
    greedy: bool | None = None,
    num_samples: int | None = None,
    max_new_tokens: int | None = None,
    device=None,
    workers: int | None = None,
    backend: str | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    batch_invariance: bool = True,
) -> Report:
    """Check that a whole speculative decoder emits exactly its target's (processed) law.

    Parameters
    ----------
    decoder : object with ``generate(prompt, *, num_samples, max_new_tokens, seed)``
        The decoder under test (a plain callable with that signature also works).
    target : object with ``next_token_probs(prefix (B, T)) -> (B, V)``, optional
        The target's processed conditionals (an optional batched
        ``conditionals(sequences (B, T+L), start=T) -> (B, L, V)`` is used when present).
    reference : decoder, optional
        A second decoder (e.g. direct sampling); with ``target=None`` the check is
        two-sample, with m = 4 n reference samples.  Unused when ``target`` is given
        (the exact conditionals are strictly more informative).
    tier : {"smoke", "standard", "deep"}
    seed : int
        Root seed; every decoder seed, prompt and PIT uniform derives from it.
    alpha : float
        Family-wise false-alarm rate of the whole run.
    progress : callable, optional
        Told after each of a prompt's three stages (generate, determinism, statistics):
        ``progress(done, total, name)`` in stages, or ``progress.update(state)``
        (:mod:`specverify.core.progress`); with sharding, as each prompt finishes.
    prompts : 1-D token sequence or sequence of them, optional
        Replace the derived prompts (one scenario per prompt).
    greedy : bool or None
        ``True``: the decoder is greedy; only the protocol and the argmax continuation
        are checked (needs ``target``).  ``None`` (default): a ``greedy`` test is added
        when every exact conditional is one-hot.  ``False``: never.
    num_samples, max_new_tokens : int, optional
        Override the tier's samples per prompt / new tokens per sample.
    device : str or torch.device, optional
        Where prompts are handed to the decoder and prefixes to the target (default the
        CPU); outputs come back in one transfer per call.  The decoder computes its own
        probabilities, so their dtype is the decoder's (a
        :class:`~specverify.decoder.pipeline.ProtocolDecoder` takes ``device`` and ``dtype``).
    workers, backend, shards, ray_address : optional
        Check the prompts in parallel (:mod:`specverify.shard`; one unit per prompt, whose seeds
        derive from the root seed and its index, so the report is the same): ``workers``
        local processes, threads with ``backend="threads"`` (a thread-safe decoder only), or
        Ray tasks with ``backend="ray"``.  The decoder and target travel to worker processes
        by pickling.
    batch_invariance : bool
        Run the batch-invariance tests (:mod:`.compositions`) when the decoder has
        ``generate_requests`` (exact mode only).  ``False`` when the decoder is a harness of the
        suite's own (the drafter audit's pipeline), whose batching is not under test.

    Returns
    -------
    Report
        ``kind="decoder"``; ``errors`` holds protocol violations (verdict ``"fail"``).

    Raises
    ------
    InvalidArgument
        On bad arguments of this function (never for a misbehaving implementation).
    """
    started = time.perf_counter()
    seed, alpha = check_run_options(tier, TIER_PLANS, seed, alpha, progress)
    parallel = Parallel(workers, backend, shards, ray_address)
    batch_invariance = check_bool("batch_invariance", batch_invariance)
    run = _prepare(decoder, target, reference, greedy, TIER_PLANS[tier], num_samples, max_new_tokens, alpha)
    dev = check_device("device", device)
    if dev.type != "cpu":
        run = dataclasses.replace(
            run,
            generate=generate_on(run.generate, dev),
            ref_generate=None if run.ref_generate is None else generate_on(run.ref_generate, dev),
            target=None if run.target is None else TargetOn(run.target, dev),
        )
    base: dict[str, Any] = dict(
        kind="decoder",
        implementation=callable_name(decoder),
        tier=tier,
        seed=seed,
        alpha=alpha,
        environment=environment(getattr(decoder, "device", None) or "cpu"),
        command=python_repro(
            "specverify:check_decoder",
            {"decoder": decoder, "target": target},
            dict(
                reference=reference,
                tier=tier,
                seed=seed,
                alpha=alpha,
                prompts=prompts,
                greedy=greedy,
                num_samples=num_samples,
                max_new_tokens=max_new_tokens,
                device=None if dev.type == "cpu" else str(dev),
                **({} if batch_invariance else {"batch_invariance": False}),
                **parallel.keywords(),
            ),
        ),
    )
    try:
        V = _vocab_size(run, decoder, reference, prompts)
    except ImplementationError as error:
        return Report(
            verdict=ERROR,
            errors=(f"target: {error}",),
            timings={"total": time.perf_counter() - started},
            extra={"mode": run.mode},
            **base,
        )
    prompt_list = (
        normalise_prompts(prompts, V) if prompts is not None else make_prompts(run.plan.num_prompts, V or 2, seed=seed)
    )
    k = getattr(decoder, "k", None)
    k = int(k) if isinstance(k, (int, np.integer)) and not isinstance(k, bool) else None

    results: list[TestResult] = []
    errors: list[str] = []
    scenarios, timings, summaries = [], {}, {}
    records = [
        _scenario_record(run, f"prompt{i}", p, V, k, _prompt_seeds(seed, i, run.mode))
        for i, p in enumerate(prompt_list)
    ]
    if parallel.default:
        ticker = ProgressTicker(progress, [(r["name"], _STAGES) for r in records])
        task = PromptTask(run, tuple(prompt_list), tuple(records), ticker)
        ticker.begin()
        outputs = [task(i) for i in range(len(prompt_list))]
        ticker.finish()
        sharding = None
    else:  # one unit per prompt: every prompt's seeds derive from (seed, prompt index); progress in prompts
        task = PromptTask(run, tuple(prompt_list), tuple(records))
        collected = collect_runs(Job(task), [task.scenario("prompts")], tier=tier, parallel=parallel, progress=progress)
        outputs, sharding = collected.runs["prompts"], collected.record
    for (res, failure, scenario, summary, secs), record in zip(outputs, records):
        results += res
        errors += [failure] if failure else []
        scenarios.append(scenario)
        timings[record["name"]] = secs
        summaries[record["name"]] = summary

    invariance: dict = {"batch_invariance": f"not tested: needs the exact mode (mode {run.mode})"}
    one_hot = any(s.get("all_one_hot") for s in summaries.values())
    if one_hot:
        invariance = {"batch_invariance": "not tested: every conditional is one-hot (the greedy check is exact)"}
    if not batch_invariance:
        invariance = {"batch_invariance": "not tested: batch_invariance=False"}
    if run.mode == "exact" and V is not None and not one_hot and batch_invariance:
        t_inv = time.perf_counter()
        focus = prompt_list[0]
        neighbours = list(
            torch.randint(0, V, (max(COMPOSITIONS) - 1, focus.numel()), generator=torch.Generator().manual_seed(seed))
        )
        try:
            res, invariance = composition_results(
                decoder, run.target, focus, neighbours, vocab_size=V, num_samples=run.plan.num_samples,
                max_new_tokens=run.plan.max_new_tokens, seed=derive_seed(seed, 0xBA7C4), alpha=alpha,
            )  # fmt: skip
            results += res
        except ImplementationError as error:
            errors.append(f"batch: {error}")
            results.append(_protocol_result("batch", str(error), 0))
        timings["batch"] = time.perf_counter() - t_inv

    graded, verdict = stats.grade_run(results, errors, alpha=alpha)
    timings["total"] = time.perf_counter() - started
    extra = {
        "mode": run.mode,
        "tier_plan": dataclasses.asdict(run.plan),
        "decoder": summaries,
        "batch_invariance": invariance,
    }
    if sharding is not None:
        extra["sharding"] = sharding
    if dev.type != "cpu":
        extra["device"] = str(dev)
    if reference is not None:
        extra["reference"] = callable_name(reference)
    return Report(
        verdict=verdict,
        results=graded,
        errors=tuple(errors),
        scenarios=tuple(scenarios),
        timings=timings,
        extra=extra,
        **base,
    )


_STAGES = 3  # progress ticks per prompt: generate, determinism, statistics


@dataclass(frozen=True)
class _Run:
    """What every prompt of one ``check_decoder`` run shares."""

    generate: object
    ref_generate: object
    target: object
    greedy: bool | None
    mode: str  # "greedy" | "exact" | "two_sample"
    plan: TierPlan
    exact_plan: ExactPlan


def _prepare(decoder, target, reference, greedy, plan, num_samples, max_new_tokens, alpha) -> _Run:
    """Validate ``check_decoder``'s arguments; the shared state of the run."""
    if greedy not in (None, True, False):
        raise InvalidArgument(f"greedy must be None, True or False, got {greedy!r}")
    generate = generate_fn(decoder)
    if target is not None and not callable(getattr(target, "next_token_probs", None)):
        raise InvalidArgument(f"target must have a .next_token_probs(prefix) method, got {type(target).__name__}")
    ref_generate = generate_fn(reference, "reference") if reference is not None else None
    if target is None and reference is None:
        raise InvalidArgument("check_decoder needs a target (exact conditionals) or a reference decoder (two-sample)")
    if greedy is True and target is None:
        raise InvalidArgument("greedy=True needs a target (the argmax continuation is computed from it)")
    if num_samples is not None:
        plan = dataclasses.replace(plan, num_samples=check_int("num_samples", num_samples, minimum=2))
    if max_new_tokens is not None:
        plan = dataclasses.replace(plan, max_new_tokens=check_int("max_new_tokens", max_new_tokens, minimum=1))
    return _Run(
        generate=generate,
        ref_generate=ref_generate,
        target=target,
        greedy=greedy,
        mode="greedy" if greedy is True else ("exact" if target is not None else "two_sample"),
        plan=plan,
        exact_plan=ExactPlan(max_nodes=plan.max_nodes, min_node_visits=plan.min_node_visits, alpha=alpha),
    )


def _vocab_size(run: _Run, decoder, reference, prompts) -> int | None:
    """V from one target call (bad prompts are reported before the target is called), else from the decoders."""
    if run.target is None:
        return vocab_size_of(decoder, reference)
    if prompts is not None:
        normalise_prompts(prompts, None)
    probe = torch.zeros(1, dtype=torch.long)  # token 0 is valid for every vocabulary
    return next_token_probs(run.target, probe[None]).shape[-1]


def _prompt_seeds(seed: int, i: int, mode: str) -> dict[str, int]:
    """The seeds of prompt ``i``, each derived from the root seed and a fixed label."""
    seeds = {"decoder_seed": derive_seed(seed, 1, i), "determinism_seed": derive_seed(seed, 2, i)}
    if mode == "exact":
        seeds["pit_seed"] = derive_seed(seed, 3, i)
    if mode == "two_sample":
        seeds["reference_seed"] = derive_seed(seed, 4, i)
    return seeds


def _scenario_record(run: _Run, name: str, prompt: torch.Tensor, V, k, seeds: dict) -> dict:
    """The report's record of one prompt: sizes, seeds and a one-line description."""
    N = run.plan.greedy_samples if run.mode == "greedy" else run.plan.num_samples
    L = run.plan.max_new_tokens
    scenario = {
        "name": name,
        "mode": run.mode,
        "vocab_size": V,
        **({"k": k} if k is not None else {}),
        "n": N,
        "max_new_tokens": L,
        "prompt": prompt.tolist(),
        **seeds,
        "description": f"{run.mode} check of {N} continuations of {L} new tokens after prompt {prompt.tolist()}",
    }
    if run.mode == "two_sample":
        scenario["reference_n"] = run.plan.reference_factor * N
    return scenario


@dataclass(frozen=True)
class PromptTask:
    """One prompt's whole check, runnable in any process: ``task(i) -> (results, error, scenario, summary,
    seconds)`` (an implementation error is in the output: a finding).

    Also the runner of a sharded decoder battery (:class:`specverify.shard.work.Job`): its one
    scenario, ``"prompts"``, has a group per prompt, and a merge is the list of their outputs.
    """

    run: _Run
    prompts: tuple
    records: tuple
    tick: Any = None
    device = None  # the decoder's own device handling (generate_on) applies inside each prompt

    @property
    def implementation(self):
        return self.run.generate

    def scenario(self, name: str) -> TaskUnits:
        return TaskUnits(name, len(self.prompts))

    def setup(self, scenario) -> None:
        return None

    def run_group(self, scenario, state, group: int):
        return self(group)

    def merge(self, outputs) -> list:
        return list(outputs)

    def __call__(self, i: int):
        t0 = time.perf_counter()
        tick = self.tick or ProgressTicker(None, ())
        scenario, summary = dict(self.records[i]), {}  # type: dict, dict
        name = scenario["name"]
        try:
            results, error = _check_prompt(self.run, scenario, self.prompts[i], summary, tick), None
        except ImplementationError as exc:
            results, error = [_protocol_result(name, str(exc), scenario["n"])], f"{name}: {exc}"
            tick(name, finished=True)
        return results, error, scenario, summary, time.perf_counter() - t0


def _check_prompt(run: _Run, scenario: dict, prompt: torch.Tensor, summary: dict, tick) -> list[TestResult]:
    """Generate, check determinism and analyse one prompt; raises ImplementationError on a violation."""
    name, N, L, V = scenario["name"], scenario["n"], scenario["max_new_tokens"], scenario["vocab_size"]
    t_gen = time.perf_counter()
    tokens = call_generate(
        run.generate, prompt, num_samples=N, max_new_tokens=L, seed=scenario["decoder_seed"], vocab_size=V
    )  # (N, L)
    summary["generate_seconds"] = time.perf_counter() - t_gen
    summary["tokens_per_second"] = N * L / max(summary["generate_seconds"], 1e-9)
    tick(name)
    check_determinism(
        run.generate,
        prompt,
        num_samples=run.plan.determinism_samples,
        max_new_tokens=L,
        seed=scenario["determinism_seed"],
        vocab_size=V,
    )
    results = [_protocol_result(name, None, N)]
    tick(name)
    if run.mode == "greedy":
        results.append(_greedy_result(run.target, prompt, tokens, V, name))
    elif run.mode == "exact":
        results += _exact_results(run, scenario, prompt, tokens, summary)
    else:
        ref_tokens = call_generate(
            run.ref_generate,
            prompt,
            num_samples=scenario["reference_n"],
            max_new_tokens=L,
            seed=scenario["reference_seed"],
            vocab_size=V,
            role="reference",
        )  # (m, L)
        vocab = V if V is not None else int(max(tokens.max(), ref_tokens.max())) + 1
        scenario["vocab_size"] = vocab
        results += analyse_two_sample(tokens, ref_tokens, vocab, scenario=name, plan=run.exact_plan)
    tick(name)
    return results


def _exact_results(run: _Run, scenario: dict, prompt, tokens, summary: dict) -> list[TestResult]:
    """The exact-conditional battery of one prompt (support + greedy only when every law is one-hot)."""
    name, V = scenario["name"], scenario["vocab_size"]
    analysis = analyse_exact(
        run.target, prompt, tokens, V, scenario=name, plan=run.exact_plan, pit_seed=scenario["pit_seed"]
    )
    summary.update(analysis.summary, all_one_hot=analysis.all_one_hot)
    if analysis.prompt_probs is not None and V <= 64:
        scenario["target_probs_preview"] = [float(x) for x in analysis.prompt_probs]
    if not analysis.all_one_hot:
        return list(analysis.results)
    # Temperature 0: every law is a point mass, so the support check alone is exact and the binned /
    # directed / collision tests have no power; keep support, add the greedy check.
    results = [r for r in analysis.results if r.family == "support"]
    if run.greedy is None:
        results.append(_greedy_result(run.target, prompt, tokens, V, name))
    return results

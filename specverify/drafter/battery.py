"""Drafter audit: is the drafter consistent, is the pipeline lossless, what does it buy?

``audit_drafter(drafter, target, *, verifier=None, tier="smoke", seed=0, alpha=1e-3,
progress=None, k=None, draft_cost=None, model_params=None, bandwidth=3.35e12,
bytes_per_param=2) -> Report(kind="drafter")``

Three parts, graded together under one family-wise ``alpha`` (weighted Holm,
:func:`specverify.stats.grade`):

(a) **consistency** (:mod:`.consistency`, family ``"consistency"``): for fixed prefixes
    the drafter's tokens must follow the q it reports (GOF, PIT, support,
    normalisation).  Needs neither target nor verifier, so a failure here names the
    drafter as the culprit even when the verifier is right;
(b) **losslessness**: the drafter, the target and the verifier (the canonical
    :func:`reference.rules.verify` unless ``verifier`` is given) assembled into a
    :class:`~specverify.decoder.pipeline.ProtocolDecoder` and checked by
    :func:`specverify.decoder.check_decoder` (its scenarios are renamed
    ``pipeline:promptN``);
(c) **efficiency** (:mod:`.efficiency`): acceptance per in-block position with
    Clopper-Pearson intervals and ``acceptance`` tests against the exact per-trial
    ``sum_x min(p, q)``; accepted length; target passes per token; the speedup model
    and best K; the memory-bound latency per token.  In ``Report.extra["efficiency"]``
    and, for the report's acceptance plot, ``Report.extra["acceptance"]["efficiency"]``.

``Report.extra["diagnosis"]`` names the culprit: ``"drafter"`` (consistency failed:
"the drafter's samples do not follow its reported q"), ``"verifier"`` (the drafter is
consistent but the pipeline is lossy or its acceptance rates are off), ``"protocol"``
(a component raised or returned malformed output: ``Report.errors``), or None.

Tiers (per prompt; prompts derived from the seed as in ``check_decoder``): ``smoke``
<= 60 s on 2 CPU cores for a table-model drafter and target.

References: Leviathan, Kalman & Matias (ICML 2023); Chen et al. (2023); ``docs/design.md``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specverify import stats
from specverify.core.devices import check_device, check_prob_dtype, dtype_name
from specverify.core.environment import callable_name
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.repro import python_repro
from specverify.core.results import ERROR, FAIL, Report, TestResult, protocol_result
from specverify.core.seeds import derive_seed
from specverify.core.validation import check_bool, check_int, check_run_options
from specverify.decoder import check_decoder
from specverify.decoder.pipeline import ProtocolDecoder, merge_stats
from specverify.decoder.protocol import ProgressTicker, make_prompts, next_token_probs
from specverify_reference.rules import verify as canonical_verify

from .acceptance import acceptance_entry, acceptance_results, efficiency_section
from .consistency import analyse_consistency, check_drafter_determinism, consistency_summary, draw_drafts

__all__ = ["audit_drafter", "AuditPlan", "AUDIT_PLANS", "DEFAULT_K"]

#: Draft length when neither ``k=`` nor a ``drafter.k`` attribute gives one.
DEFAULT_K = 4


@dataclass(frozen=True)
class AuditPlan:
    """Sample sizes of a tier (per prompt)."""

    num_prompts: int
    consistency_samples: int
    determinism_samples: int
    efficiency_samples: int
    efficiency_tokens: int


# fmt: off
AUDIT_PLANS = {
    "smoke": AuditPlan(num_prompts=2, consistency_samples=20_000, determinism_samples=16, efficiency_samples=2000,
                       efficiency_tokens=16),
    "standard": AuditPlan(num_prompts=4, consistency_samples=200_000, determinism_samples=32,
                          efficiency_samples=20_000, efficiency_tokens=32),
    "deep": AuditPlan(num_prompts=8, consistency_samples=2_000_000, determinism_samples=64,
                      efficiency_samples=200_000, efficiency_tokens=64),
}
# fmt: on


def _positive(name: str, value, *, allow_none: bool = False, allow_zero: bool = False):
    if value is None and allow_none:
        return None
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and (float(value) >= 0 if allow_zero else float(value) > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(
            f"{name} must be a finite number {bound}{' or None' if allow_none else ''}, got {value!r}"
        )
    return float(value)


PROTOCOL_METHOD = (
    "protocol: drafter output shapes, dtypes, token ids in [0, V), finite non-negative q, "
    "same generator seed -> same drafts (exact)"
)


def _protocol_result(scenario: str, error: str | None, n: int) -> TestResult:
    return protocol_result(scenario, error, n, method=PROTOCOL_METHOD)


def _diagnosis(graded, errors) -> dict:
    failing = [r for r in graded if r.grade == FAIL]
    drafter = [r for r in failing if r.family == "consistency"]
    if drafter:
        tests = sorted({f"{r.name}@{r.position}" for r in drafter})
        return {
            "culprit": "drafter",
            "message": "the drafter's samples do not follow its reported q "
            f"(failed: {', '.join(tests[:8])}); speculative sampling is lossless only when q is the law "
            "the drafts were drawn from",
            "failed_tests": tests,
        }
    if errors:
        return {"culprit": "protocol", "message": "a component raised or returned malformed output: " + errors[0]}
    pipeline = [r for r in failing if r.scenario.startswith("pipeline:")]
    if pipeline:
        tests = sorted({f"{r.family}/{r.name}@{r.scenario}/{r.position}" for r in pipeline})
        return {
            "culprit": "verifier",
            "message": "the drafter is consistent but the pipeline's output law is not "
            "the target's: the verifier (or its wiring) is lossy",
            "failed_tests": tests,
        }
    accept = [r for r in failing if r.family == "acceptance"]
    if accept:
        tests = sorted({f"{r.name}@{r.position}" for r in accept})
        return {
            "culprit": "verifier",
            "message": "acceptance rates differ from the exact sum_x min(p, q): the accept step is not the "
            "canonical rule (rule conformance; the output law is judged by the other tests)",
            "failed_tests": tests,
        }
    return {"culprit": None, "message": "no failure"}


def audit_drafter(
    drafter,
    target,
    *,
    verifier=None,
    tier: str = "smoke",
    seed: int = 0,
    alpha: float = 1e-3,
    progress=None,
    k: int | None = None,
    draft_cost: float | None = None,
    model_params: float | None = None,
    bandwidth: float = 3.35e12,
    bytes_per_param: float = 2,
    device=None,
    dtype=None,
    gate_conformance: bool = False,
) -> Report:
    """Audit a drafter: consistency of its reported q, losslessness of the pipeline, efficiency.

    Parameters
    ----------
    drafter : object with ``draft(prefix (B, T), k, *, generator) -> (tokens (B, k), probs (B, k, V))``
    target : object with ``next_token_probs(prefix (B, T)) -> (B, V)``
    verifier : callable, optional
        The verifier protocol; default :func:`reference.rules.verify`.
    tier : {"smoke", "standard", "deep"}
    seed : int
        Root seed; every prompt, draft, decoder and PIT seed derives from it.
    alpha : float
        Family-wise false-alarm rate of the whole audit.
    progress : callable, optional
        Told after each stage (each consistency prompt, the pipeline, the efficiency
        run): ``progress(done, total, name)`` in stages, or ``progress.update(state)``
        (:mod:`specverify.core.progress`).
    k : int, optional
        Draft length K (default: ``drafter.k`` if it is an int, else 4).
    draft_cost : float, optional
        Drafter pass / target pass time; without it the speedup curve is reported for
        a few typical values.
    model_params, bandwidth, bytes_per_param : float
        Target size (parameters), memory bandwidth (bytes/s) and bytes per parameter
        for the memory-bound latency estimate (only with ``model_params``).

    Returns
    -------
    Report
        ``kind="drafter"``; ``extra`` holds ``"efficiency"``, ``"acceptance"``,
        ``"consistency"``, ``"pipeline"`` and ``"diagnosis"``.

    device : str or torch.device, optional
        Where the pipeline's verifier runs (default the CPU); see
        :class:`~specverify.decoder.pipeline.ProtocolDecoder`.  The drafter and target run
        where they live.
    dtype : torch.dtype or str, optional
        dtype of the probabilities handed to the verifier: float32, bfloat16, float16
        (default: as the target returns them).
    gate_conformance : bool
        Make rule conformance (the efficiency run's acceptance tests against the exact
        ``sum_x min(p, q)``, graded under their own budget) part of the verdict, as in
        :func:`specverify.check_verifier`; by default they are reported on their own line.

    Raises
    ------
    InvalidArgument
        On bad arguments of this function (a misbehaving drafter, target or verifier
        is reported in ``Report.errors`` instead).
    """
    started = time.perf_counter()
    seed, alpha = check_run_options(tier, AUDIT_PLANS, seed, alpha, progress)
    gate = check_bool("gate_conformance", gate_conformance)
    if not callable(getattr(drafter, "draft", None)):
        raise InvalidArgument(
            f"drafter must have a .draft(prefix, k, *, generator) method, got {type(drafter).__name__}"
        )
    if not callable(getattr(target, "next_token_probs", None)):
        raise InvalidArgument(f"target must have a .next_token_probs(prefix) method, got {type(target).__name__}")
    if verifier is not None and not callable(verifier):
        raise InvalidArgument(
            f"verifier must be callable(target_probs, draft_probs, draft_tokens, *, generator), got {verifier!r}"
        )
    if k is None:
        own = getattr(drafter, "k", None)
        k = own if isinstance(own, int) and not isinstance(own, bool) and own >= 1 else DEFAULT_K
    k = check_int("k", k, minimum=1)
    draft_cost = _positive("draft_cost", draft_cost, allow_none=True, allow_zero=True)
    model_params = _positive("model_params", model_params, allow_none=True)
    bandwidth = _positive("bandwidth", bandwidth)
    bytes_per_param = _positive("bytes_per_param", bytes_per_param)
    dev = check_device("device", device)
    prob_dtype = None if dtype is None else check_prob_dtype("dtype", dtype)
    verify = verifier if verifier is not None else canonical_verify
    plan = AUDIT_PLANS[tier]
    base: dict[str, Any] = dict(
        kind="drafter", implementation=callable_name(drafter), tier=tier, seed=seed, alpha=alpha
    )
    base["command"] = python_repro(
        "specverify:audit_drafter",
        {"drafter": drafter, "target": target},
        dict(
            verifier=verifier,
            tier=tier,
            seed=seed,
            alpha=alpha,
            k=k,
            draft_cost=draft_cost,
            model_params=model_params,
            bandwidth=bandwidth,
            bytes_per_param=bytes_per_param,
            device=None if dev.type == "cpu" else str(dev),
            dtype=None if prob_dtype is None else dtype_name(prob_dtype),
            gate_conformance=gate or None,
        ),
    )

    out = _Collected()
    extra: dict = {
        "k": k,
        "verifier": callable_name(verify),
        "target": callable_name(target),
        "tier_plan": dataclasses.asdict(plan),
    }
    stages = [(f"consistency:prompt{i}", 1) for i in range(plan.num_prompts)] + [("pipeline", 1), ("efficiency", 1)]
    tick = ProgressTicker(progress, stages)
    tick.begin()

    try:
        V = next_token_probs(target, torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    except ImplementationError as error:
        extra["diagnosis"] = _diagnosis((), [f"target: {error}"])
        return Report(
            verdict=ERROR,
            errors=(f"target: {error}",),
            timings={"total": time.perf_counter() - started},
            extra=extra,
            **base,
        )
    extra["vocab_size"] = V
    prompts = make_prompts(plan.num_prompts, V, seed=seed)

    extra["consistency"] = _consistency_part(drafter, prompts, V, k, plan, seed, alpha, out, tick)
    decoder = ProtocolDecoder(drafter, target, k=k, verify=verify, device=dev, dtype=prob_dtype)
    if dev.type != "cpu" or prob_dtype is not None:
        extra.update(device=str(dev), dtype=dtype_name(prob_dtype) if prob_dtype is not None else "as the target's")
    pipeline = _pipeline_part(decoder, target, prompts, tier, seed, alpha, out, tick)
    extra["pipeline"] = {"verdict_alone": pipeline.verdict, "decoder": pipeline.extra.get("decoder", {})}
    cost = dict(draft_cost=draft_cost, model_params=model_params, bandwidth=bandwidth, bytes_per_param=bytes_per_param)
    extra.update(_efficiency_part(decoder, prompts, V, k, plan, seed, alpha, cost, out, tick))

    tick.finish()
    graded, verdict = stats.grade_run(out.results, out.errors, alpha=alpha, gate_conformance=gate)
    extra["diagnosis"] = _diagnosis(graded, out.errors)
    out.timings["total"] = time.perf_counter() - started
    return Report(
        verdict=verdict,
        results=graded,
        errors=tuple(out.errors),
        scenarios=tuple(out.scenarios),
        timings=out.timings,
        environment=pipeline.environment,
        extra=extra,
        gate_conformance=gate,
        **base,
    )


@dataclass
class _Collected:
    """What the three parts of an audit add to the report, in order."""

    results: list[TestResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    scenarios: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def _consistency_part(drafter, prompts, V: int, k: int, plan: AuditPlan, seed: int, alpha: float, out, tick) -> dict:
    """(a) Do the drafted tokens follow the q the drafter reports?  Per prompt; the summaries."""
    summaries = {}
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        name = f"consistency:prompt{i}"
        seeds = {
            "draft_seed": derive_seed(seed, 31, i),
            "determinism_seed": derive_seed(seed, 32, i),
            "pit_seed": derive_seed(seed, 33, i),
        }
        scenario = {
            "name": name,
            "part": "consistency",
            "vocab_size": V,
            "k": k,
            "n": plan.consistency_samples,
            "prompt": prompt.tolist(),
            **seeds,
            "description": f"{plan.consistency_samples} drafts of {k} tokens after prefix "
            f"{prompt.tolist()}, each token tested against its own reported q row",
        }
        out.scenarios.append(scenario)
        try:
            check_drafter_determinism(
                drafter, prompt, num_samples=plan.determinism_samples, k=k, vocab_size=V, seed=seeds["determinism_seed"]
            )
            tokens, probs = draw_drafts(
                drafter,
                prompt,
                num_samples=plan.consistency_samples,
                k=k,
                vocab_size=V,
                generator=torch.Generator().manual_seed(seeds["draft_seed"]),
            )  # (N, k), (N, k, V)
            out.results.append(_protocol_result(name, None, plan.consistency_samples))
            pit_generator = torch.Generator().manual_seed(seeds["pit_seed"])
            out.results += analyse_consistency(tokens, probs, scenario=name, alpha=alpha, pit_generator=pit_generator)
            summaries[name] = consistency_summary(tokens, probs)
            if V <= 64:
                scenario["draft_probs_preview"] = [float(x) for x in probs[0, 0]]
        except ImplementationError as error:
            out.errors.append(f"{name}: {error}")
            out.results.append(_protocol_result(name, str(error), plan.consistency_samples))
        out.timings[name] = time.perf_counter() - t0
        tick(f"{name}")
    return summaries


def _pipeline_part(decoder, target, prompts, tier: str, seed: int, alpha: float, out, tick) -> Report:
    """(b) Losslessness of the whole pipeline: ``check_decoder``, its results regraded with the audit's."""
    t0 = time.perf_counter()
    pipeline = check_decoder(
        decoder, target, tier=tier, seed=derive_seed(seed, 41), alpha=alpha, prompts=prompts, batch_invariance=False
    )  # the pipeline is the suite's own: its batching is not the drafter's
    for r in pipeline.results:
        out.results.append(r.replace(scenario=f"pipeline:{r.scenario}", alpha=None, adjusted_pvalue=None, grade=None))
    for s in pipeline.scenarios:
        out.scenarios.append({**s, "name": f"pipeline:{s['name']}", "part": "pipeline"})
    out.errors.extend(f"pipeline:{e}" for e in pipeline.errors)  # "pipeline:prompt0: ...", as the scenario is named
    out.timings["pipeline"] = time.perf_counter() - t0
    tick("pipeline")
    return pipeline


def _efficiency_part(decoder, prompts, V: int, k: int, plan, seed: int, alpha: float, cost: dict, out, tick) -> dict:
    """(c) Acceptance per position against its exact value, and what it buys; the report sections."""
    t0 = time.perf_counter()
    eff_seeds = [derive_seed(seed, 51, i) for i in range(len(prompts))]
    out.scenarios.append(
        {
            "name": "efficiency",
            "part": "efficiency",
            "vocab_size": V,
            "k": k,
            "n": plan.efficiency_samples * len(prompts),
            "max_new_tokens": plan.efficiency_tokens,
            "decoder_seeds": eff_seeds,
            "description": f"{plan.efficiency_samples} continuations of {plan.efficiency_tokens} tokens "
            f"per prompt through the pipeline; acceptance vs exact sum_x min(p, q)",
        }
    )
    sections: dict = {}
    try:
        runs = [
            decoder.decode(
                prompt, num_samples=plan.efficiency_samples, max_new_tokens=plan.efficiency_tokens, seed=s
            ).stats
            for prompt, s in zip(prompts, eff_seeds)
        ]
        run = merge_stats(runs)
        out.results += acceptance_results(run, alpha=alpha, scenario="efficiency")
        sections["efficiency"] = efficiency_section(run, **cost)
        sections["acceptance"] = {"efficiency": acceptance_entry(run)}
    except ImplementationError as error:
        out.errors.append(f"efficiency: {error}")
        out.results.append(_protocol_result("efficiency", str(error), plan.efficiency_samples))
    out.timings["efficiency"] = time.perf_counter() - t0
    tick("efficiency")
    return sections

"""Measure how far a (lossy) chain verifier is from the target, per position, and what it buys.

:func:`measure_divergence` runs the chain harness (:func:`specverify.verifier.harness.run_harness`)
on table models -- a named scenario of :mod:`specverify.verifier.scenarios` or a given
``(target, drafter, k)`` -- and reports, per in-block position 1..K+1 and per absolute
position, the estimates of :func:`specverify.stats.divergence.divergence` against the
exact target law: bias-corrected TV with a confidence interval (and a coarse interval for
large V), KL, the most over- and under-emitted tokens; plus the acceptance rate per
in-block position, mean accepted drafts and tokens per target pass (one verify call is one
target pass).

Strata and validity.  Rows are independent.  An absolute position holds one token per
row.  For an in-block position only the *first* token of each row at that position is
used (a stopping time of the row's own past), so each stratum holds at most one token
per row and, given the contexts, its tokens are independent -- what the confidence
bounds need.  The context of a token is the pair (target context, drafter context): a
lossy rule's law depends on both, and the exact comparator is the target row of the
first.  The interval targets ``sum_c (n_c/n) TV(Q_c, P_c)`` over the observed contexts.

With ``declared_law`` (``declared_law(target_rows (n, V), draft_rows (n, V) or None) ->
(n, V)``, the law of a reached position; None at the bonus position, e.g.
``reference.lossy.ensemble_declared_law``) every stratum also gets the exact TV of the
declared law from the target at the observed contexts (``declared_tv``, the value the
interval should contain) and a conformance check of the samples against the declared law
-- Cressie-Read GOF and the support test of :mod:`specverify.stats` on every stratum,
graded under one error budget (:func:`specverify.stats.budget.grade_run`).

Shapes: R rows, L tokens per row, V vocabulary, n samples of a stratum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specverify.core.errors import InvalidArgument
from specverify.core.results import TestResult, _jsonable
from specverify.core.seeds import scenario_seed
from specverify.core.tables import TableModel
from specverify.core.validation import check_int
from specverify.stats.budget import grade_run
from specverify.stats.divergence import DivergenceEstimate, divergence
from specverify.stats.gof import support_test
from specverify.stats.sparse import gof_pair
from specverify.verifier.harness import HarnessRun, run_harness
from specverify.verifier.scenarios import TIERS, Scenario, get_scenarios

__all__ = [
    "StratumDivergence",
    "OverallTV",
    "MeasureResult",
    "measure_divergence",
    "measure_run",
    "DEFAULT_SCENARIO",
    "estimate_mark",
    "estimate_notes",
]

#: Scenario measured when neither a scenario nor (target, drafter, k) is given.
DEFAULT_SCENARIO = "pos8_uniform_k4"

#: Marks on a TV point estimate outside its own interval (:func:`estimate_mark`, :func:`estimate_notes`).
BELOW_ZERO, BELOW_INTERVAL = "*", "^"


def estimate_mark(tv: float, lower: float) -> str:
    """``"*"`` for a TV estimate below 0, ``"^"`` for one below its interval's lower bound, else ``""``.

    The estimate is the plug-in TV minus its exact expectation under exact sampling
    (:mod:`specverify.stats.divergence`): centred on 0 when the true TV is 0, so it can be
    negative there, and under a lossy law it over-corrects by at most that expectation, so it
    can sit below the lower bound (which is never below 0).  It never exceeds the upper bound
    (``upper >= plug-in >= estimate``).
    """
    if tv < 0:
        return BELOW_ZERO
    if tv < lower:
        return BELOW_INTERVAL
    return ""


def estimate_notes(marks, *, kl_negative: bool = False) -> list[str]:
    """One line per kind of mark used (``marks``: the marks of :func:`estimate_mark` shown), and one for a
    negative KL: why an estimate lies outside its interval, so that a reader trusts the interval."""
    out = []
    if BELOW_ZERO in marks:
        out.append(
            f"{BELOW_ZERO} TV below 0: the estimate is bias-corrected (plug-in minus its expectation under exact "
            "sampling) and centred on 0 when the true TV is 0: indistinguishable from 0; the interval (never below "
            "0) is the guarantee."
        )
    if BELOW_INTERVAL in marks:
        out.append(
            f"{BELOW_INTERVAL} TV below its interval: under a lossy law the bias correction over-subtracts (by at "
            "most the plug-in's expectation under exact sampling); the interval is the guarantee."
        )
    if kl_negative:
        out.append(
            f"{BELOW_ZERO} KL below 0: Miller-Madow corrected (plug-in minus (m - 1)/(2n), m distinct tokens seen): "
            "indistinguishable from 0."
        )
    return out


@dataclass(frozen=True)
class StratumDivergence:
    """One stratum (``"block=i"`` or ``"abs=t"``): divergence from the target, and the declared law."""

    stratum: str
    estimate: DivergenceEstimate
    declared_tv: float | None = None


@dataclass(frozen=True)
class OverallTV:
    """Mean TV per emitted token over absolute positions 1..L, with a simultaneous interval.

    Each position's interval is computed at level ``1 - (1 - level)/L`` (Bonferroni), so
    with probability at least ``level`` all L hold at once and the mean of their bounds
    bounds the mean TV ``(1/L) sum_t TV_t``.
    """

    tv: float
    tv_lower: float
    tv_upper: float
    declared_tv: float | None
    positions: int
    level: float


@dataclass(frozen=True)
class MeasureResult:
    """Everything :func:`measure_divergence` measured; ``to_dict`` is its JSON form."""

    scenario: str
    k: int
    tier: str
    seed: int
    level: float
    by_block: tuple[StratumDivergence, ...]
    by_position: tuple[StratumDivergence, ...]
    acceptance_by_block: tuple[float, ...]
    mean_accepted: float
    tokens_per_pass: float  # mean num_emitted per row and verify call (one target pass)
    num_calls: int
    row_calls: int
    num_tokens: int
    seconds: float
    conformance: tuple[TestResult, ...] = ()
    conformance_verdict: str | None = None
    overall: OverallTV | None = None

    def to_dict(self) -> dict:
        return _jsonable(self)

    def summary(self) -> str:
        """A table: stratum, n, TV estimate, interval, declared TV, KL (and the coarse interval for large V)."""
        lines = [
            f"{self.scenario} (K={self.k}, tier={self.tier}, seed={self.seed}): "
            f"tokens per target pass {self.tokens_per_pass:.3f}, mean accepted {self.mean_accepted:.3f}",
            f"{'stratum':>9} {'n':>7} {'TV (bias-corr.)':>15} {f'{self.level:.0%} interval':>19} "
            f"{'declared TV':>11} {'KL':>8}",
        ]
        marks: set[str] = set()
        kl_negative = False
        for s in self.by_block + self.by_position:
            e = s.estimate
            mark = estimate_mark(e.tv, e.tv_lower)
            marks.add(mark)
            kl_mark = "*" if e.kl < 0 else ""
            kl_negative = kl_negative or bool(kl_mark)
            declared = "" if s.declared_tv is None else f"{s.declared_tv:.4f}"
            coarse = (
                ""
                if e.coarse is None
                else (
                    f"  top-{e.coarse.top}+rest TV {e.coarse.tv:.4f} [{e.coarse.tv_lower:.4f}, {e.coarse.tv_upper:.4f}]"
                )
            )
            lines.append(
                f"{s.stratum:>9} {e.n:>7} {e.tv:>14.4f}{mark or ' '} [{e.tv_lower:.4f}, {e.tv_upper:.4f}] "
                f"{declared:>11} {e.kl:>8.4f}{kl_mark or ' '}{coarse}".rstrip()
            )
        if self.overall is not None:
            o = self.overall
            declared = "" if o.declared_tv is None else f", declared {o.declared_tv:.4f}"
            mark = estimate_mark(o.tv, o.tv_lower)
            marks.add(mark)
            lines.append(
                f"mean TV per token over {o.positions} positions {o.tv:.4f}{mark} "
                f"[{o.tv_lower:.4f}, {o.tv_upper:.4f}] ({o.level:.0%} simultaneous){declared}"
            )
        if self.conformance_verdict is not None:
            lines.append(f"conformance to the declared law: {self.conformance_verdict}")
        lines += estimate_notes(marks, kl_negative=kl_negative)
        return "\n".join(lines)


def _first_per_row(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with a True in ``mask`` (R, L) and the column of their first one: (m,), (m,)."""
    has = mask.any(1)  # (R,)
    rows = has.nonzero().squeeze(1)  # (m,)
    cols = mask[rows].long().argmax(1)  # (m,) first True
    return rows, cols


def _stratum(
    name: str,
    run: HarnessRun,
    rows: torch.Tensor,
    cols: torch.Tensor,
    target: TableModel,
    drafter: TableModel,
    level: float,
    declared_law,
    conformance: list,
    scenario: str,
) -> StratumDivergence:
    tokens = run.tokens[rows, cols]  # (n,)
    tctx = run.target_contexts[rows, cols]  # (n,)
    dctx = run.draft_contexts[rows, cols]  # (n,) -1 at the bonus position
    pairs, ids = torch.unique(torch.stack([tctx, dctx], 1), dim=0, return_inverse=True)  # (C, 2), (n,)
    p_rows = target.table[pairs[:, 0]]  # (C, V) float64
    estimate = divergence(tokens.numpy(), p_rows.numpy(), contexts=ids.numpy(), level=level)
    declared_tv = None
    if declared_law is not None:
        bonus = pairs[:, 1] < 0  # (C,)
        law = torch.empty_like(p_rows)  # (C, V)
        if bool(bonus.any()):
            law[bonus] = torch.as_tensor(declared_law(p_rows[bonus], None), dtype=torch.float64)
        if bool((~bonus).any()):
            q_rows = drafter.table[pairs[~bonus, 1]]  # (C', V)
            law[~bonus] = torch.as_tensor(declared_law(p_rows[~bonus], q_rows), dtype=torch.float64)
        law = law / law.sum(-1, keepdim=True)
        weights = torch.bincount(ids, minlength=pairs.shape[0]).to(torch.float64)  # (C,) n_c
        tv_c = 0.5 * (law - p_rows).abs().sum(-1)  # (C,)
        declared_tv = float((weights * tv_c).sum() / weights.sum())
        counts = np.bincount(tokens.numpy(), minlength=target.vocab_size)  # (V,)
        expected = (weights[:, None] * law).sum(0).numpy()  # (V,) sum of per-sample declared laws
        conformance += gof_pair(counts, expected, scenario=scenario, position=name, name="declared_gof")
        conformance.append(support_test(counts, expected, scenario=scenario, position=name, name="declared_support"))
    return StratumDivergence(name, estimate, declared_tv)


def _overall(run: HarnessRun, rows: torch.Tensor, target: TableModel, level: float, by_position) -> OverallTV:
    """Mean per-position TV over absolute positions, intervals at the Bonferroni level (see :class:`OverallTV`)."""
    L = len(by_position)
    inner = 1.0 - (1.0 - level) / L
    bounds = []
    for t in range(L):
        tokens = run.tokens[rows, t]  # (R,)
        pairs, ids = torch.unique(
            torch.stack([run.target_contexts[rows, t], run.draft_contexts[rows, t]], 1), dim=0, return_inverse=True
        )  # (C, 2), (R,)
        e = divergence(tokens.numpy(), target.table[pairs[:, 0]].numpy(), contexts=ids.numpy(), level=inner)
        bounds.append((e.tv_lower, e.tv_upper))
    declared = [s.declared_tv for s in by_position]
    return OverallTV(
        tv=float(np.mean([s.estimate.tv for s in by_position])),
        tv_lower=float(np.mean([b[0] for b in bounds])),
        tv_upper=float(np.mean([b[1] for b in bounds])),
        declared_tv=None if any(d is None for d in declared) else float(np.mean(declared)),
        positions=L,
        level=level,
    )


def _setup(scenario, target, drafter, k, tier, batch_size, length):
    if scenario is not None and any(v is not None for v in (target, drafter, k)):
        raise InvalidArgument("give either scenario or (target, drafter, k), not both")
    if scenario is None and target is None:
        scenario = DEFAULT_SCENARIO
    if scenario is not None:
        if isinstance(scenario, str):
            scenario = get_scenarios([scenario])[0]
        if not isinstance(scenario, Scenario):
            raise InvalidArgument(f"scenario must be a Scenario or a scenario name, got {scenario!r}")
        target, drafter = scenario.build()
        return (
            scenario.name,
            target,
            drafter,
            scenario.k,
            batch_size or scenario.batch_size,
            length or scenario.length,
            scenario.num_groups(tier),
        )
    if not isinstance(target, TableModel) or not isinstance(drafter, TableModel):
        raise InvalidArgument(f"target and drafter must be TableModels, got {target!r} and {drafter!r}")
    k = check_int("k", k, minimum=1)
    scale = {"smoke": 1, "standard": 16, "deep": 512}[tier]
    return f"{target.name}/{drafter.name}/k{k}", target, drafter, k, batch_size or 4096, length or 2 * (k + 1), scale


def measure_divergence(
    verify,
    *,
    scenario=None,
    target: TableModel | None = None,
    drafter: TableModel | None = None,
    k: int | None = None,
    tier: str = "smoke",
    seed: int = 0,
    level: float = 0.95,
    declared_law: Callable | None = None,
    alpha: float = 1e-3,
    batch_size: int | None = None,
    length: int | None = None,
) -> MeasureResult:
    """Distance of ``verify``'s output from the target per position, with confidence intervals.

    Parameters
    ----------
    verify : callable
        Chain verifier protocol ``verify(target_probs, draft_probs, draft_tokens, *, generator)``.
    scenario : str or Scenario, optional
        A battery scenario (default :data:`DEFAULT_SCENARIO` when no target is given).
    target, drafter : TableModel, k : int, optional
        Instead of a scenario.
    tier : {"smoke", "standard", "deep"}
        Number of batches (the scenario's, or 1 / 16 / 512 batches of ``batch_size``).
    seed : int
        Sampling seed (combined with the scenario name as the battery does).
    level : float, default 0.95
        Level of every TV interval (per stratum; not simultaneous over strata).
    declared_law : callable, optional
        ``declared_law(target_rows (n, V), draft_rows (n, V) or None) -> (n, V)``; adds
        ``declared_tv`` per stratum and the graded conformance check.
    alpha : float, default 1e-3
        Family-wise error rate of the conformance check.
    batch_size, length : int, optional
        Override the rows per batch and the tokens per row.

    Returns
    -------
    MeasureResult

    Raises
    ------
    InvalidArgument
        Bad arguments.
    ImplementationError
        The verifier raised or violated its protocol.
    """
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
    seed = check_int("seed", seed, minimum=0)
    if declared_law is not None and not callable(declared_law):
        raise InvalidArgument(f"declared_law must be callable, got {declared_law!r}")
    name, target, drafter, K, B, L, groups = _setup(scenario, target, drafter, k, tier, batch_size, length)
    generator = torch.Generator().manual_seed(scenario_seed(seed, name))
    run = run_harness(verify, target, drafter, k=K, batch_size=B, length=L, generator=generator, num_groups=groups)
    row_calls = int((run.trial_positions == 1).sum())  # every (row, call) judges its first draft
    mean_accepted = float(run.trial_accepted.to(torch.float64).sum()) / max(row_calls, 1)
    return measure_run(
        run, target, drafter, name=name, tier=tier, seed=seed, level=level, declared_law=declared_law, alpha=alpha,
        mean_accepted=mean_accepted, row_calls=row_calls,
    )  # fmt: skip


def measure_run(
    run: HarnessRun,
    target: TableModel,
    drafter: TableModel,
    *,
    name: str,
    tier: str,
    seed: int,
    level: float,
    declared_law: Callable | None,
    alpha: float,
    mean_accepted: float,
    row_calls: int,
    stratum: str = "block",
) -> MeasureResult:
    """The :class:`MeasureResult` of a finished harness run (chain, or tree with ``stratum="depth"``).

    Strata ``"<stratum>=i"`` for every in-round position i (first token per row, see the
    module docstring) and ``"abs=t"`` for every absolute position; acceptance per in-round
    position from the run's trials; ``mean_accepted`` drafts per verifier row and
    ``row_calls`` (verifier rows) come from the caller, which knows how rounds are counted.
    """
    K = run.k
    conformance: list[TestResult] = []
    by_block = []
    for i in range(1, K + 2):
        rows, cols = _first_per_row(run.block_positions == i)
        if rows.numel() >= 2:
            args = (target, drafter, level, declared_law, conformance, name)
            by_block.append(_stratum(f"{stratum}={i}", run, rows, cols, *args))
    all_rows = torch.arange(run.tokens.shape[0])  # (R,)
    by_position = [
        _stratum(f"abs={t + 1}", run, all_rows, torch.full_like(all_rows, t), target, drafter, level,
                 declared_law, conformance, name)
        for t in range(run.length)
    ]  # fmt: skip
    overall = _overall(run, all_rows, target, level, by_position)
    accepted = run.trial_accepted.to(torch.float64)  # (T,)
    acceptance = tuple(
        float(accepted[run.trial_positions == i].mean()) if bool((run.trial_positions == i).any()) else float("nan")
        for i in range(1, K + 1)
    )
    graded, verdict = grade_run(conformance, [], alpha=alpha) if conformance else ((), None)
    return MeasureResult(
        scenario=name,
        k=K,
        tier=tier,
        seed=seed,
        level=level,
        by_block=tuple(by_block),
        by_position=tuple(by_position),
        acceptance_by_block=acceptance,
        mean_accepted=mean_accepted,
        tokens_per_pass=mean_accepted + 1.0,
        num_calls=run.num_calls,
        row_calls=row_calls,
        num_tokens=run.num_tokens,
        seconds=run.seconds,
        conformance=tuple(graded),
        conformance_verdict=verdict,
        overall=overall,
    )

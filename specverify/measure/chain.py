"""Measure how far a (lossy) chain verifier is from the target, per position, and what it buys.

:func:`measure_divergence` runs the chain harness (:func:`specverify.verifier.harness.run_harness`)
on table models -- a named scenario of :mod:`specverify.verifier.scenarios` or a given
``(target, drafter, k)`` -- and reports, per stratum, the estimates of
:func:`specverify.stats.divergence.divergence` against the exact target law: TV with a
confidence interval (the point estimate always inside it; a coarse interval for large V),
KL, the most over- and under-emitted tokens; plus the acceptance rate per in-block
position, mean accepted drafts and tokens per target pass (one verify call is one target
pass).

Strata.  Every distinct set of tokens is measured (and, with a declared law, tested) once:

* ``abs=t``, t = 0..L-1: the token at absolute position t of every row, labelled from 0
  as :func:`specverify.verifier.battery.analyse_run` labels its per-position tests
  (``by_position``);
* ``block=i``, i = 2..K+1: the first token of each row at in-block position i
  (``by_block``).  In-block position 1 is not a stratum of its own: every row opens a
  round at absolute position 0, so the first token of each row at in-block position 1 *is*
  its token at ``abs=0`` -- the same samples, reported and tested once, as ``abs=0``.
  (Only position 1 is dropped, and only when it is exactly ``abs=0``, so the in-block
  strata do not depend on the data: a later in-block stratum that happens to coincide with
  an absolute position, e.g. when every row accepts its first draft, is kept.)

Validity.  Rows are independent.  An absolute position holds one token per row.  For an
in-block position only the *first* token of each row at that position is used (a
stopping time of the row's own past), so each stratum holds at most one token per row
and, given the contexts, its tokens are independent -- what the confidence bounds need.
The lower bound's sample split is drawn from a ``torch.Generator`` seeded from the run's
seed, the scenario and the stratum (:func:`split_generator`), so it is independent of the
order of the rows.  The context of a token is the pair (target context, drafter context): a
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
from specverify.stats.divergence import DivergenceEstimate, clip_to_interval, divergence
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
    "declared_law_of",
    "split_generator",
    "DEFAULT_SCENARIO",
    "estimate_mark",
    "estimate_notes",
]

#: Scenario measured when neither a scenario nor (target, drafter, k) is given.
DEFAULT_SCENARIO = "pos8_uniform_k4"

#: Marks: a TV point estimate clipped to its interval (:func:`estimate_mark`), a KL estimate below 0.
CLIPPED, KL_BELOW_ZERO = "^", "*"


def estimate_mark(estimate) -> str:
    """``"^"`` for a TV point estimate clipped to its interval (``estimate.tv_clipped`` set), else ``""``.

    ``estimate`` is a :class:`~specverify.stats.divergence.DivergenceEstimate`, its ``coarse``
    part or an :class:`OverallTV`.  The estimate shown is always inside its interval
    (:func:`specverify.stats.divergence.clip_to_interval`); the mark says the unclipped
    bias-corrected value was not.
    """
    return CLIPPED if getattr(estimate, "tv_clipped", None) else ""


def estimate_notes(marks, *, kl_negative: bool = False) -> list[str]:
    """One line per kind of mark used (``marks``: the marks of :func:`estimate_mark` shown), and one for a
    negative KL: why an estimate was clipped, so that a reader trusts the interval."""
    out = []
    if CLIPPED in marks:
        out.append(
            f"{CLIPPED} TV clipped to its interval: the bias-corrected value (plug-in minus its expectation under "
            "exact sampling) fell below the lower bound -- it is centred on 0 when the TV is 0 and over-corrects "
            "under a lossy law -- so the nearest point of the interval is shown (the unclipped value is "
            "tv_bias_corrected in the JSON); the interval is the guarantee."
        )
    if kl_negative:
        out.append(
            f"{KL_BELOW_ZERO} KL below 0: Miller-Madow corrected (plug-in minus (m - 1)/(2n), m distinct tokens "
            "seen): indistinguishable from 0."
        )
    return out


def declared_law_of(verify, declared_law: Callable | None = None) -> Callable | None:
    """The declared law a measurement of ``verify`` checks conformance to.

    ``declared_law`` when given; otherwise the implementation's own ``declared_law``
    attribute (as the factories of ``reference.lossy`` and :mod:`specverify.adapters.medusa`
    provide), looked up on ``verify`` and, for a bound method such as ``obj.verify``, on
    its object; None when there is none.  :func:`measure_divergence`, :func:`specverify.measure.sweep.sweep`
    and ``specverify measure`` all use it.
    """
    if declared_law is not None:
        return declared_law
    for owner in (verify, getattr(verify, "__self__", None)):
        law = getattr(owner, "declared_law", None) if owner is not None else None
        if law is not None:
            return law
    return None


def split_generator(seed: int, scenario: str, stratum: str) -> torch.Generator:
    """The generator of a stratum's divergence sample split: deterministic in the run's seed, scenario and stratum."""
    return torch.Generator().manual_seed(scenario_seed(seed, f"{scenario}/divergence-split/{stratum}"))


@dataclass(frozen=True)
class StratumDivergence:
    """One stratum (``"block=i"``, i >= 2, or ``"abs=t"``, t >= 0): divergence from the target, and the declared law."""

    stratum: str
    estimate: DivergenceEstimate
    declared_tv: float | None = None


@dataclass(frozen=True)
class OverallTV:
    """Mean TV per emitted token over absolute positions 0..L-1, with a simultaneous interval.

    Each position's interval is computed at level ``1 - (1 - level)/L`` (Bonferroni), so
    with probability at least ``level`` all L hold at once and the mean of their bounds
    bounds the mean TV ``(1/L) sum_t TV_t``.  ``tv`` is the mean of the positions' point
    estimates (each inside its own, narrower, interval, drawn with the same split, so the
    mean is inside this one); ``tv_clipped`` says if it had to be clipped all the same.
    """

    tv: float
    tv_lower: float
    tv_upper: float
    declared_tv: float | None
    positions: int
    level: float
    tv_clipped: str | None


@dataclass(frozen=True)
class MeasureResult:
    """Everything :func:`measure_divergence` measured; ``to_dict`` is its JSON form.

    ``by_position`` holds the strata ``abs=t`` (t from 0), ``by_block`` the in-round strata
    from position 2 (in-block position 1 is ``abs=0``; see the module docstring);
    ``acceptance_by_block`` the acceptance rate at in-block positions 1..K.
    """

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
        """A table: stratum, n, TV estimate (inside its interval), interval, declared TV, KL (and the coarse interval)."""
        lines = [
            f"{self.scenario} (K={self.k}, tier={self.tier}, seed={self.seed}): "
            f"tokens per target pass {self.tokens_per_pass:.3f}, mean accepted {self.mean_accepted:.3f}",
            f"{'stratum':>9} {'n':>7} {'TV estimate':>15} {f'{self.level:.0%} interval':>19} "
            f"{'declared TV':>11} {'KL':>8}",
        ]
        marks: set[str] = set()
        kl_negative = False
        for s in self.by_block + self.by_position:
            e = s.estimate
            mark = estimate_mark(e)
            marks.add(mark)
            kl_mark = "*" if e.kl < 0 else ""
            kl_negative = kl_negative or bool(kl_mark)
            declared = "" if s.declared_tv is None else f"{s.declared_tv:.4f}"
            coarse = ""
            if e.coarse is not None:
                coarse_mark = estimate_mark(e.coarse)
                marks.add(coarse_mark)
                coarse = (
                    f"  top-{e.coarse.top}+rest TV {e.coarse.tv:.4f}{coarse_mark} "
                    f"[{e.coarse.tv_lower:.4f}, {e.coarse.tv_upper:.4f}]"
                )
            lines.append(
                f"{s.stratum:>9} {e.n:>7} {e.tv:>14.4f}{mark or ' '} [{e.tv_lower:.4f}, {e.tv_upper:.4f}] "
                f"{declared:>11} {e.kl:>8.4f}{kl_mark or ' '}{coarse}".rstrip()
            )
        if self.overall is not None:
            o = self.overall
            declared = "" if o.declared_tv is None else f", declared {o.declared_tv:.4f}"
            mark = estimate_mark(o)
            marks.add(mark)
            lines.append(
                f"mean TV per token over {o.positions} positions {o.tv:.4f}{mark} "
                f"[{o.tv_lower:.4f}, {o.tv_upper:.4f}] ({o.level:.0%} simultaneous){declared}"
            )
        if self.conformance_verdict is not None:
            lines.append(f"conformance to the declared law: {self.conformance_verdict}")
        lines += estimate_notes(marks, kl_negative=kl_negative)
        return "\n".join(lines)


def _is_column(rows: torch.Tensor, cols: torch.Tensor, num_rows: int, column: int) -> bool:
    """Whether (rows, cols) is every row at ``column``: the samples of the stratum ``abs=column``."""
    return rows.numel() == num_rows and bool((cols == column).all())


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
    seed: int,
) -> StratumDivergence:
    tokens = run.tokens[rows, cols]  # (n,)
    tctx = run.target_contexts[rows, cols]  # (n,)
    dctx = run.draft_contexts[rows, cols]  # (n,) -1 at the bonus position
    pairs, ids = torch.unique(torch.stack([tctx, dctx], 1), dim=0, return_inverse=True)  # (C, 2), (n,)
    p_rows = target.table[pairs[:, 0]]  # (C, V) float64
    estimate = divergence(
        tokens.numpy(),
        p_rows.numpy(),
        contexts=ids.numpy(),
        level=level,
        generator=split_generator(seed, scenario, name),
    )
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


def _overall(
    run: HarnessRun, rows: torch.Tensor, target: TableModel, level: float, by_position, *, seed: int, scenario: str
) -> OverallTV:
    """Mean per-position TV over absolute positions, intervals at the Bonferroni level (see :class:`OverallTV`).

    Each position's wider interval uses that position's split generator, so it contains the
    position's own interval (same split, smaller alpha) and so its point estimate.
    """
    L = len(by_position)
    inner = 1.0 - (1.0 - level) / L
    bounds = []
    for t, s in enumerate(by_position):
        tokens = run.tokens[rows, t]  # (R,)
        pairs, ids = torch.unique(
            torch.stack([run.target_contexts[rows, t], run.draft_contexts[rows, t]], 1), dim=0, return_inverse=True
        )  # (C, 2), (R,)
        e = divergence(
            tokens.numpy(), target.table[pairs[:, 0]].numpy(), contexts=ids.numpy(), level=inner,
            generator=split_generator(seed, scenario, s.stratum),
        )  # fmt: skip
        bounds.append((e.tv_lower, e.tv_upper))
    declared = [s.declared_tv for s in by_position]
    lower, upper = float(np.mean([b[0] for b in bounds])), float(np.mean([b[1] for b in bounds]))
    tv, clipped = clip_to_interval(float(np.mean([s.estimate.tv for s in by_position])), lower, upper)
    return OverallTV(
        tv=tv,
        tv_lower=lower,
        tv_upper=upper,
        declared_tv=None if any(d is None for d in declared) else float(np.mean(declared)),
        positions=L,
        level=level,
        tv_clipped=clipped,
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
        ``declared_tv`` per stratum and the graded conformance check.  Default: the
        implementation's own ``verify.declared_law`` when it has one
        (:func:`declared_law_of`, as ``specverify measure`` and :func:`~specverify.measure.sweep.sweep` do).
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
    declared_law = declared_law_of(verify, declared_law)
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

    Strata (each measured, and with ``declared_law`` tested, once): ``"abs=t"`` for every
    absolute position t = 0..L-1 (labelled from 0, as the verifier battery labels them) and
    ``"<stratum>=i"`` for every in-round position i >= 2 (first token per row, see the
    module docstring); in-round position 1 is ``abs=0`` (every row opens a round there) and
    is not measured a second time.  Acceptance per in-round position from the run's trials; ``mean_accepted``
    drafts per verifier row and ``row_calls`` (verifier rows) come from the caller, which
    knows how rounds are counted.  Each stratum's sample split is drawn from
    :func:`split_generator` ``(seed, name, stratum)``.
    """
    K = run.k
    R = run.tokens.shape[0]
    conformance: list[TestResult] = []
    args = (target, drafter, level, declared_law, conformance, name, seed)
    all_rows = torch.arange(R)  # (R,)
    by_position = [_stratum(f"abs={t}", run, all_rows, torch.full_like(all_rows, t), *args) for t in range(run.length)]
    by_block = []
    for i in range(1, K + 2):
        rows, cols = _first_per_row(run.block_positions == i)
        if rows.numel() >= 2 and not (i == 1 and _is_column(rows, cols, R, 0)):
            by_block.append(_stratum(f"{stratum}={i}", run, rows, cols, *args))
    overall = _overall(run, all_rows, target, level, by_position, seed=seed, scenario=name)
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

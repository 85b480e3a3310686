"""Anytime stopping across shards: merged e-processes that end a deep run once evidence is decisive.

With ``until_decisive=True`` a sharded battery feeds every finished shard, in plan order, to
one Dirichlet-mixture e-process per (scenario, absolute position)
(:class:`specverify.stats.eprocess.CategoricalEProcess`): under a correct implementation the
rows of a scenario are independent and the token at position t of every row follows the
exact marginal law of position t, so each e-process is a nonnegative supermartingale and
``P(sup_n E_n >= 1/a) <= a`` at any stopping time (Ville).  A share ``SHARE`` of the run's
alpha goes to these m e-processes (``alpha * SHARE / m`` each, Bonferroni); the run stops as
soon as one crosses its threshold -- a FAIL that holds at whatever sample size it came --
and otherwise runs to the end, where the fixed-sample battery is graded at
``alpha * (1 - SHARE)``.  The union bound keeps the whole run's false-alarm rate <= alpha.
The merged e-value of a scenario is that of its merged counts: the mixture depends on the
data only through the counts, so merging shards is adding counts.

Shapes: R rows of a group, L positions, V vocabulary.
"""

from __future__ import annotations

import math

import numpy as np

from specverify.core.results import TestResult
from specverify.shard.work import ShardOutput
from specverify.stats.eprocess import CategoricalEProcess

__all__ = ["AnytimeStop", "SHARE"]

#: Share of the run's alpha spent on the anytime e-processes.
SHARE = 0.1

METHOD = (
    "anytime: Dirichlet-mixture e-process of the tokens at this position against the exact marginal, "
    "fed shard by shard in plan order; p = 1 / max E (valid at any stopping time)"
)


class AnytimeStop:
    """A ``stop`` rule of :func:`specverify.shard.collect.collect_runs` (see the module docstring).

    Parameters
    ----------
    scenarios : sequence
        The battery's scenarios (each with ``name``, ``length`` and ``build()``).
    alpha : float
        The whole run's false-alarm rate; ``alpha * SHARE`` is spent here.
    tree : bool
        Outputs hold tree runs (their chain-shaped run is ``.run``).
    """

    def __init__(self, scenarios, *, alpha: float, tree: bool = False):
        self.tree = tree
        self.processes: dict[tuple[str, int], CategoricalEProcess] = {}
        self.vocab: dict[str, int] = {}
        for scenario in scenarios:
            target, _ = scenario.build()
            self.vocab[scenario.name] = target.vocab_size
            marginals = target.token_marginals(scenario.length).numpy()  # (L, V)
            for t in range(scenario.length):
                self.processes[(scenario.name, t)] = CategoricalEProcess(marginals[t])
        self.threshold = math.log(len(self.processes) / (alpha * SHARE))  # log(1 / (alpha SHARE / m))
        self.tokens = 0
        self.shards = 0
        self.decisive: tuple[str, int] | None = None

    def __call__(self, output: ShardOutput) -> bool:
        self.shards += 1
        for group in output.groups:
            if group.run is None:
                continue
            run = group.run.run if self.tree else group.run
            tokens = run.tokens.numpy()  # (R, L)
            self.tokens += tokens.size
            for t in range(tokens.shape[1]):
                process = self.processes[(group.scenario, t)]
                process.update(np.bincount(tokens[:, t], minlength=self.vocab[group.scenario]))
                if self.decisive is None and process.max_log_e >= self.threshold:
                    self.decisive = (group.scenario, t)
        return self.decisive is not None

    def results(self) -> list[TestResult]:
        """One result per e-process (family ``anytime``): statistic log E max, p-value ``min(1, 1/E max)``."""
        out = []
        for (scenario, t), process in self.processes.items():
            out.append(
                TestResult(
                    statistic=float(process.max_log_e),
                    pvalue=process.pvalue,
                    name="anytime_eprocess",
                    family="anytime",
                    method=METHOD,
                    n=int(process.n),
                    scenario=scenario,
                    position=f"abs={t}",
                )
            )
        return out

    def record(self, planned_tokens: int) -> dict:
        """What the report says about the stopping rule."""
        return {
            "share_of_alpha": SHARE,
            "eprocesses": len(self.processes),
            "threshold_log_e": self.threshold,
            "decisive": None if self.decisive is None else {"scenario": self.decisive[0], "position": self.decisive[1]},
            "shards_used": self.shards,
            "tokens_used": self.tokens,
            "tokens_planned": planned_tokens,
        }

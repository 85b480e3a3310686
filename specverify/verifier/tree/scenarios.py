"""The tree battery's scenarios: table models from the chain catalogue, grown into draft trees.

Each scenario takes its (target, drafter) table models from a chain scenario (so the
tables are the chain battery's, seeded from that name) and grows trees by a
:class:`~specverify.verifier.tree.drafting.TreeDrafting`.  Together they expose every
tree bug class of ``docs/bugs.md``:

==============================  =========================================================
bug class                       scenarios that expose it
==============================  =========================================================
residual not carried / zeroed   markov8_iid_2x2, markov8_wor_3x2 (stochastic siblings)
wor verified as i.i.d.          markov8_wor_3x2 (sharpened drafter: removing a drawn sibling moves q)
q from the wrong node           markov8_iid_2x2, markov4_deep_narrow_iid (context-dependent q)
duplicate siblings not skipped  markov8_topk_duplicates, markov8_any_2x2 (i.i.d. duplicates)
padding read as nodes           markov8_iid_padded, markov12_iid_overlap_6x1, ngram3_iid_ragged
children on p's zeros           pos32_disjoint_iid_wide (truncated target, disjoint drafter)
coin <= S accepts p = 0         pos32_disjoint_edge_coins (exact-zero coins, uniforms-in kernels)
greedy fallback, thresholds     every scenario (the output law is not the target's)
final sample always token 0     every scenario
dynamic shapes per row          markov8_dynamic_eagle2 (EAGLE-2 tree, padded per row), ngram3_iid_ragged
target-only rules               markov8_any_2x2 (no draft law handed in)
late residual updates           markov12_iid_overlap_6x1 (6 i.i.d. siblings from a drafter overlapping p)
one coin for two tests          markov12_iid_overlap_6x1, markov4_deep_narrow_iid (depth >= 2)
padding as a rejected sibling   ngram3_iid_ragged (pruned nodes leave padding in place)
first row's shape for all rows  ngram3_iid_ragged (every row's shape drawn anew each round)
==============================  =========================================================

Small effects: the i.i.d. scenarios with the temperature-2 drafter leave, after one rejection,
a residual that q covers, so residual-normalisation bugs there are nearly (or exactly)
lossless; ``markov12_iid_overlap_6x1`` is the scenario where a third and later sibling is
tested against a residual that matters.  The layouts of ``markov12_iid_overlap_6x1`` (random
padding) and ``ngram3_iid_ragged`` (pruned shapes) are drawn per row and per round.

Shapes: V vocabulary, N nodes, D depth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specverify.core.errors import InvalidArgument
from specverify.verifier import zoo
from specverify.verifier.scenarios import TIER_SCALE, TIERS, get_scenarios
from specverify.verifier.tree.drafting import TreeDrafting

__all__ = ["TREE_SCENARIOS", "TreeScenario", "get_tree_scenarios"]


@dataclass(frozen=True)
class TreeScenario:
    """One configuration of the tree battery.

    Attributes
    ----------
    name : str
    tables : str
        The chain scenario whose (target, drafter) table models are used.
    drafting : TreeDrafting
        How the trees are grown.
    batch_size, length, groups : int
        Rows per verifier batch, tokens kept per row, batches per tier unit.
    description : str
    drafter : tuple, optional
        ``(zoo name, ((option, value), ...))``: replace the chain scenario's drafter.
    edge_coins : bool
        Hand a uniforms-in kernel exact-zero coins on every fourth row; only the exact
        (support and protocol) tests are graded, as zero coins bias the law of a correct
        rule's output only on a null set that the statistics would otherwise weigh.  A plain
        protocol verifier (the reference's ``verify_tree`` too) skips it: it draws its own
        uniforms, where an exact 0 has probability 2**-53 per float64 draw and cannot be
        steered onto a test by a seed (``battery.SKIP_NOTE``).
    """

    name: str
    tables: str
    drafting: TreeDrafting
    batch_size: int = 2048
    length: int = 8
    groups: int = 1
    description: str = ""
    drafter: tuple | None = None
    edge_coins: bool = False

    def num_groups(self, tier: str) -> int:
        if tier not in TIERS:
            raise InvalidArgument(f"tier must be one of {TIERS}, got {tier!r}")
        return max(1, self.groups * TIER_SCALE[tier] // 2)

    def build(self):
        """``(target, drafter)`` table models (from the chain scenario ``tables``)."""
        (chain,) = get_scenarios([self.tables])
        target, drafter = chain.build()
        if self.drafter is not None:
            name, options = self.drafter
            drafter = zoo.make_drafter(name, target, **dict(options))
        return target, drafter

    def config(self, tier: str = "smoke") -> dict:
        data = asdict(self)
        data["drafting"] = {**asdict(self.drafting), "describe": self.drafting.describe()}
        data["num_nodes"] = self.drafting.num_nodes
        data["max_depth"] = self.drafting.max_depth
        data["num_groups"] = self.num_groups(tier)
        data["rows_total"] = self.batch_size * self.num_groups(tier)
        return data


T, D = TreeScenario, TreeDrafting
# fmt: off
TREE_SCENARIOS: tuple[TreeScenario, ...] = (
    T("markov8_iid_2x2", "markov8_temperature_k2", D("iid", (2, 2)),
      description="SpecInfer: 2 i.i.d. children per node, depth 2; context-dependent p and q"),
    T("markov8_wor_3x2", "markov8_temperature_k2", D("wor", (3, 2)), drafter=("temperature", (("tau", 0.3),)),
      description="RRSw: 3 then 2 children drawn without replacement from a sharpened (tau 0.3) drafter"),
    T("markov8_topk_3x2", "markov8_temperature_k2", D("topk", (3, 2)),
      description="EAGLE-2/3 static tree: the top-3 then top-2 tokens of q"),
    T("markov8_dynamic_eagle2", "markov8_temperature_k2", D("topk", dynamic=(4, 3, 3, 10)),
      description="EAGLE-2 dynamic tree: depth 4, top-3 expansions of the 3 best nodes, best 10 kept"),
    T("markov8_any_2x2", "markov8_temperature_k2", D("any", (2, 2)),
      description="target-only rules: arbitrary (i.i.d.-drawn) tree, no draft law handed in"),
    T("markov8_topk_duplicates", "markov8_temperature_k2", D("topk", (3, 1), duplicate=True),
      description="adversarial: the second child of every node repeats the first child's token"),
    T("markov8_iid_padded", "markov8_temperature_k2", D("iid", (2, 2), pad_every=2),
      description="adversarial: a padding node after every second node (ragged layout)"),
    T("pos32_disjoint_iid_wide", "pos32_topk_disjoint_k4", D("iid", (6,)),
      description="wide shallow: 6 i.i.d. children from a drafter whose mass sits on p's zeros"),
    T("pos32_adversary_wor_4", "pos32_adversary_k4", D("wor", (4,)),
      description="4 children without replacement from (1 - eps) p + eps on p's least likely token"),
    T("markov4_deep_narrow_iid", "markov4_oracle_k8", D("iid", (1, 1, 1, 1, 1)), length=10,
      drafter=("temperature", (("tau", 2.0),)),
      description="deep narrow: a chain of 5 single i.i.d. children from a flattened drafter"),
    T("pos32_disjoint_edge_coins", "pos32_topk_disjoint_k4", D("topk", (3,)), edge_coins=True,
      description="exact-zero coins on every fourth row, top-3 children on p's zeros: support only "
                  "(uniforms-in kernels)"),
    T("markov12_iid_overlap_6x1", "markov12_dirichlet_noisy_k4", D("iid", (6, 1), pad_random=2), batch_size=1024,
      drafter=("noisy", (("sigma", 2.0),)),
      description="6 i.i.d. children (one below each) from a full-support drafter overlapping p (noisy, sigma 2): "
                  "two and more rejections are common and the residual after them is not dominated by q; 2 padding "
                  "nodes at random places per row and round"),
    T("ngram3_iid_ragged", "ngram3_v6_stale_k4", D("iid", (3, 2), prune=0.3), batch_size=1024,
      drafter=("noisy", (("sigma", 2.0),)),
      description="ragged: a 3x2 i.i.d. tree whose nodes are pruned (padding in place) with probability 0.3 per "
                  "row and round, so rows of one round differ in shape; a trigram target's 43 contexts"),
    T("pos128256_hot_set_topk_3x2", "pos128256_lm_hot_set_k2", D("topk", (3, 2)), batch_size=32, length=3, groups=1,
      description="a real vocabulary: Llama 3's 128,256 ids with LM-shaped rows, an EAGLE-3 static tree (top-3, "
                  "then top-2 of q) over a 32,000-id draft vocabulary mapped into it; the mass outside it comes only "
                  "from residuals and bonus tokens"),
)
# fmt: on


def get_tree_scenarios(names=None, *, modes=None) -> tuple[TreeScenario, ...]:
    """The tree battery's scenarios, optionally only those named or only those of some modes."""
    pool = TREE_SCENARIOS
    if modes is not None:
        unknown = sorted(set(modes) - {"iid", "wor", "topk", "any"})
        if unknown:
            raise InvalidArgument(f"modes must be among ('iid', 'wor', 'topk', 'any'), got {unknown}")
        pool = tuple(s for s in pool if s.drafting.mode in modes)
    if names is None:
        return pool
    if isinstance(names, str):
        names = [names]
    known = {s.name: s for s in TREE_SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidArgument(f"scenarios {unknown} are not tree scenarios; known: {sorted(known)}")
    return tuple(known[n] for n in names)

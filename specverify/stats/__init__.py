"""Statistics core of specverify: exact goodness of fit, two-sample, directed,
acceptance and independence tests, power statements, the run's error budget and
anytime-valid e-processes.  Every test returns a :class:`specverify.core.results.TestResult`.

Modules: :mod:`.binning` (bins fixed from p and N), :mod:`.gof` (Cressie-Read GOF,
support), :mod:`.sparse` (the most extreme token; ``gof_pair`` runs both), :mod:`.twosample`, :mod:`.mmd` (the MMD peer, Hamming kernel), :mod:`.directed` (PIT, scores), :mod:`.counts` (acceptance, mass of a set chosen from the laws),
:mod:`.independence` (collisions), :mod:`.dependence` (pairs of rows against the product of their laws), :mod:`.power` (detectable TV), :mod:`.budget`
(weighted Holm, grades), :mod:`.eprocess`.  See docs/design.md.
"""

from ._common import cressie_read
from .binning import Bins, bin_counts, make_bins, p_order
from .budget import DEFAULT_FAMILY_WEIGHTS, UNKNOWN_FAMILY_WEIGHT, grade, grade_run, holm_adjust, run_verdict, verdict
from .counts import acceptance_test, set_mass_test
from .dependence import PAIR_LAGS, call_pairs, mid_distribution, midrank_pair_test, pair_dependence_test, pair_scores
from .directed import entropy_scores, pit_test, randomised_pit, ratio_scores, score_test
from .eprocess import DEFAULT_LOG10_C, CategoricalEProcess, sequential_gof
from .gof import gof_test, support_test
from .independence import collision_moments, collision_test
from .mmd import mmd_hamming, mmd_hamming_test
from .power import min_detectable_tv, noncentrality_needed, samples_needed
from .sparse import gof_pair, sparse_test
from .twosample import two_sample_test

__all__ = [
    "Bins",
    "make_bins",
    "bin_counts",
    "p_order",
    "gof_test",
    "support_test",
    "gof_pair",
    "sparse_test",
    "two_sample_test",
    "mmd_hamming",
    "mmd_hamming_test",
    "randomised_pit",
    "pit_test",
    "entropy_scores",
    "ratio_scores",
    "score_test",
    "acceptance_test",
    "set_mass_test",
    "collision_test",
    "collision_moments",
    "pair_dependence_test",
    "midrank_pair_test",
    "call_pairs",
    "PAIR_LAGS",
    "pair_scores",
    "mid_distribution",
    "min_detectable_tv",
    "samples_needed",
    "noncentrality_needed",
    "grade",
    "grade_run",
    "run_verdict",
    "verdict",
    "holm_adjust",
    "DEFAULT_FAMILY_WEIGHTS",
    "UNKNOWN_FAMILY_WEIGHT",
    "CategoricalEProcess",
    "sequential_gof",
    "DEFAULT_LOG10_C",
    "cressie_read",
]

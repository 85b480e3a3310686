"""``specverify selftest``: the suite tests itself -- mutation score, false alarms, calibration.

``run`` (``run_selftest``, ``main``: what runs, in order), ``entry_scenarios`` (the scenarios of each
entry), ``verifiers`` (chain verifier entries: verdict, killing test, samples needed),
``battery_runs`` (decoder, drafter and tree entries through their whole batteries),
``calibration``, ``peers`` (the engines' own tests re-implemented), ``lr_limit`` (the
likelihood-ratio sample limit), ``render`` (text, JSON and the Markdown matrix).
"""

from specverify.selftest.run import ALPHA, LR_ROWS, SelftestResult, main, run_selftest

__all__ = ["SelftestResult", "run_selftest", "main", "LR_ROWS", "ALPHA"]

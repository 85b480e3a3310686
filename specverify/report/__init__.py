"""Statistical correctness reports: one ``Report`` -> ``report.json``, ``report.md``, ``report.html``.

The JSON written by :meth:`specverify.core.results.Report.to_json` is the record; the
Markdown and the self-contained HTML (inline CSS, inline base64 PNG plots, no
JavaScript, no network) are renderings of it.  Rendering is deterministic: the
same report gives byte-identical files (no timestamps other than those already
inside the report; fixed figure sizes, DPI and matplotlib style).

Public API
----------
``write_report(report, out_dir, *, plots=True) -> dict[str, Path]``
    Writes the three files atomically (temporary file in ``out_dir`` + ``os.replace``);
    returns ``{"json": ..., "markdown": ..., "html": ...}``.
``render_markdown(report, *, max_rows=40) -> str``, ``render_html(report, *, plots=True) -> str``
``load_report(path) -> Report``
    Reads ``report.json`` (or a directory holding one). JSON only; never unpickles.

Every format states the verdict (the output law) and, on a line of its own, the rule
conformance (acceptance tests against the declared rule, graded under their own budget, with
the tokens per verify pass measured vs the declared rule's:
:mod:`specverify.core.conformance`); the JSON has it as ``"conformance"`` (derived from the
results, so a report read back gives the same line) and ``"gate_conformance"`` (whether it is
part of the verdict).

Plots need matplotlib (``pip install specverify[plots]``); it is imported lazily
inside the plotting code and drawn on an Agg canvas, never at import time of
specverify.  Without it the text reports are complete and the HTML says that
plots are unavailable.

Keys read from the report (all optional; absent or malformed -> the section is skipped)
---------------------------------------------------------------------------------------
``TestResult.details``
    ``"observed"``: list[float], observed count per bin (bins in the test's own order);
    ``"expected"``: list[float], expected count per bin (same length);
    ``"bin_tokens"``: list[list[int] | int], the token ids pooled in each bin (same length);
    ``"tokens"``: list[int], emitted tokens that have target probability 0 (support failures);
    ``"seed"``: int, a per-test seed, if the test drew its own randomness.
``Report.scenarios`` (one dict per scenario; matched to results by ``"name"`` == ``TestResult.scenario``)
    ``"name"``: str; ``"vocab_size"``: int (V); ``"k"``: int (draft length K);
    ``"n"``: int (samples drawn); any key whose name ends in ``"seed"`` (int; listed under
    *Seeds*); ``"description"``: str; ``"target_probs_preview"`` / ``"draft_probs_preview"``:
    list[float] of shape (V,) or list[list[float]] of shape (K+1, V) / (K, V): the exact
    target and draft laws of a small scenario, shown in a failure's counterexample.
    Every other key is shown verbatim in the configuration table.
``Report.extra``
    ``"acceptance"``: ``{scenario_name: entry}`` where ``entry`` is either a list of
    per-position records ``{"position": int (1-based draft position), "observed_rate": float,
    "expected_rate": float (the exact sum_x min(p, q)), "n": int (drafts that reached that
    position)}`` or a dict ``{"positions": [records as above], "length_counts": list[int]
    (K+1 entries: blocks that accepted 0..K drafts), "length_probs": list[float] (K+1 entries:
    the exact law of the number of accepted drafts)}`` (each key optional).
    ``"target"``: str, the target's name (drafter audits; shown under "Other sections").
    ``"diagnosis"`` (drafter audits): ``{"culprit": "drafter" | "verifier" | "protocol" | None,
    "message": str (one sentence), "failed_tests": list[str]}``; shown right after the verdict
    paragraph, the failing tests listed unless the message names them all.
    ``"efficiency"`` (drafter audits, :mod:`specverify.drafter.acceptance`), shown in its
    own section (:mod:`specverify.report.drafter`): ``"k"``: int (audited K); ``"ci_level"``:
    float; ``"rounds"``, ``"tokens_generated"``, ``"tokens_kept"``: int; ``"positions"``: list of
    ``{"position", "drafted", "accepted", "observed_rate", "ci_low", "ci_high", "expected_rate"}``;
    ``"mean_accepted"``: float, ``"mean_accepted_ci"``: [low, high], ``"expected_mean_accepted"``;
    ``"tokens_per_target_pass"``, ``"expected_tokens_per_target_pass"``,
    ``"target_passes_per_token"``, ``"target_passes_per_kept_token"``: float; ``"model_note"``:
    str; ``"speedup"``: list of ``{"draft_cost": c, "best_k": int, "best_speedup",
    "speedup_at_audited_k", "speedups": list[float] (index i is K = i + 1),
    "seconds_per_token_at_best_k", "seconds_per_token_at_audited_k"}``; ``"latency"``:
    ``{"model_params", "bytes_per_param", "bandwidth_bytes_per_s", "target_pass_seconds",
    "note"}``.  Missing or malformed parts skip their row or table; a ``"diagnosis"`` or
    ``"efficiency"`` with nothing that can be shown stays among the other keys.
    Other keys are shown as JSON.

Minimal counterexample (failures)
---------------------------------
One ordering of the tests, :func:`specverify.core.results.rank_key`, decides which failure
comes first everywhere: in the terminal summary, in the verdict paragraph, at the top of the
test table and in the counterexample.  It is by grade (fail, suspicious, pass), then adjusted
p ascending, then effect size descending -- the observed TV the test saw
(:func:`specverify.core.results.effect_size`: binned TV from per-bin counts, the acceptance
rate difference, or a single count's frequency difference; tests without one after those
with one) -- then raw p and the test's names.  The counterexample of that first failure
shows its scenario's configuration, the target/draft law previews and the observed vs
expected counts per bin, largest standardised residual first.

``"bin_tokens"`` may also be a mapping ``{bin index (int or str): token ids}`` holding only
the small bins (as :func:`specverify.stats.gof.binned_details` records it); bins missing
from it are labelled by their number and size (``tokens_per_bin``).
"""

from __future__ import annotations

from specverify.report.html import render_html
from specverify.report.io import load_report, write_report
from specverify.report.markdown import render_markdown
from specverify.report.terminal import terminal_summary

__all__ = ["write_report", "render_markdown", "render_html", "load_report", "terminal_summary"]

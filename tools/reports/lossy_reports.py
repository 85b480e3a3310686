"""Regenerate the lossy-rule audits of ``reports/lossy/``.

::

    python -m tools.reports.lossy_reports NAME [NAME ...]     # or: all, or readme

Names (each writes ``reports/lossy/NAME/``):

* ``reference-ensemble`` -- ``specverify measure --sweep`` of ``reference.lossy:ensemble`` (the
  method's own control: the reference rule against its exact law);
* ``hf-ensemble-kernel`` -- transformers' ``_speculative_sampling`` with
  ``assistant_ensemble_weight`` 0.1 .. 0.9 through
  ``specverify.adapters.hf.kernel.SpeculativeSamplingVerifier``, and the lossless 1.0 control:
  the adapter accepts only weights in (0, 1), so 1.0 is the kernel called *without* the
  argument (what transformers does when the weight is unset), measured against ``p``;
* ``hf-ensemble-generate`` -- ``model.generate(assistant_model=..., assistant_ensemble_weight=w)``
  on the tiny seeded Llama pair (``specverify.adapters.hf:tiny_assisted_decoder``), positions
  1..K of the output against the declared law ``w p + (1 - w) q`` (teacher-forced exact p, q);
* ``medusa-threshold``, ``medusa-alpha`` -- ``specverify measure --sweep`` of Medusa's
  ``evaluate_posterior`` (``specverify.adapters.medusa:typical_verifier``) over
  ``posterior_threshold`` and ``posterior_alpha``;
* ``medusa-greedy`` -- the same with ``medusa-llm`` 0.1's greedy next token, on a
  context-dependent target;
* ``medusa-tree`` -- Medusa's tree path (``specverify.adapters.medusa.tree.MedusaTreeVerifier``:
  several candidate paths, longest accepted prefix, ties by likelihood) swept over
  ``(posterior_threshold, posterior_alpha)`` on the tree scenarios ``markov8_topk_3x2``
  (``medusa-tree/``) and ``markov8_dynamic_eagle2`` (``medusa-tree-dynamic/``), with every
  round's output compared with ``reference.lossy.typical_tree_verify`` on the same inputs and
  coins (``exactness.json``), and the chain path on the same tables (``markov8_temperature_k2``,
  K = 2, ``medusa-tree-chain/``) for the comparison.

Seeds are fixed; the same code gives the same files.  Needs the ``hf`` extra and
``pip install --no-deps medusa-llm==0.1`` (the README's install line).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

#: Where the reports go: the repository's reports/lossy.
OUT = Path(__file__).resolve().parents[2] / "reports" / "lossy"
LEVEL = 0.95
SCENARIO = "pos8_uniform_k4"
WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
GENERATE_WEIGHTS = (0.5, 0.9)
GENERATE_SAMPLES = 20000

CLI = {
    "reference-ensemble": [
        "--verifier", "reference.lossy:ensemble", "--scenario", SCENARIO, "--sweep",
        "weight=" + ",".join(f"{w:g}" for w in WEIGHTS),
    ],
    "medusa-threshold": [
        "--verifier", "specverify.adapters.medusa:typical_verifier", "--scenario", SCENARIO,
        "--verifier-option", "posterior_alpha=0.3", "--sweep", "posterior_threshold=0.01,0.03,0.05,0.07,0.09,0.12,0.2,0.5",
    ],
    "medusa-alpha": [
        "--verifier", "specverify.adapters.medusa:typical_verifier", "--scenario", SCENARIO,
        "--verifier-option", "posterior_threshold=0.09", "--sweep", "posterior_alpha=0.05,0.1,0.2,0.3,0.5,0.7,1.0",
    ],
    "medusa-greedy": [
        "--verifier", "specverify.adapters.medusa:typical_verifier", "--scenario", "markov12_dirichlet_noisy_k4",
        "--verifier-option", "next_token=greedy", "--sweep", "posterior_threshold=0.03,0.09,0.3",
    ],
}  # fmt: skip


#: (posterior_threshold, posterior_alpha) of the tree sweeps: the threshold at alpha 0.3 and the alpha at
#: threshold 0.09 (the chain reports' grids); with alpha <= 1 the target's argmax always passes (p_max >=
#: exp(-H), up to Medusa's 1e-5 entropy offset), so with alpha 10 the threshold is epsilon itself; epsilon
#: above a reached row's p_max leaves the typical next token nothing to draw from (Medusa's
#: get_typical_one_token then samples from NaNs), hence epsilon <= 0.3.
MEDUSA_TREE_VALUES = (
    (0.01, 0.3),
    (0.03, 0.3),
    (0.09, 0.3),
    (0.2, 0.3),
    (0.09, 0.05),
    (0.09, 1.0),
    (0.2, 1.0),
    (0.2, 10.0),
    (0.3, 10.0),
)
MEDUSA_TREE = {
    "medusa-tree": ("tree", "markov8_topk_3x2"),
    "medusa-tree-dynamic": ("tree", "markov8_dynamic_eagle2"),
    "medusa-tree-chain": ("chain", "markov8_temperature_k2"),
}
MEDUSA_TREE_KNOB = "(posterior_threshold, posterior_alpha)"


def run_cli(name: str) -> int:
    from specverify.cli.commands import main

    argv = ["measure", *CLI[name], "--tier", "smoke", "--seed", "0", "--level", f"{LEVEL:g}"]
    return main([*argv, "--out", os.path.relpath(OUT / name)])


def hf_ensemble_kernel() -> int:
    from specverify_reference.lossy import ensemble_declared_law
    from specverify.adapters.hf.kernel import SpeculativeSamplingVerifier
    from specverify.report.sweep import write_sweep
    from specverify.measure.sweep import sweep

    def make_verify(weight):
        return SpeculativeSamplingVerifier(assistant_ensemble_weight=None if weight == 1.0 else weight).verify

    result = sweep(
        make_verify,
        WEIGHTS,
        scenario=SCENARIO,
        seed=0,
        level=LEVEL,
        declared_law=lambda w: functools.partial(ensemble_declared_law, weight=w),
        knob="assistant_ensemble_weight",
        subject="transformers _speculative_sampling (specverify.adapters.hf.kernel, float32 logits; 1.0 = unset)",
        command="python -m tools.reports.lossy_reports hf-ensemble-kernel",
        progress=print,
    )
    print(result.summary())
    write_sweep(result, OUT / "hf-ensemble-kernel")
    return 1 if "fail" in result.verdicts else 0


def hf_ensemble_generate() -> int:
    import torch

    from specverify_reference.lossy import ensemble_declared_law
    from specverify.adapters.hf import HFTarget, tiny_assisted_decoder
    from specverify.measure.decoder import measure_decoder_divergence
    from specverify.core.files import atomic_write_text

    out = OUT / "hf-ensemble-generate"
    out.mkdir(parents=True, exist_ok=True)
    prompt = torch.tensor([1, 2, 3])
    status, results, texts = 0, [], []
    for w in GENERATE_WEIGHTS:
        decoder = tiny_assisted_decoder(k=4, assistant_ensemble_weight=w, seed=0)
        target = decoder.target()
        o = decoder.options
        draft = HFTarget(decoder.assistant, temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"],
                         min_p=o["min_p"], suppress_tokens=o["suppress_tokens"], num_threads=1)  # fmt: skip
        result = measure_decoder_divergence(
            decoder,
            target,
            draft=draft,
            prompt=prompt,
            num_samples=GENERATE_SAMPLES,
            max_new_tokens=decoder.k + 1,
            positions=range(1, decoder.k + 1),
            seed=0,
            level=LEVEL,
            declared_law=functools.partial(ensemble_declared_law, weight=w),
            name=f"tiny_assisted_decoder(k=4, assistant_ensemble_weight={w:g}, seed=0)",
        )
        status |= result.conformance_verdict == "fail"
        results.append(result.to_dict())
        texts.append(f"## assistant_ensemble_weight = {w:g}\n\n```\n{result.summary()}\n```\n")
        print(result.summary())
    atomic_write_text(out / "measure.json", json.dumps(results, indent=1) + "\n")
    head = (
        "# HF assisted generation with `assistant_ensemble_weight`, through `generate`\n\n"
        f"`model.generate(assistant_model=..., do_sample=True, assistant_ensemble_weight=w)` on the tiny seeded "
        f"Llama pair (V=32, K=4, prompt [1, 2, 3]), {GENERATE_SAMPLES} independent samples per weight. Positions "
        "1..K of the output are draft positions of some round whatever was accepted before (with "
        "`max_new_tokens = K + 1`: transformers caps a round's drafts at the tokens left minus one, so the last "
        "position can be a capped round's bonus, drawn from p -- it is not measured), so the declared law "
        "there is `w p + (1 - w) q` at the generated prefix (p, q: the target's and assistant's exact processed "
        "conditionals, teacher-forced). Intervals are per position at 95%; the contexts of position t are the "
        "distinct prefixes, so past t = 2 nearly every sample has its own context and only the lower bound and "
        "the conformance test (GOF against the sum of per-sample declared laws) are informative. Rounds are not "
        "observable from the output: no tokens per pass here (see `hf-ensemble-kernel`).\n\n"
        "Regenerate: `python -m tools.reports.lossy_reports hf-ensemble-generate`\n\n"
    )
    atomic_write_text(out / "measure.md", head + "\n".join(texts))
    return int(status)


class ExactnessTally:
    """Every round of a tree verifier compared with ``reference.lossy.typical_tree_verify`` on its inputs and coins."""

    def __init__(self):
        self.rows = self.ambiguous = self.mismatched = self.mismatched_unambiguous = 0

    def wrap(self, adapter):
        import torch

        from specverify_reference.lossy import typical_tree_verify, typical_tree_walk

        def verify_tree(target_probs, draft_probs, tokens, parents, *, mode, generator):
            state = generator.get_state()
            out = adapter.verify_tree(target_probs, draft_probs, tokens, parents, mode=mode, generator=generator)
            twin = torch.Generator(device=generator.device)
            twin.set_state(state)
            options = dict(eps=adapter.posterior_threshold, delta=adapter.posterior_alpha, entropy_offset=1e-5)
            walk = typical_tree_walk(target_probs.cpu(), tokens.cpu(), parents.cpu(), **options)  # one walk a round
            ref = typical_tree_verify(target_probs, draft_probs, tokens, parents, mode=mode, generator=twin,
                                      next_token=adapter.next_token, walk=walk, **options)  # fmt: skip
            ambiguous = walk[3].to(out[1].device)
            width = torch.arange(out[0].shape[1], device=out[0].device)[None] < out[1][:, None]  # (B, D+1)
            same = (out[1] == ref[1]) & (out[2] == ref[2]).all(-1) & ((out[0] == ref[0]) | ~width).all(-1)
            self.rows += int(same.numel())
            self.ambiguous += int(ambiguous.sum())
            self.mismatched += int((~same).sum())
            self.mismatched_unambiguous += int((~same & ~ambiguous).sum())
            return out

        verify_tree.__name__ = repr(adapter)
        return verify_tree

    def to_dict(self) -> dict:
        return dict(rows=self.rows, ambiguous=self.ambiguous, mismatched=self.mismatched,
                    mismatched_unambiguous=self.mismatched_unambiguous)  # fmt: skip


def medusa_tree(names=tuple(MEDUSA_TREE)) -> int:
    """The Medusa tree-path sweeps (and the chain path on the same tables); exactness against the reference."""
    from specverify.adapters.medusa import MedusaTypicalVerifier
    from specverify.adapters.medusa.tree import MedusaTreeVerifier
    from specverify.core.files import atomic_write_text
    from specverify.report.sweep import write_sweep
    from specverify.measure.sweep import sweep

    status = 0
    for name in names:
        kind, scenario = MEDUSA_TREE[name]
        tallies: dict = {}

        def make_verify(value, kind=kind, tallies=tallies):
            threshold, alpha = value
            if kind == "chain":
                return MedusaTypicalVerifier(posterior_threshold=threshold, posterior_alpha=alpha)
            tallies[value] = ExactnessTally()
            return tallies[value].wrap(MedusaTreeVerifier(posterior_threshold=threshold, posterior_alpha=alpha))

        path = (
            "chain adapter `MedusaTypicalVerifier` (one path)"
            if kind == "chain"
            else "tree adapter `MedusaTreeVerifier`"
        )
        result = sweep(
            make_verify, MEDUSA_TREE_VALUES, scenario=scenario, seed=0, level=LEVEL, knob=MEDUSA_TREE_KNOB,
            subject=f"medusa-llm evaluate_posterior, {path}, typical next token", kind=kind,
            command=f"python -m tools.reports.lossy_reports {name}", progress=print,
        )  # fmt: skip
        print(result.summary())
        write_sweep(result, OUT / name)
        if kind == "tree":
            rows = [dict(value=list(v), **t.to_dict()) for v, t in tallies.items()]
            atomic_write_text(OUT / name / "exactness.json", json.dumps(rows, indent=1) + "\n")
            status |= any(r["mismatched_unambiguous"] for r in rows)
        else:
            status |= "fail" in result.verdicts
    return int(status)


WHAT = {
    "reference-ensemble": "`reference.lossy:ensemble` (the method's control: reference rule vs its own exact law)",
    "hf-ensemble-kernel": (
        "transformers `_speculative_sampling`, `assistant_ensemble_weight` (kernel adapter, chain harness; "
        "1 = the argument unset, the lossless control)"
    ),
    "hf-ensemble-generate": "transformers `generate(assistant_model=..., assistant_ensemble_weight=w)`, tiny Llama pair",
    "medusa-threshold": "medusa-llm `evaluate_posterior`, `posterior_threshold` (alpha 0.3), typical next token",
    "medusa-alpha": "medusa-llm `evaluate_posterior`, `posterior_alpha` (threshold 0.09), typical next token",
    "medusa-greedy": "medusa-llm `evaluate_posterior`, greedy next token (medusa-llm 0.1), Markov target",
    "medusa-tree": "medusa-llm `evaluate_posterior` on a tree (tree adapter): EAGLE's static top-3 x top-2 tree",
    "medusa-tree-dynamic": "medusa-llm `evaluate_posterior` on a tree: EAGLE-2 dynamic tree (depth 4, 10 nodes)",
    "medusa-tree-chain": "medusa-llm `evaluate_posterior`, chain path on the tree sweeps' tables (K = 2, for comparison)",
}
SUBJECTS = {
    "HF transformers `assistant_ensemble_weight`": ("hf-ensemble-kernel", "hf-ensemble-generate"),
    "Medusa typical acceptance (`medusa-llm`)": (
        "medusa-threshold",
        "medusa-alpha",
        "medusa-greedy",
        "medusa-tree-chain",
    ),
}


def _load(name: str):
    """(values, verdicts, widest declared-TV miss, command) of a written report, or None."""
    sweep_path, measure_path = OUT / name / "sweep.json", OUT / name / "measure.json"
    if sweep_path.is_file():
        data = json.loads(sweep_path.read_text())
        measures = [p["measure"] for p in data["points"]]
        values = [p["label"] for p in data["points"]]
        command = data.get("command") or ""
    elif measure_path.is_file():
        measures = json.loads(measure_path.read_text())
        values = [m["scenario"].split("assistant_ensemble_weight=")[-1].split(",")[0] for m in measures]
        command = f"python -m tools.reports.lossy_reports {name}"
    else:
        return None
    verdicts = [m["conformance_verdict"] for m in measures]
    outside = sum(
        not (s["estimate"]["tv_lower"] <= s["declared_tv"] <= s["estimate"]["tv_upper"])
        for m in measures
        for s in m["by_block"] + m["by_position"]
        if s["declared_tv"] is not None
    )
    strata = sum(len(m["by_block"]) + len(m["by_position"]) for m in measures)
    return values, verdicts, outside, strata, command


def _exactness_text(rows: list[dict]) -> str:
    total = sum(r["rows"] for r in rows)
    bad = sum(r["mismatched_unambiguous"] for r in rows)
    ambiguous = sum(r["ambiguous"] for r in rows)
    word = "agree" if bad == 0 else "**disagree**"
    return (
        f"no declared law; walk vs `reference.lossy.typical_tree_verify`: {word} ({bad} of {total} rounds differ, "
        f"{ambiguous} ambiguous)"
    )


def _tree_vs_chain() -> list[str]:
    """The README's tree-vs-chain table at the same (threshold, alpha), from the written medusa-tree* sweeps."""
    loaded = {}
    for name in MEDUSA_TREE:
        path = OUT / name / "sweep.json"
        if path.is_file():
            data = json.loads(path.read_text())
            loaded[name] = {p["label"]: p for p in data["points"]}
    if len(loaded) < 2:
        return []

    def cell(point) -> str:
        o = point["measure"]["overall"]
        return f"{o['tv']:.3f} [{o['tv_lower']:.3f}, {o['tv_upper']:.3f}] / {point['tokens_per_pass']:.2f}"

    def depth1(point) -> str:  # in-round position 1 is absolute position 0: every row opens a round there
        strata = {s["stratum"]: s["estimate"] for s in point["measure"]["by_position"]}
        e = strata.get("abs=0")
        return "" if e is None else f"[{e['tv_lower']:.3f}, {e['tv_upper']:.3f}]"

    names = [n for n in MEDUSA_TREE if n in loaded]
    labels = list(next(iter(loaded.values())))
    head = " | ".join(f"{n}: mean TV/token [95%] / tokens per pass | {n}: TV at abs=0 (depth 1)" for n in names)
    lines = [
        "## Medusa: tree path vs chain path at the same (threshold, alpha)",
        "",
        "Same target and drafter tables (`markov8_temperature_k2`, V = 8): the chain path is one sampled draft of "
        "K = 2 tokens (`medusa-tree-chain`), the tree paths are EAGLE's static top-3 x top-2 tree "
        "(`medusa-tree`, depth 2, 9 nodes) and an EAGLE-2 dynamic tree (`medusa-tree-dynamic`, depth 4, 10 "
        "nodes). Tokens per target pass = mean accepted depth + 1 (chain: mean accepted + 1).",
        "",
        f"| (threshold, alpha) | {head} |",
        "|---|" + "---|---|" * len(names),
    ]
    for label in labels:
        cells = " | ".join(
            f"{cell(loaded[n][label])} | {depth1(loaded[n][label])}" if label in loaded[n] else " | " for n in names
        )
        lines.append(f"| {label} | {cells} |")
    return [*lines, "", *_tree_vs_chain_words(loaded), ""]


def _tree_vs_chain_words(loaded) -> list[str]:
    if "medusa-tree" not in loaded or "medusa-tree-chain" not in loaded:
        return []
    tree, chain = loaded["medusa-tree"], loaded["medusa-tree-chain"]
    common = [label for label in tree if label in chain]
    more_tokens = sum(tree[k]["tokens_per_pass"] > chain[k]["tokens_per_pass"] for k in common)
    tv_tree = [tree[k]["measure"]["overall"]["tv"] for k in common]
    tv_chain = [chain[k]["measure"]["overall"]["tv"] for k in common]
    higher_tv = sum(a > b for a, b in zip(tv_tree, tv_chain))
    disjoint_above = sum(
        tree[k]["measure"]["overall"]["tv_lower"] > chain[k]["measure"]["overall"]["tv_upper"] for k in common
    )
    return [
        f"At the same (threshold, alpha) the static tree emits more tokens per target pass than the chain at "
        f"{more_tokens} of {len(common)} settings, and its mean TV per token is higher at {higher_tv} of "
        f"{len(common)} ({disjoint_above} with disjoint intervals, the tree's above). On a tree of deterministic "
        f"(top-k) candidates the walk is a deterministic function of the context: the deepest accepted path, "
        f"ties by likelihood, so the drafted tokens a round emits are close to greedy whatever the knob (TV at "
        f"abs=0, the first depth, does not move with it); the knob acts only through which paths pass and the truncated final "
        f"token. A chain of one sampled draft emits its draft token only when it passes, so its output stays "
        f"closer to the target.",
    ]


def write_readme() -> None:
    """``reports/lossy/README.md`` from the written reports (never by hand)."""
    from specverify.core.files import atomic_write_text

    rows, found = [], {}
    for name in WHAT:
        loaded = _load(name)
        if loaded is None:
            continue
        values, verdicts, outside, strata, command = loaded
        found[name] = verdicts
        link = f"[{name}]({name}/{'sweep' if (OUT / name / 'sweep.md').is_file() else 'measure'}.md)"
        tally = ", ".join(f"{verdicts.count(v)} {v}" for v in ("pass", "suspicious", "fail") if verdicts.count(v))
        exactness = OUT / name / "exactness.json"
        if exactness.is_file():
            tally = _exactness_text(json.loads(exactness.read_text()))
        rows.append(f"| {link} | {WHAT[name]} | {', '.join(values)} | {tally} | {outside} of {strata} | `{command}` |")
    lines = [
        "# Lossy rules in real code: how far from the target, and is it the documented law?",
        "",
        "Generated by `python -m tools.reports.lossy_reports all` (run from the repository root; one report: "
        "`python -m tools.reports.lossy_reports NAME`); do not edit by hand. Each directory holds the trade-off "
        "`sweep.json` / `sweep.md` / `sweep.html` (plot: mean TV per token with its band vs tokens per target "
        "pass and the memory-bound speedup) or, for `generate`, `measure.json` / `measure.md`.",
        "",
        "Verdict per value: the samples graded against the rule's *declared* law (exact, from `reference.lossy` "
        "or the adapter) with the GOF battery under one error budget (alpha 1e-3): pass = lossy as documented; "
        "fail = lossy and also buggy (or mis-documented). `declared TV outside` counts strata whose 95% TV "
        "interval misses the declared law's exact TV (about 5% expected by chance; not a test).",
        "",
        "| report | what | knob values | conformance to the declared law | declared TV outside its interval | command |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        *_tree_vs_chain(),
        "## Verdicts",
        "",
    ]
    for subject, names in SUBJECTS.items():
        verdicts = [v for n in names for v in found.get(n, [])]
        if not verdicts:
            lines.append(f"- {subject}: not measured.")
            continue
        word = "**lossy and also buggy**" if "fail" in verdicts else "**lossy as documented**"
        lines.append(
            f"- {subject}: {word} -- {len(verdicts)} configurations, "
            f"{verdicts.count('fail')} fail conformance to the declared law ({', '.join(n for n in names if n in found)})."
        )
    lines += [
        "",
        "## Notes",
        "",
        "- `generate` caps a round's drafts at the tokens left minus one, so the last token of a `generate` call "
        "can be a capped round's bonus, drawn from p rather than `w p + (1 - w) q`; measured there against the "
        "ensemble law it fails conformance (p < 1e-12 at w = 0.5 and 0.9 with `max_new_tokens = K`). The report "
        "therefore generates K + 1 tokens and measures positions 1..K. Not a bug; a caveat of the documented law.",
        "- The Medusa chain audits drive `evaluate_posterior` of `medusa-llm` 0.1 (PyPI) on a one-path tree (a chain "
        "of candidates); the `medusa-tree*` audits drive it on whole trees (`specverify.adapters.medusa.tree`: the "
        "protocol's parent arrays laid out as Medusa's `retrieve_indices` / cartesian candidates), which exercises "
        "choosing among several paths (longest accepted prefix, ties by likelihood). The token after the accepted "
        "prefix is the adapter's (`typical`: the truncated draw of later Medusa sources' `get_typical_one_token`; "
        "`greedy`: medusa-llm 0.1's argmax).",
        "- A tree rule's declared law depends on the whole drafted tree, so the tree sweeps carry no conformance "
        "verdict; instead every round is compared with `reference.lossy.typical_tree_verify` (an independent "
        "float64 implementation of the walk: deepest reached node, ties by `sum log p`, then the first path) on "
        "the same inputs and coins: the walk must agree exactly and the final token is then the same draw from the "
        "same truncated law (`exactness.json`; rows with a decision within 1e-5 relative of its boundary are "
        "counted as ambiguous). All agree: on the tree path the rule is **lossy as documented**.",
        "- Medusa's own sparse trees (FasterDecoding/Medusa after `medusa-llm` 0.1) pad short paths in "
        "`retrieve_indices` with -1 and the candidates with token 0, so after a short path's leaf Medusa judges "
        "token 0 under the leaf's law and may accept it, emitting a token that is not in the tree (then reading "
        "the last tree slot's logits). With `padding='medusa'` the adapter reproduces that layout and raises when "
        "it happens: on `markov8_dynamic_eagle2` it does in the first batch. With an LLM vocabulary token 0 is "
        "`<unk>`, of negligible probability, which hides it; the sweeps use `padding='unreachable'` (an extra "
        "token of probability 0), the rule on the tree as drawn.",
        "- Intervals are per stratum at 95%; the point estimate is the bias-corrected TV clipped to its interval "
        "(marked ^ where the correction, which over-corrects under a lossy law, put it below the lower bound); "
        "the interval is the guarantee. Absolute positions are counted from 0 (`abs=0` is the first token), as in "
        "the verifier battery (`check_verifier`), except the `generate` report's, counted from 1 as in the decoder battery; "
        "in-round position 1 is `abs=0` and is measured once, there.",
        "",
        'Install (one command, from the repository root; 79 s with the wheels cached): `python -m venv .venvs/medusa && . .venvs/medusa/bin/activate && pip install torch==2.13.0 && pip install -e ".[test,plots,hf]" transformers==5.24.0 && pip install --no-deps medusa-llm==0.1`. `pip check` there lists four requirements of medusa-llm 0.1 as not installed: accelerate, fschat, protobuf, sentencepiece. None is imported by `medusa.model.utils`, the only Medusa module the adapters load (it imports torch only); they serve Medusa\'s model loading, CLI and training code (the `medusa` extra would install them).',
        "",
    ]
    atomic_write_text(OUT / "README.md", "\n".join(lines))


def main(names: list[str]) -> int:
    known = [*CLI, "hf-ensemble-kernel", "hf-ensemble-generate", *MEDUSA_TREE]
    if names == ["readme"]:
        write_readme()
        return 0
    if names == ["all"]:
        names = known
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        print(f"usage: python -m tools.reports.lossy_reports all | readme | {' | '.join(known)} (got {unknown or names})")
        return 2
    status = 0
    for name in names:
        print(f"== {name}", flush=True)
        if name in CLI:
            status |= run_cli(name)
        elif name == "hf-ensemble-kernel":
            status |= hf_ensemble_kernel()
        elif name in MEDUSA_TREE:
            status |= medusa_tree([name])
        else:
            status |= hf_ensemble_generate()
    write_readme()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

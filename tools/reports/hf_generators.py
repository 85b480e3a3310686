"""The candidate-generator matrix of the HF transformers audit (issue 31, item 1).

Every path ``generate(..., do_sample=True)`` can take with a draft in transformers 5.24
(:data:`specverify.adapters.hf.catalog.GENERATORS`), each at T = 1 (with the command's seed and the
next :data:`EXTRA_SEEDS` seeds), at T = 0.7 with top-k and top-p, and greedy, K from 1 to 5 across
the matrix.  Each configuration is one ``specverify
audit`` of ``specverify.adapters.hf.catalog:tiny_generator_decoder`` against
``tiny_generator_target`` (the target's exact processed conditionals) at the sizes of the
other HF decoder configurations (:data:`tools.reports.hf_config.SIZES`).  After each audit a
probe of :data:`PROBE_SAMPLES` calls on one prompt records which generator class ``generate``
built and how much it drafted (:func:`probe`), so a pass can be told apart from a generator
that never proposed anything.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = [
    "GeneratorConfig",
    "GENERATOR_CONFIGS",
    "GENERATOR_FINDINGS",
    "GENERATOR_REPROS",
    "QUICK_GENERATOR_CONFIGS",
    "PROBE_SAMPLES",
    "EXTRA_SEEDS",
    "generator_argv",
    "probe",
    "relevant_repros",
    "render_generators",
]

DECODER_SPEC = "specverify.adapters.hf.catalog:tiny_generator_decoder"
TARGET_SPEC = "specverify.adapters.hf.catalog:tiny_generator_target"
#: ``generate`` calls of the engagement probe after each audit (prompt [3, 5, 7, 9, 3], 6 new tokens).
PROBE_SAMPLES = 100
PROBE_PROMPT = (3, 5, 7, 9, 3)
#: Seed offsets at which every generator's T = 1 configuration runs again (``--seed`` + offset).
EXTRA_SEEDS = (1, 2)


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """One configuration: a candidate generator, K and sampling options (``temperature=None``: greedy).

    ``seed_offset``: the audit runs at the report command's ``--seed`` plus this.
    """

    name: str
    generator: str
    k: int
    temperature: float | None = 1.0
    top_k: int = 0
    top_p: float = 1.0
    expect: str = "pass"
    seed_offset: int = 0

    def options(self) -> str:
        if self.temperature is None:
            return f"{self.generator}: do_sample=False (greedy), K={self.k}"
        parts = [f"do_sample=True, temperature={self.temperature:g}"]
        parts.append(f"top_k={self.top_k}" if self.top_k else "top_k off")
        parts.append(f"top_p={self.top_p:g}" if self.top_p < 1 else "top_p off")
        return f"{self.generator}: " + ", ".join(parts) + f", K={self.k}"


def _configs():
    out = []
    plan = {  # generator: (K at T=1, K at T=0.7 + top-k 8 + top-p 0.9, K greedy); None: not run
        "heuristic": (3, 2, 2),
        "dynamic": (5, 4, 3),
        "early_exit": (4, 2, 3),
        "prompt_lookup": (3, 5, 2),
        "vocab_superset": (3, 2, 3),
        "vocab_subset": (3, 4, 3),
        "vocab_partial": (3, 4, 2),
        "mtp": (1, 1, 1),
        "dflash": (3, 5, 3),
        "gemma4": (2, 4, 3),
        "gemma4_unified": (3, 1, 2),
    }
    for generator, (k1, k07, kg) in plan.items():
        out.append(GeneratorConfig(f"gen_{generator}_t1.0_k{k1}", generator, k1))
        if k07 is not None:
            out.append(
                GeneratorConfig(f"gen_{generator}_t0.7_topk8_topp0.9_k{k07}", generator, k07, 0.7, 8, 0.9)
            )
        out.append(GeneratorConfig(f"gen_{generator}_greedy_k{kg}", generator, kg, None))
    for generator, (k1, _, _) in plan.items():  # after the matrix, so the seed-0 rows read together
        for offset in EXTRA_SEEDS:
            out.append(GeneratorConfig(f"gen_{generator}_t1.0_k{k1}_seed{offset}", generator, k1, seed_offset=offset))
    return tuple(out)


GENERATOR_CONFIGS = _configs()
QUICK_GENERATOR_CONFIGS = ("gen_prompt_lookup_t1.0_k3",)


def _options(role: str, pairs) -> list[str]:
    return [arg for pair in pairs for arg in (f"--{role}-option", pair)]


def generator_argv(config: GeneratorConfig, *, num_samples: int, max_new_tokens: int) -> list[str]:
    """``specverify audit`` arguments of one configuration (without tier, seed, alpha)."""
    sizes = ["--num-samples", str(num_samples), "--max-new-tokens", str(max_new_tokens)]
    common = [f"generator={config.generator}"]
    if config.temperature is None:
        decoder = _options("decoder", [*common, f"k={config.k}", "greedy=True"])
        return ["--decoder", DECODER_SPEC, *decoder, "--target", TARGET_SPEC, *_options("target", common), "--greedy"] + sizes
    sampling = [f"temperature={config.temperature!r}", f"top_k={config.top_k}", f"top_p={config.top_p!r}"]
    decoder = _options("decoder", [*common, f"k={config.k}", *sampling])
    return ["--decoder", DECODER_SPEC, *decoder, "--target", TARGET_SPEC, *_options("target", [*common, *sampling])] + sizes


def probe(config: GeneratorConfig, *, samples: int = PROBE_SAMPLES) -> dict:
    """Which generator ``generate`` built and how much it drafted, over ``samples`` calls (seed 0).

    Returns the decoder's :class:`~specverify.adapters.hf.generators.GeneratorStats` as a dict, or
    ``{"error": message}`` when the decoder cannot be built or raises.
    """
    from specverify.adapters.hf.catalog import tiny_generator_decoder
    from specverify.core.errors import ImplementationError, InvalidArgument

    sampling = (
        {"greedy": True}
        if config.temperature is None
        else dict(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    )
    try:
        decoder = tiny_generator_decoder(generator=config.generator, k=config.k, **sampling)
        decoder.generate(torch.tensor(PROBE_PROMPT), num_samples=samples, max_new_tokens=6, seed=0)
    except (ImplementationError, InvalidArgument) as error:
        return {"error": str(error)}
    return decoder.stats.to_dict()


# ---------------------------------------------------------------------------- README section

#: (script, generator names it concerns, title, upstream status) of every failure's standalone repro.
GENERATOR_FINDINGS = (
    (
        "repro_gemma4_assistant_sampling.py",
        ("gemma4", "gemma4_unified"),
        "Gemma 4 assistants under sampling: argmax drafts verified as if sampled from softmax(raw logits)",
        "Reported upstream as one of three generators in huggingface/transformers#47932 (closed); the pull request "
        "that proposed a one-hot q for this generator, huggingface/transformers#47961, was closed without being "
        "merged. `SinglePositionMultiTokenCandidateGenerator.get_candidates` is unchanged in transformers 5.25.0 "
        "(argmax drafts, raw logits returned), so the script exits 1 there too.",
    ),
    (
        "repro_usd_q_permuted.py",
        ("vocab_superset", "vocab_partial"),
        "Universal speculative decoding verifies against a q attached to the wrong tokens",
        "No upstream report found (searched huggingface/transformers issues and pull requests for the translator, "
        "`get_target_logits` and the pruned head). `AssistantToTargetTranslator` is unchanged in transformers "
        "5.25.0 (the script exits 1 there too). The pruned rows follow the `get_vocab()` dict order of the "
        "assistant tokenizer, which for fast tokenizers is a hash-map order drawn afresh in every process, so the "
        "mismatch is the rule, not an artefact of the tiny tokenizers, and the sampled different-tokenizer reports' "
        "statistics change from process to process with the same seed (the script prints a different order each run).",
    ),
    (
        "repro_usd_subset_vocab.py",
        ("vocab_subset",),
        "Universal speculative decoding crashes when the assistant's vocabulary is a subset of the target's",
        "No upstream report found for `get_target_ids`; huggingface/transformers#45307 (closed, fixed by the merged "
        "huggingface/transformers#45320) was the same case in `unmap_input_ids`, whose guard was not carried over "
        "to `get_target_ids`. Unchanged in transformers 5.25.0 (the script exits 1 there too).",
    ),
)
GENERATOR_REPROS = tuple(script for script, *_ in GENERATOR_FINDINGS)


def relevant_repros(reports) -> tuple[str, ...]:
    """The repro scripts of :data:`GENERATOR_FINDINGS` that concern a generator among ``[(name, Report), ...]``."""
    ran = {(report.extra.get("hf_audit") or {}).get("generator") for _, report in reports}
    return tuple(script for script, generators, *_ in GENERATOR_FINDINGS if ran & set(generators))


def _evidence(report) -> str:
    if report.errors:
        return "ERROR: " + "; ".join(report.errors)[:400]
    flagged = sorted(
        (r for r in report.results if r.grade in ("fail", "suspicious")),
        key=lambda r: r.adjusted_pvalue if r.adjusted_pvalue is not None else r.pvalue,
    )
    if flagged:
        return flagged[0].summary()
    greedy = [r for r in report.results if r.family == "greedy"]
    if greedy:
        return f"greedy: {sum(r.n for r in greedy)} tokens equal the target's argmax continuation (exact)"
    tvs = sorted(float(r.mde_tv) for r in report.results if r.family == "gof" and r.mde_tv is not None)
    first = [float(r.mde_tv) for r in report.results if r.family == "gof" and r.position == "abs=1" and r.mde_tv]
    if not tvs:
        return "-"
    return f"no test failed; detectable TV {max(first):.3g} at position 1, median {tvs[len(tvs) // 2]:.3g}" if first else (
        f"no test failed; median detectable TV {tvs[len(tvs) // 2]:.3g}"
    )


def _engagement(stats: dict) -> str:
    if not stats:
        return "-"
    if "error" in stats:
        return "probe raised"
    return (
        f"{stats['drafted_per_drafting_round']:.2f} drafted in {stats['drafting_rounds']} of {stats['rounds']} rounds, "
        f"{stats['tokens_per_round']:.2f} tokens/round; draft logits returned: {'yes' if stats['with_logits'] else 'no'}"
    )


def render_generators(reports, repro_outputs: dict) -> str:
    """The README section of the candidate-generator audit from ``[(name, Report), ...]``."""
    from specverify.adapters.hf.catalog import GENERATORS

    by_generator: dict[str, list] = {}
    for name, report in reports:
        audit = report.extra.get("hf_audit") or {}
        by_generator.setdefault(audit.get("generator", "?"), []).append((name, report, audit))
    out = [
        "## Every candidate generator of `generate` (issue 31, item 1)",
        "",
        "Each path `generate` can take with a draft, on tiny seeded models built from configs "
        "(`specverify.adapters.hf.catalog`), checked end to end by `check_decoder` against the target's exact "
        "processed conditionals at the sizes above (greedy: token-for-token equality). The decoder checks on every "
        "call that `generate` built the expected generator class, and restores the draft-length fields of the "
        "generation config before every call (the `heuristic` schedule writes its last draft length back into "
        f"the assistant's config). Engagement: a probe of {PROBE_SAMPLES} calls (prompt {list(PROBE_PROMPT)}, "
        "6 new tokens, seed 0) after each audit counts the rounds that drafted and whether the generator returned draft logits (with sampling "
        "they are the q `_speculative_sampling` verifies against; greedy decoding ignores them). Same seed, same statistics holds for every configuration but the sampled "
        "different-tokenizer ones (`vocab_*` with sampling): their translator's pruned-row order comes from a "
        "hash map seeded afresh in every process (see the failures below).",
        "",
        "| config | generator class | expected | verdict | strongest evidence (or detectable TV) | engagement (probe) | runtime |",
        "|---|---|---|---|---|---|---|",
    ]
    for generator, items in by_generator.items():
        for name, report, audit in items:
            probe_stats = audit.get("probe") or {}
            classes = ", ".join(probe_stats.get("generators", [])) or (
                GENERATORS[generator].expected(audit.get("temperature") is None) if generator in GENERATORS else "?"
            )
            out.append(
                f"| [`{name}`]({name}/report.md) | `{classes}` | {audit.get('expect', 'pass')} | "
                f"**{report.verdict.upper()}** | {_evidence(report)} | {_engagement(probe_stats)} | "
                f"{float(report.timings.get('total', 0.0)):.0f} s |"
            )
    out += ["", "### The rule of each generator, read from the source (transformers 5.24.0)", ""]
    for generator in by_generator:
        spec = GENERATORS.get(generator)
        if spec is not None:
            out.append(f"- **`{generator}`** (`{spec.generator}`; K = {spec.k_meaning}): {spec.rule}")
    out += ["", "### Failures: standalone reproducers and upstream status", ""]
    for script, generators, title, upstream in GENERATOR_FINDINGS:
        if not any(g in by_generator for g in generators):
            continue
        output, code = repro_outputs.get(script, ("(not run)", None))
        status = {0: "exit 0: the bug no longer shows", 1: "exit 1: the bug shows"}.get(code, f"exit {code}")
        out += [
            f"#### {title}",
            "",
            f"Upstream: {upstream}",
            "",
            f"`python {script}` ([{script}]({script}); torch and transformers only) printed ({status}):",
            "",
            "```",
            output.rstrip(),
            "```",
            "",
        ]
    return "\n".join(out)

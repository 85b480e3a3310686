"""Regenerate the llama.cpp (llama-cpp-python) audit reports under ``reports/llama-cpp/`` (never written by hand).

::

    python -m tools.reports.llamacpp_reports --out reports/llama-cpp --seed 0 --tier smoke [--only NAME ...]

Needs llama-cpp-python and gguf (:data:`specverify.adapters.llamacpp.INSTALL`).  Each configuration
of :data:`CONFIGS` runs as ``specverify audit --decoder specverify.adapters.llamacpp:tiny_decoder
--target specverify.adapters.llamacpp:tiny_target ...`` in its own process (through
:func:`tools.reports.common.run_config`), at the battery's sizes.  Then, for every
speculative configuration, :func:`probe` runs the drafter and the no-draft control with the same
options and the same per-sample seeds on one prompt, and records how much was drafted and how many
rows are token-for-token identical (``probe.json``); ``README.md`` is written from the
``report.json`` and ``probe.json`` files and the template ``templates/llamacpp.md``, which states
the engine's rule as read in its source.  About 15 minutes on one busy CPU core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.common import decoder_target_args, engine_versions, readme_fields, report_main, read_template, repro_lines

__all__ = ["CONFIGS", "PROBE_PROMPT", "PROBE_SAMPLES", "config_args", "probe", "write_readme", "main"]

MOD = "specverify.adapters.llamacpp"
PROBE_PROMPT = (3, 7, 9, 3, 7, 4)
PROBE_SAMPLES = 200
SAMPLER_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty",
                "last_n", "grammar")  # fmt: skip

PURE = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)  # every truncation off: the model's own law
TRUNC = dict(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05)
PENALTIES = dict(PURE, repeat_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.7, last_n=3)
GRAMMAR = dict(PURE, grammar=True)
GREEDY = dict(temperature=0.0)
DEFAULTS: dict = {}  # generate()'s defaults: T 0.8, top_k 40, top_p 0.95, min_p 0.05

SETTINGS = (
    ("t1.0", "T=1, top_k/top_p/min_p off", PURE),
    ("defaults", "`generate()` defaults: T=0.8, top_k=40, top_p=0.95, min_p=0.05", DEFAULTS),
    ("t0.7_topk8_topp0.9", "T=0.7, top_k=8, top_p=0.9, min_p=0.05", TRUNC),
    ("penalties", "T=1, repeat 1.5, frequency 0.5, presence 0.7, window `last_n_tokens_size=3`", PENALTIES),
    ("grammar", "T=1, GBNF `root ::= word \" \" root`, `word ::= \"a\" [bc]* | \"ba\"`", GRAMMAR),
    ("greedy", "temp=0 (greedy sampler)", GREEDY),
)
DRAFTS = (
    ("control", "no drafter", dict(drafter="none")),
    ("lookup", "`LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)`",
     dict(drafter="prompt_lookup", num_pred_tokens=10)),
    ("draftmodel", "draft `Llama` (argmax, K=3) as `LlamaDraftModel`", dict(drafter="draft_model", num_pred_tokens=3)),
)  # fmt: skip


def config_args(decoder: dict, sampler: dict) -> list[str]:
    """Audit arguments: ``tiny_decoder`` with all options against ``tiny_target`` with the sampler ones."""
    return decoder_target_args(MOD, target_keys=tuple(sampler), **decoder, **sampler)


def _configs() -> tuple[tuple[str, str, dict, dict], ...]:
    out = []
    for dname, dwhat, decoder in DRAFTS:
        for sname, swhat, sampler in SETTINGS:
            out.append((f"{dname}_{sname}", f"{dwhat}; {swhat}", decoder, sampler))
    return tuple(out)


#: (name, description, decoder options, sampler options) of every configuration.
CONFIGS = _configs()
TEMPLATE = read_template("llamacpp.md")
#: Filled in by hand from the timed install (the generator cannot time it).
INSTALL_RECORD = (
    "Measured on this project's 2-core machine with another CPU-heavy job beside it: compiling llama.cpp "
    "from the llama-cpp-python 0.3.36 sdist with one build job (`CMAKE_BUILD_PARALLEL_LEVEL=1`, 193 build "
    "steps) took 1176 s (19.6 min); gguf took 3 s and the editable specverify install 38 s. The steps were "
    "run one by one into the same virtualenv, not yet as the one line above from a fresh clone."
)


def probe(decoder_options: dict, sampler: dict, *, seed: int = 0) -> dict:
    """Drafting statistics and token-for-token agreement with the no-draft control under the same seeds.

    ``PROBE_SAMPLES`` rows of 6 tokens after :data:`PROBE_PROMPT`, per-sample seeds from ``seed``.
    """
    import torch

    from specverify.adapters.llamacpp import tiny_decoder

    spec = tiny_decoder(**decoder_options, **sampler)
    plain = tiny_decoder(drafter="none", **sampler)
    prompt = torch.tensor(PROBE_PROMPT)
    a = spec.generate(prompt, num_samples=PROBE_SAMPLES, max_new_tokens=6, seed=seed)  # (N, 6)
    b = plain.generate(prompt, num_samples=PROBE_SAMPLES, max_new_tokens=6, seed=seed)  # (N, 6)
    stats = spec.counter.stats() if spec.counter is not None else None
    return dict(
        samples=PROBE_SAMPLES,
        identical_rows=int((a == b).all(1).sum()),
        draft_calls=None if stats is None else stats.calls,
        proposed=None if stats is None else stats.proposed,
    )


def _probe_text(out: Path) -> str:
    lines = []
    for name, _, decoder, _ in CONFIGS:
        path = out / name / "probe.json"
        if decoder["drafter"] == "none" or not path.exists():
            continue
        p = json.loads(path.read_text())
        lines.append(
            f"| `{name}` | {p['draft_calls']} | {p['proposed'] / max(p['draft_calls'], 1):.2f} | "
            f"{p['samples'] * 6 / max(p['draft_calls'], 1):.2f} | {p['identical_rows']} / {p['samples']} |"
        )
    return "\n".join(lines)


def _repro_text(out: Path) -> str:
    lines = repro_lines(out)
    if not lines:
        return "No configuration failed, so there is no repro script."
    return "\n".join(["Each needs only the engine (no specverify); exit status 1 while the bug shows.", "", *lines])


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` and ``probe.json`` files."""
    from specverify.adapters.llamacpp import INSTALL, max_conditional_difference

    configs = [(name, what, None) for name, what, _, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.llamacpp_reports", seed=seed, tier=tier)
    max_diff = f"{max_conditional_difference(seed=0):.2g} (8 random sequences of 12 tokens)"
    text = TEMPLATE.format(
        **fields,
        **engine_versions(llama_cpp="llama-cpp-python", gguf="gguf", transformers="transformers"),
        install=INSTALL,
        install_record=INSTALL_RECORD,
        max_diff=max_diff,
        probes=_probe_text(out),
        repro=_repro_text(out),
    )
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    configs = [(name, config_args(d, s)) for name, _, d, s in CONFIGS]

    def readme(out: Path, *, seed: int, tier: str) -> Path:
        if "--readme-only" not in argv:
            only = [argv[i + 1] for i, a in enumerate(argv) if a == "--only"]
            for name, _, decoder, sampler in CONFIGS:
                if decoder["drafter"] != "none" and (not only or name in only) and (out / name).exists():
                    result = probe(decoder, sampler, seed=seed)
                    atomic_write_text(out / name / "probe.json", json.dumps(result, indent=1) + "\n")
                    print(f"{name}: probe {result}", flush=True)
        return write_readme(out, seed=seed, tier=tier)

    return report_main(argv, doc=__doc__, default_out="reports/llama-cpp", configs=configs, write_readme=readme)


if __name__ == "__main__":
    sys.exit(main())

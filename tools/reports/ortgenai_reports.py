"""Regenerate the ONNX Runtime GenAI audit reports under ``reports/onnxruntime-genai/`` (never written by hand).

::

    python -m tools.reports.ortgenai_reports --out reports/onnxruntime-genai --seed 0 --tier smoke [--only NAME ...]

Needs onnxruntime-genai and its model builder (:data:`specverify.adapters.ortgenai.INSTALL`).  Each
configuration of :data:`CONFIGS` runs as ``specverify audit --decoder
specverify.adapters.ortgenai:tiny_decoder --target specverify.adapters.ortgenai:tiny_target ...`` in
its own process (:func:`tools.reports.common.run_config`), so its report records the command that
reproduces it; then ``README.md`` is written from the ``report.json`` files and :data:`TEMPLATE`,
which states the engine's rule as read in its source, and the ``Engine`` API's draft path as far
as :func:`specverify.adapters.ortgenai.engine_drafts.probe_draft_verification` can drive it.
About 6 minutes on one busy CPU core (the first run also exports the tiny models, about 30 s).  Exit status 0 whatever the verdicts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specverify.core.files import atomic_write_text
from tools.reports.common import decoder_target_args, engine_versions, read_template, readme_fields, report_main

__all__ = ["CONFIGS", "TEMPLATE", "write_readme", "main"]

MOD = "specverify.adapters.ortgenai"
SAMPLED = dict(temperature=0.7, top_k=8, top_p=0.9)


def _config(name: str, what: str, *extra: str, **options) -> tuple[str, str, list[str]]:
    """A configuration of :mod:`specverify.adapters.ortgenai`; ``extra`` are further audit arguments."""
    return name, what, [*decoder_target_args(MOD, **options), *extra]


# fmt: off
CONFIGS: tuple[tuple[str, str, list[str]], ...] = (
    _config("control_no_draft_t1.0", "control: the target alone (no `model.draft`), T=1", draft=False),
    _config("control_no_draft_t0.7_topk8_topp0.9", "control: the target alone, T=0.7, top_k=8, top_p=0.9",
            draft=False, **SAMPLED),
    _config("control_no_draft_t1.0_seed1", "control: the target alone, T=1, run seed 1", "--seed", "1", draft=False),
    _config("draft_k1_t1.0", "draft model, max_draft_tokens=1, T=1", max_draft_tokens=1),
    _config("draft_k3_t1.0", "draft model, max_draft_tokens=3, T=1", max_draft_tokens=3),
    _config("draft_k5_t1.0", "draft model, max_draft_tokens=5, T=1", max_draft_tokens=5),
    _config("draft_k16_t1.0", "draft model, max_draft_tokens=16 (the maximum), T=1", max_draft_tokens=16),
    _config("draft_k3_t0.7", "draft model, K=3, T=0.7", max_draft_tokens=3, temperature=0.7),
    _config("draft_k3_t1.0_topk8", "draft model, K=3, T=1, top_k=8 (the top-k path)", max_draft_tokens=3, top_k=8),
    _config("draft_k3_t1.0_topp0.9", "draft model, K=3, T=1, top_p=0.9 (the nucleus path)",
            max_draft_tokens=3, top_p=0.9),
    _config("draft_k3_t0.7_topk8_topp0.9", "draft model, K=3, T=0.7, top_k=8, top_p=0.9", max_draft_tokens=3, **SAMPLED),
    _config("draft_k5_t0.7_topk8_topp0.9", "draft model, K=5, T=0.7, top_k=8, top_p=0.9", max_draft_tokens=5, **SAMPLED),
    _config("draft_k3_t1.0_seed1", "draft model, K=3, T=1, run seed 1", "--seed", "1", max_draft_tokens=3),
    _config("draft_k3_t0.7_topk8_topp0.9_seed1", "draft model, K=3, T=0.7, top_k=8, top_p=0.9, run seed 1",
            "--seed", "1", max_draft_tokens=3, **SAMPLED),
    _config("greedy_control_no_draft", "greedy (`do_sample=False`), the target alone: equals the argmax",
            "--greedy", draft=False, greedy=True),
    _config("greedy_draft_k3", "greedy speculative decoding, K=3: equals the target's argmax",
            "--greedy", max_draft_tokens=3, greedy=True),
)
# fmt: on

TEMPLATE = read_template("ortgenai.md")


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files."""
    from specverify.adapters.ortgenai import INSTALL, max_conditional_difference
    from specverify.adapters.ortgenai.engine_drafts import format_probe, probe_draft_verification

    configs = [(name, what, None) for name, what, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.ortgenai_reports", seed=seed, tier=tier)
    max_diff = f"{max_conditional_difference(seed=0):.2g} (8 random sequences of 12 tokens)"
    engine_probe = format_probe(probe_draft_verification(seed=0))
    text = TEMPLATE.format(**fields, **engine_versions(genai="onnxruntime-genai", ort="onnxruntime", transformers="transformers"), install=INSTALL, max_diff=max_diff, engine_probe=engine_probe)
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    configs = [(name, audit_args) for name, _, audit_args in CONFIGS]
    return report_main(
        argv, doc=__doc__, default_out="reports/onnxruntime-genai", configs=configs, write_readme=write_readme
    )


if __name__ == "__main__":
    sys.exit(main())

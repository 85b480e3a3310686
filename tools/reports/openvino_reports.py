"""Regenerate the OpenVINO GenAI audit reports under ``reports/openvino/`` (never written by hand).

::

    python -m tools.reports.openvino_reports --out reports/openvino --seed 0 --tier smoke [--only NAME ...]

Needs openvino-genai and optimum-intel (:data:`specverify.adapters.openvino.INSTALL`).  Each
configuration of :data:`CONFIGS` runs as ``specverify audit --decoder
specverify.adapters.openvino:tiny_decoder --target specverify.adapters.openvino:tiny_target ...``
in its own process (through :func:`tools.reports.common.run_config`), so its report
records the command that reproduces it; then ``README.md`` is written from the ``report.json``
files (verdict, strongest evidence, detectable TV, link) and :data:`TEMPLATE`, which describes the
engine's accept/residual rule as read in its source.  About 8 minutes on 2 busy CPU cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.reports.common import decoder_target_args, engine_versions, readme_fields, report_main, read_template, repro_lines
from specverify.core.files import atomic_write_text

__all__ = ["CONFIGS", "TEMPLATE", "UPSTREAM", "INSTALL_RECORD", "write_readme", "main"]

MOD = "specverify.adapters.openvino"


def _config(name: str, what: str, **options) -> tuple[str, str, list[str]]:
    """A configuration of :mod:`specverify.adapters.openvino` (:func:`~tools.reports.common.decoder_target_args`)."""
    return name, what, decoder_target_args(MOD, **options)


# fmt: off
CONFIGS: tuple[tuple[str, str, list[str]], ...] = (
    _config("control_no_draft_t1.0", "control: `LLMPipeline` without draft model, T=1", draft=False),
    _config("control_no_draft_t0.7_topk8_topp0.9", "control: no draft model, T=0.7, top_k=8, top_p=0.9",
            draft=False, temperature=0.7, top_k=8, top_p=0.9),
    _config("control_no_draft_t1.0_continuous", "control: `ContinuousBatchingPipeline` without draft model, T=1",
            draft=False, pipeline="continuous"),
    _config("diagnostic_control_no_draft_t0.7_topk8_topp0.9_engine_precision",
            "diagnostic: the same control with the CPU plugin's default precision (bf16 inference, u8 KV cache)",
            draft=False, temperature=0.7, top_k=8, top_p=0.9, precision="default"),
    _config("draft_k1_t1.0_determinism", "draft model, num_assistant_tokens=1, T=1, repeats re-run (determinism check)",
            num_assistant_tokens=1),
    _config("draft_k1_t1.0", "draft model, num_assistant_tokens=1, T=1", num_assistant_tokens=1, memoize=True),
    _config("draft_k3_t1.0", "draft model, num_assistant_tokens=3, T=1", num_assistant_tokens=3, memoize=True),
    _config("draft_k5_t1.0", "draft model, num_assistant_tokens=5, T=1", num_assistant_tokens=5, memoize=True),
    _config("draft_k3_t0.7", "draft model, num_assistant_tokens=3, T=0.7", num_assistant_tokens=3, temperature=0.7,
            memoize=True),
    _config("draft_k3_t1.0_topk8", "draft model, K=3, T=1, top_k=8 (the deferred-expf sampling path)",
            num_assistant_tokens=3, top_k=8, memoize=True),
    _config("draft_k3_t1.0_topp0.9", "draft model, K=3, T=1, top_p=0.9 (the truncated-mass sampling path)",
            num_assistant_tokens=3, top_p=0.9, memoize=True),
    _config("draft_k3_t0.7_topk8_topp0.9", "draft model, K=3, T=0.7, top_k=8, top_p=0.9",
            num_assistant_tokens=3, temperature=0.7, top_k=8, top_p=0.9, memoize=True),
    _config("draft_k3_t1.0_continuous", "draft model, K=3, T=1, `ContinuousBatchingPipeline`, all samples batched",
            num_assistant_tokens=3, pipeline="continuous", memoize=True),
)
# fmt: on

TEMPLATE = read_template("openvino.md")


#: How the install line did on this project's machine (a fresh clone, a fresh virtualenv; filled in by hand
#: from the timed run, since the generator cannot time it).
INSTALL_RECORD = (
    "Measured from a fresh clone into a fresh virtualenv on a 2-core machine whose PyTorch index was "
    "unreachable (the local torch wheel served torch): the whole command took 97 s (in a split run 65 s for "
    "the engine packages, 3 s for the torchvision check, 20 s for specverify). `pip check` then reports only `optimum-intel 2.2.0 "
    "requires torchvision, which is not installed`; harmless: optimum-intel imports torchvision only for "
    "vision-language models and image-classification preprocessing, which neither the text-generation "
    "export nor the pipeline uses. With the index reachable torchvision (+cpu) should load and stay, leaving "
    "`pip check` clean (not verified: no machine here reaches that index)."
)

#: The findings' status upstream: openvinotoolkit/openvino.genai issues and pull requests searched,
#: and the current source read (master da1db864, 2026-08-21).
UPSTREAM = read_template("openvino_upstream.md")

#: Draft-model configurations: the engine is not reproducible per ``rng_seed`` with a draft model, so
#: a fresh process gives other numbers (the verdict stands); ``tests/test_repro.py`` compares only
#: their verdicts.
NONDETERMINISTIC = frozenset(name for name, _, _ in CONFIGS if name.startswith("draft_"))


def _repro_text(out: Path) -> str:
    lines = repro_lines(out)
    if not lines:
        return ""
    head = [
        "## Repro scripts",
        "",
        "Each needs only the engine (no specverify): `python <script>` in a virtualenv made with the pip line",
        "of its docstring, which also gives the expected output; exit status 1 when the bug shows.",
        "",
    ]
    return "\n".join(head + lines)


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files."""
    from specverify.adapters.openvino import INSTALL, max_conditional_difference

    configs = [(name, what, None) for name, what, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.openvino_reports", seed=seed, tier=tier)
    max_diff = f"{max_conditional_difference(seed=0):.2g} (8 random sequences of 12 tokens)"
    text = TEMPLATE.format(
        **fields,
        **engine_versions(genai="openvino-genai", openvino="openvino", optimum="optimum-intel", transformers="transformers"),
        install=INSTALL,
        install_record=INSTALL_RECORD,
        max_diff=max_diff,
        upstream=UPSTREAM,
        repro=_repro_text(out),
    )
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    configs = [(name, audit_args) for name, _, audit_args in CONFIGS]
    return report_main(argv, doc=__doc__, default_out="reports/openvino", configs=configs, write_readme=write_readme)


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the EAGLE audit reports under ``reports/eagle/`` (never written by hand).

::

    python -m tools.reports.eagle_reports --out reports/eagle --seed 0 --tier smoke [--only NAME ...]

Needs ``eagle-llm`` and transformers: :data:`INSTALL` (its own virtualenv, ``.venvs/eagle``).  Each
configuration of :data:`CONFIGS` runs as ``specverify audit --tree-verifier ...`` (or, for
greedy, ``--verifier ... --greedy`` on one-path trees) in its own process through
:mod:`specverify.adapters.eagle`, so its report records the command that reproduces it; then
``README.md`` is written from the ``report.json`` files with the shared helpers of
:mod:`tools.reports.common` (verdict, strongest evidence, detectable TV, link) and
the rule read from EAGLE's source.  About 3 minutes on 2 busy CPU cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.reports.common import readme_fields, report_main, read_template
from specverify.core.files import atomic_write_text

__all__ = ["CONFIGS", "FINDINGS_TABLE", "INSTALL", "write_readme", "main"]

MOD = "specverify.adapters.eagle"
#: The install line (from the repository root; the same in the top-level README).
INSTALL = (
    "python -m venv .venvs/eagle && . .venvs/eagle/bin/activate && pip install torch==2.13.0 && "
    'pip install -e ".[test,plots,hf]" transformers==5.24.0 && pip install --no-deps eagle-llm==1.2.1'
)
#: What ``pip check`` says in that virtualenv, and why it is harmless.
PIP_CHECK = (
    "`pip check` there lists eight requirements of eagle-llm 1.2.1 as not installed: accelerate, anthropic, "
    "fschat, gradio, openai, protobuf, sentencepiece, wandb (seven of them pinned to exact old releases, e.g. "
    "`protobuf==3.19.0`, `gradio==3.50.2`). "
    "None is imported by `eagle.model.utils`, the only EAGLE module the adapter and the repro load (it imports "
    "torch, transformers' logits warpers and the standard library); they serve EAGLE's web UI, evaluation, "
    "data-generation and training scripts. `--no-deps` keeps them, and their old pins, out."
)
WOR = ["--mode", "wor"]
#: top-k / top-p that run EAGLE's warpers but cut nothing on the battery's targets (smallest
#: positive target probability 1.1e-5 > 1 - top_p); the adapter checks it on every call.
NO_CUT = ["--tree-verifier-option", "top_k=32768", "--tree-verifier-option", "top_p=0.99999"]


def _sampled(temperature: float, *extra: str) -> list[str]:
    return [
        "--tree-verifier",
        f"{MOD}:EagleTreeVerifier",
        *WOR,
        "--tree-verifier-option",
        f"temperature={temperature}",
        *extra,
    ]


#: (name, expected verdict, what it runs, audit arguments)
# fmt: off
CONFIGS: tuple[tuple[str, str, str, list[str]], ...] = (
    ("sample_t1.0", "pass", "sampling, T=1, no top-k/top-p (no processor at all)",
     ["--tree-verifier", f"{MOD}:sampling_tree_verifier", *WOR]),
    ("sample_t1.0_topk32768_topp0.99999", "pass", "sampling, T=1, TopP and TopK warpers present (cutting nothing)",
     _sampled(1.0, *NO_CUT)),
    ("sample_t0.7", "?", "sampling, T=0.7", _sampled(0.7)),
    ("sample_t1.3", "?", "sampling, T=1.3", _sampled(1.3)),
    ("sample_t0.7_topk32768_topp0.99999", "?", "sampling, T=0.7 with TopP and TopK warpers (cutting nothing)",
     _sampled(0.7, *NO_CUT)),
    ("diagnostic_t0.7_patch_final", "pass",
     "diagnostic: T=0.7 with the final token's law processed (one line of `evaluate_posterior` patched)",
     _sampled(0.7, "--tree-verifier-option", "patch_final=True")),
    ("greedy_chain", "pass", "greedy branch (temperature 0), one-path trees, `--greedy` battery (exact equality)",
     ["--verifier", f"{MOD}:GreedyChainVerifier", "--greedy"]),
)
# fmt: on

TEMPLATE = read_template("eagle.md")

FINDINGS = read_template("eagle_findings.md")

#: What the upstream status was checked against.
UPSTREAM_CHECKED = (
    "SafeAILab/EAGLE's main branch (newest commit cb7e084, 2026-02-19; `git log` of `eagle/model/utils.py`), its "
    "issues and pull requests, and the eagle-llm releases on PyPI (1.1.0, 1.2.0, 1.2.1: 1.2.1 is the newest)"
)

#: (finding, repro, upstream status) rows of the findings table.
FINDINGS_TABLE = (
    (
        "bonus token at T != 1 (or with truncating top-k / top-p) drawn from the raw target logits, "
        "without `logits_processor`",
        "[`repro_final_token_ignores_processor.py`](repro_final_token_ignores_processor.py)",
        "**fixed on main, in no release**: SafeAILab/EAGLE@bf10ac5 (2025-04-08) first applied `logits_processor` "
        "to the bonus row (a 1-D row; after SafeAILab/EAGLE@50fc246, 2025-04-14, temperature and top-k worked but "
        "top-p raised `IndexError`); every warper works since SafeAILab/EAGLE#215 (SafeAILab/EAGLE@c892473, merged "
        "2025-04-29), current form SafeAILab/EAGLE@c7ef8e5 (2025-05-18): "
        "`gt_logits = logits_processor(None, logits[best_candidate, accept_length - 1][None])[0]`. Main's "
        "`evaluate_posterior` (EAGLE-2/3, a new signature) returns the float64 processed law on the repro's "
        "inputs (`top_k=1`: `[1, 0, 0]`; T = 0.7: `[0.771, 0.185, 0.044]`). No issue report found; no PyPI "
        "release after eagle-llm 1.2.1 (main's `setup.py` says 3.0.0, unpublished).",
    ),
)


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files."""
    from importlib.metadata import version

    import eagle  # noqa: F401  (installed: the reports were produced with it)
    import torch
    import transformers

    configs = [(name, what, expected) for name, expected, what, _ in CONFIGS]
    text = TEMPLATE.format(
        **readme_fields(out, configs, module="tools.reports.eagle_reports", seed=seed, tier=tier),
        eagle=version("eagle-llm"),
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=sys.version.split()[0],
        install=INSTALL,
        pip_check=PIP_CHECK,
        findings_table="\n".join(f"| {finding} | {repro} | {status} |" for finding, repro, status in FINDINGS_TABLE),
        upstream_checked=UPSTREAM_CHECKED,
        findings=FINDINGS,
    )
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    configs = [(name, audit_args) for name, _, _, audit_args in CONFIGS]
    return report_main(argv, doc=__doc__, default_out="reports/eagle", configs=configs, write_readme=write_readme)


if __name__ == "__main__":
    sys.exit(main())

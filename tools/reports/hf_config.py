"""The configuration matrix of the HF transformers audit (:mod:`tools.reports.hf_reports`).

Every report of the audit is one ``specverify audit`` run; :func:`kernel_argv` and
:func:`decoder_argv` give its arguments, so the command each report records reproduces it.
The models are the offline tiny Llama pair of :mod:`specverify.adapters.fixtures.llama`
(V = :data:`VOCAB_SIZE`, weights seed :data:`MODEL_SEED`, the factories' defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MODEL_SEED",
    "VOCAB_SIZE",
    "DEFAULT_OUT",
    "KERNEL_NAME",
    "SIZES",
    "TIER_FACTOR",
    "QUICK_SCENARIOS",
    "DecoderConfig",
    "CONFIGS",
    "QUICK_CONFIGS",
    "kernel_argv",
    "decoder_argv",
]

#: Seed of the tiny models' weights (fixed; the run seed drives sampling only).
MODEL_SEED = 0
VOCAB_SIZE = 32
DEFAULT_OUT = "reports/hf-transformers"
KERNEL_NAME = "kernel_speculative_sampling"
#: Samples per prompt and new tokens per sample of the decoder checks (2 prompts each).
#: 6 new tokens: the first round of every K <= 5 covers all in-block positions and the bonus.
SIZES = {
    "full": {"num_samples": 800, "max_new_tokens": 6, "control_samples": 300},
    "quick": {"num_samples": 120, "max_new_tokens": 3, "control_samples": 120},
}
#: Sample multiplier of the decoder checks per tier (smoke sizes are :data:`SIZES`).
TIER_FACTOR = {"smoke": 1, "standard": 10, "deep": 100}
#: Verifier scenarios run in quick mode (the full run uses the whole battery).
QUICK_SCENARIOS = ("pos2_least_likely_k2",)


@dataclass(frozen=True)
class DecoderConfig:
    """One end-to-end assisted-generation configuration.

    ``temperature=None`` is greedy assisted decoding (``do_sample=False``).  ``expect`` is
    the verdict a correct implementation must get: "pass", or "fail" for a lossy control.
    """

    name: str
    k: int
    temperature: float | None = 1.0
    top_k: int = 0
    top_p: float = 1.0
    assistant_ensemble_weight: float | None = None
    expect: str = "pass"
    description: str = ""

    def options(self) -> str:
        if self.temperature is None:
            parts = ["do_sample=False (greedy)"]
        else:
            parts = [
                f"do_sample=True, temperature={self.temperature:g}",
                f"top_k={self.top_k}" if self.top_k else "top_k off",
                f"top_p={self.top_p:g}" if self.top_p < 1 else "top_p off",
            ]
        if self.assistant_ensemble_weight is not None:
            parts.append(f"assistant_ensemble_weight={self.assistant_ensemble_weight:g}")
        return ", ".join(parts) + f", K={self.k}"


CONFIGS = (
    DecoderConfig("sample_t1.0_k4", k=4, description="plain sampling, the baseline"),
    DecoderConfig("sample_t0.7_topk8_k2", k=2, temperature=0.7, top_k=8, description="sharpened + top-k truncation"),
    DecoderConfig("sample_t1.0_topp0.9_k1", k=1, top_p=0.9, description="nucleus truncation, one draft per round"),
    DecoderConfig(
        "sample_t1.3_topk12_topp0.95_k5",
        k=5,
        temperature=1.3,
        top_k=12,
        top_p=0.95,
        description="flattened, both truncations, longest block",
    ),
    DecoderConfig("greedy_k3", k=3, temperature=None, description="greedy assisted decoding (temperature 0)"),
    DecoderConfig(
        "control_ensemble_w0.5_k4",
        k=4,
        assistant_ensemble_weight=0.5,
        expect="fail",
        description="negative control: HF's lossy ensemble verification; the suite must fail it",
    ),
)
QUICK_CONFIGS = ("sample_t0.7_topk8_k2", "greedy_k3")


#: ``PKG.MOD:NAME`` of the implementations the audit runs.
KERNEL_SPEC = "specverify.adapters.hf:speculative_sampling_verifier"
DECODER_SPEC = "specverify.adapters.hf:tiny_assisted_decoder"
GREEDY_DECODER_SPEC = "specverify.adapters.hf:tiny_greedy_assisted_decoder"
TARGET_SPEC = "specverify.adapters.hf:tiny_target"


def _options(role: str, pairs) -> list[str]:
    return [arg for pair in pairs for arg in (f"--{role}-option", pair)]


def kernel_argv(*, quick: bool = False) -> list[str]:
    """``specverify audit`` arguments of the kernel battery (without tier, seed, alpha)."""
    return ["--verifier", KERNEL_SPEC] + [
        a for name in (QUICK_SCENARIOS if quick else ()) for a in ("--scenario", name)
    ]


def decoder_argv(config: DecoderConfig, *, num_samples: int, max_new_tokens: int) -> list[str]:
    """``specverify audit`` arguments of one end-to-end configuration (without tier, seed, alpha).

    Decoder and target get the same sampling options (the target's processed conditionals
    must be the law the decoder samples); greedy configurations use ``--greedy``.
    """
    sizes = ["--num-samples", str(num_samples), "--max-new-tokens", str(max_new_tokens)]
    if config.temperature is None:
        decoder = ["--decoder", GREEDY_DECODER_SPEC, *_options("decoder", [f"k={config.k}"])]
        return decoder + ["--target", TARGET_SPEC, "--greedy", *sizes]
    sampling = [f"temperature={config.temperature!r}", f"top_k={config.top_k}", f"top_p={config.top_p!r}"]
    lossy = (
        []
        if config.assistant_ensemble_weight is None
        else [f"assistant_ensemble_weight={config.assistant_ensemble_weight!r}"]
    )
    decoder = ["--decoder", DECODER_SPEC, *_options("decoder", [f"k={config.k}", *sampling, *lossy])]
    return decoder + ["--target", TARGET_SPEC, *_options("target", sampling), *sizes]

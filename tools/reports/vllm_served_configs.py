"""What ``tools.reports.vllm_served`` serves and audits: the configurations of vLLM's option matrix.

Each :class:`Served` row is one server (the tiny target, with or without a ``--speculative-config``)
and one ``specverify audit --endpoint`` run against it.  The option matrix (:data:`FAMILIES`) runs
each sampling-option family once without speculation and once with each speculative method
(:data:`METHODS`), so that a refusal or a failure names its option.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "MODEL", "HOST", "K", "MODEL_SEED", "SAMPLES_PER_REQUEST", "TOKENIZERS", "Served", "METHODS", "MTP_METHODS", "family",
    "SAMPLING", "PENALTIES", "MIN_P_BIAS", "LOGPROBS", "SCHEMA", "FAMILIES", "CONFIGS",
]  # fmt: skip

MODEL = "tiny-llama"  # --served-model-name
HOST = "127.0.0.1"
K = 3  # num_speculative_tokens
MODEL_SEED = 0  # the weights (the in-process reports' tiny_decoder default)
SAMPLES_PER_REQUEST = 50

#: How a row is served: ``""`` without a tokenizer (``--skip-tokenizer-init``); ``"ids"`` with the
#: word-level tokenizer whose token ``i`` is ``<ti>`` (vLLM renders logprobs only with a tokenizer;
#: ``--return-tokens-as-token-ids`` keys them by id); ``"characters"`` with the word-level tokenizer
#: whose tokens are :func:`specverify_reference.grammar.synthetic_vocabulary`'s strings, the last
#: ``</s>`` its end-of-sequence token (a grammar needs token strings its characters can spell, and the
#: audit's masks are computed over the same strings).
TOKENIZERS = ("", "ids", "characters")


@dataclasses.dataclass(frozen=True)
class Served:
    """A served configuration: its directory name, what it runs, the speculative method and its draft sampling.

    ``inprocess`` names the in-process ``reports/vllm/`` reports of the same configuration, the
    first one the same engine settings (no diagnostic patch), the others its diagnostics.
    ``reference``: a second server, the same flags without speculation, serves the target's laws
    (``--reference-endpoint``); the server under test is then asked only for samples and, with
    ``--logprobs``, for the prompt logprobs the prompt logprob fidelity check compares.
    """

    name: str
    what: str
    method: str | None  # None: no speculation
    draft_sample_method: str = "greedy"
    inprocess: tuple[str, ...] = ()
    skip_determinism: bool = False  # the law tested although seeded outputs vary (as the in-process memoize)
    options: tuple[str, ...] = ()  # sampling options of the audit (``specverify audit`` arguments)
    tokenizer: str = ""  # one of TOKENIZERS
    reference: bool = False
    target: str = "llama"  # "llama": the tiny Llama; "mimo": the tiny MiMo model with its own MTP layer

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if self.target not in ("llama", "mimo"):
            raise ValueError(f"target must be 'llama' or 'mimo', got {self.target!r}")
        if self.method is not None and (self.method == "mtp") != (self.target == "mimo"):
            raise ValueError(f"method {self.method!r} drafts for the {'mimo' if self.method == 'mtp' else 'llama'} target")


#: The speculative methods of the option matrix: (name prefix, what, method, draft_sample_method).
METHODS = (
    ("ngram_k3", "ngram, K=3", "ngram", "greedy"),
    ("draft_probabilistic_k3", "draft model, probabilistic, K=3", "draft_model", "probabilistic"),
    ("eagle_k3", "EAGLE-1 head, greedy drafts, K=3", "eagle", "greedy"),
    ("eagle3_k3", "EAGLE-3 head (16 draft tokens of 32), greedy drafts, K=3", "eagle3", "greedy"),
)


#: MTP's: the MiMo target's own MTP layer (``target="mimo"``).
MTP_METHODS = (("mtp_k3", "MiMo's own MTP layer, greedy drafts, K=3", "mtp", "greedy"),)


def family(
    suffix: str, what: str, options: tuple[str, ...], *, methods=METHODS, target: str = "llama", **served: object
) -> tuple[Served, ...]:
    """One option family: ``control_no_spec_<suffix>`` (``control_no_spec_mimo_<suffix>`` for the MiMo
    target), then ``<method>_<suffix>_skip_determinism`` per method of ``methods`` (the law tested
    although vLLM's seeded outputs vary with speculation)."""
    name = f"control_no_spec_{suffix}" if target == "llama" else f"control_no_spec_{target}_{suffix}"
    label = "control: no speculation" if target == "llama" else "control: the MiMo target, no speculation"
    control = Served(name, f"{label}; {what}", None, options=options, target=target, **served)  # type: ignore[arg-type]
    return (control, *(
        Served(f"{prefix}_{suffix}_skip_determinism", f"{method_label}; {what}", method, sample, skip_determinism=True,
               options=options, target=target, **served)  # type: ignore[arg-type]
        for prefix, method_label, method, sample in methods
    ))  # fmt: skip


#: The option matrix's sampling, one option family per configuration (so that a refusal names its option):
#: the truncations (T 0.7, top-k 12, top-p 0.9); penalties (T 0.9, frequency and presence, vLLM's
#: documented law); min-p and two logit biases; each emitted token's logprob and its 3 most likely
#: tokens' plus the prompt logprobs of sampled sequences (logprob fidelity); a JSON schema output.
SAMPLING = ("--temperature", "0.7", "--top-k", "12", "--top-p", "0.9")
PENALTIES = ("--temperature", "0.9", "--frequency-penalty", "0.6", "--presence-penalty", "0.4")
#: vLLM's repetition penalty counts the prompt's tokens as well as the output's and divides positive
#: logits (multiplies negative ones): the exact-conditional mode refuses it, so the family compares
#: samples with the reference server's (two-sample mode).
REPETITION = ("--temperature", "0.9", "--repetition-penalty", "1.3", "--two-sample")
MIN_P_BIAS = ("--temperature", "0.9", "--min-p", "0.02", "--logit-bias", "5=1.5", "--logit-bias", "9=-2")
LOGPROBS = ("--logprobs", "3")
SCHEMA = ("--json-schema", '{"properties": {"name": {"type": "string"}}, "required": ["name"], "type": "object"}')

#: (suffix, what, options, served fields) of each option family.
_FAMILY_SPECS: tuple[tuple[str, str, tuple[str, ...], dict], ...] = (
    ("t0.7_topk12_topp0.9", "T=0.7, top-k 12, top-p 0.9", SAMPLING, {}),
    ("penalties", "T=0.9, frequency 0.6, presence 0.4", PENALTIES, {}),
    ("minp_bias", "T=0.9, min-p 0.02, logit bias 5=1.5 9=-2", MIN_P_BIAS, {}),
    ("repetition", "T=0.9, repetition penalty 1.3, two-sample against a reference server without speculation",
     REPETITION, {"reference": True}),
    ("logprobs", "T=1, logprobs 3 and prompt logprobs, laws from a reference server without speculation", LOGPROBS,
     {"tokenizer": "ids", "reference": True}),
    ("json_schema", "T=1, a JSON schema output", SCHEMA, {"tokenizer": "characters"}),
)  # fmt: skip

#: Every family on the tiny Llama with each method of :data:`METHODS`, then on the MiMo target with MTP.
FAMILIES: tuple[tuple[Served, ...], ...] = (
    *(family(suffix, what, options, **extra) for suffix, what, options, extra in _FAMILY_SPECS),
    *(family(suffix, what, options, methods=MTP_METHODS, target="mimo", **extra)
      for suffix, what, options, extra in _FAMILY_SPECS),
)  # fmt: skip

# fmt: off
CONFIGS: tuple[Served, ...] = (
    Served("control_no_spec_t1.0", "control: no speculation, T=1", None, inprocess=("e2e_control_no_spec_t1.0",)),
    Served("ngram_k3_t1.0", "ngram, K=3, T=1", "ngram",
           inprocess=("e2e_ngram_k3_t1.0", "e2e_ngram_k3_t1.0_memoize", "e2e_ngram_k3_t1.0_patch_expand")),
    Served("draft_probabilistic_k3_t1.0", "draft model, draft_sample_method=probabilistic, K=3, T=1", "draft_model",
           "probabilistic", inprocess=("e2e_draft_probabilistic_k3_t1.0", "e2e_draft_probabilistic_k3_t1.0_patch_expand",
                                       "e2e_draft_probabilistic_k3_t1.0_patch_expand_seed_global")),
    Served("eagle_k3_t1.0", "EAGLE-1 head, draft_sample_method=greedy (vLLM's default), K=3, T=1", "eagle", "greedy",
           inprocess=("e2e_eagle_k3_t1.0", "e2e_eagle_k3_t1.0_memoize", "e2e_eagle_k3_t1.0_patch_expand")),
    Served("ngram_k3_t1.0_skip_determinism", "ngram, K=3, T=1, --skip-determinism (law tested)", "ngram",
           inprocess=("e2e_ngram_k3_t1.0_memoize",), skip_determinism=True),
    Served("draft_probabilistic_k3_t1.0_skip_determinism",
           "draft model, probabilistic, K=3, T=1, --skip-determinism (law tested)", "draft_model", "probabilistic",
           inprocess=("e2e_draft_probabilistic_k3_t1.0",), skip_determinism=True),
    Served("eagle_k3_t1.0_skip_determinism", "EAGLE-1 head, greedy drafts, K=3, T=1, --skip-determinism (law tested)",
           "eagle", "greedy", inprocess=("e2e_eagle_k3_t1.0_memoize",), skip_determinism=True),
    Served("eagle3_k3_t1.0", "EAGLE-3 head (16 draft tokens of 32), greedy drafts, K=3, T=1", "eagle3", "greedy"),
    Served("eagle3_k3_t1.0_skip_determinism",
           "EAGLE-3 head (16 draft tokens of 32), greedy drafts, K=3, T=1, --skip-determinism (law tested)", "eagle3",
           "greedy", skip_determinism=True),
    # MTP: a tiny MiMo target (a different model) drafts with its own MTP layer; its own control
    Served("control_no_spec_mimo_t1.0", "control: the MiMo target (with an MTP layer), no speculation, T=1", None,
           target="mimo"),
    Served("mtp_k3_t1.0", "MiMo's own MTP layer, greedy drafts, K=3, T=1", "mtp", "greedy", target="mimo"),
    Served("mtp_k3_t1.0_skip_determinism", "MiMo's own MTP layer, greedy drafts, K=3, T=1, --skip-determinism (law tested)",
           "mtp", "greedy", skip_determinism=True, target="mimo"),
    # the option matrix: each option family without speculation and with each method
    *(config for rows in FAMILIES for config in rows),
)
# fmt: on

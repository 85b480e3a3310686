"""End-to-end vLLM speculative decoding (``vllm.LLM(..., speculative_config=...)``) as a decoder.

The decoder protocol of ``docs/design.md``::

    generate(prompt (T,) long, *, num_samples, max_new_tokens, seed) -> (num_samples, max_new_tokens) long

:class:`VllmDecoder` submits ``num_samples`` requests with ``prompt_token_ids=prompt``,
``ignore_eos=True``, ``max_tokens = max_new_tokens`` (no ``min_tokens``: it masks EOS) and per-request seeds
``seed * 1_000_003 + i`` (vLLM's seeded path: one ``torch.Generator`` per request), in one
``LLM.generate`` call, so the batch runs with continuous batching and speculation as in serving.
The target's exact processed conditionals come from the same weights in transformers float32
(:class:`specverify.adapters.hf.HFTarget`, whose processors implement the same temperature,
top-k and top-p).

Models are tiny seeded Llamas (:func:`specverify.adapters.fixtures.llama.tiny_llama`, head size 32
for vLLM's CPU attention) written once to a local directory (no download): the target, a
draft that is the target with Gaussian noise on every matrix (so both the accept and the
residual branch run often), and an EAGLE-1 head in EAGLE's own checkpoint layout
(:func:`specverify.adapters.fixtures.eagle_head.save_tiny_eagle`).  Practical settings for CPU:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``VLLM_CPU_KVCACHE_SPACE=1``, ``enforce_eager=True``, ``skip_tokenizer_init=True``, ``dtype=float32``.
"""

from __future__ import annotations

import os

import torch

from specverify.adapters.fixtures.llama import MODEL_CONFIG, save_tiny_models
from specverify.adapters.runtime import OutputMemo, max_law_difference
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_bool, check_int

__all__ = [
    "VllmDecoder",
    "tiny_decoder",
    "tiny_target",
    "VllmLawTarget",
    "max_conditional_difference",
]

METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")


class VllmDecoder:
    """``vllm.LLM`` with a speculative config behind the decoder protocol (engine built lazily, once).

    Parameters
    ----------
    target_dir : path
        The target model directory.
    method : {"ngram", "draft_model", "eagle", "eagle3", "mtp"}, optional
        Speculation method; None runs the engine without speculation (the control).  ``"mtp"``: the
        target's own multi-token-prediction layers draft (``target_dir`` holds them, e.g.
        :func:`specverify.adapters.fixtures.mtp_model.save_tiny_mtp`; no draft directory).
    k : int
        ``num_speculative_tokens``.
    draft_dir : path, optional
        The draft model (``method="draft_model"``).
    eagle_dir : path, optional
        The EAGLE head (``method="eagle"``): an EAGLE-1 checkpoint directory for the target
        (:func:`specverify.adapters.fixtures.eagle_head.save_tiny_eagle`), loaded by vLLM as
        ``EagleLlamaForCausalLM`` with the target's ``lm_head`` and embedding shared; with
        ``method="eagle3"`` an EAGLE-3 checkpoint with its own draft vocabulary
        (:func:`specverify.adapters.fixtures.eagle3_head.save_tiny_eagle3`), loaded as
        ``Eagle3LlamaForCausalLM``.
    draft_sample_method : {"greedy", "probabilistic"}
        vLLM's ``draft_sample_method`` for draft models and EAGLE (vLLM's default is greedy:
        argmax drafts, ``draft_probs=None``; probabilistic: drafts sampled from the
        temperature-scaled draft law with torch's global generator, q passed to the sampler).
    temperature, top_k, top_p : sampling options (``top_k=0`` / ``top_p=1`` off)
    frequency_penalty, presence_penalty : float
        vLLM's penalties (0: off), sent with every request; their law is :class:`VllmLawTarget`'s.
    patch_expand : bool
        Diagnostic: when the engine is built, replace ``rejection_sampler.expand_batch_to_tokens``
        (for the rest of the process; the engine runs in-process) by a correct pure-torch one,
        :func:`specverify.adapters.vllm.layout.expand_to_tokens` -- vLLM 0.32's CPU override of
        its kernel drops float32/int32 outputs (``reports/vllm/repro_cpu_expand_uninitialized.py``).
    seed_global_rng : bool
        Seed torch's global CPU generator from ``seed`` for each ``generate`` call (inside
        ``torch.random.fork_rng``; the engine runs in-process).  vLLM's probabilistic drafter
        ignores per-request seeds and draws from the global RNG (``compute_probs_and_sample_next_token``,
        ``# TODO(woosuk): Consider seeds.``), so without this its runs are not reproducible.
    memoize : bool
        Diagnostic: a repeated call with the same arguments returns the first call's output, so
        ``check_decoder``'s determinism check cannot stop the statistical tests of an engine that
        is not reproducible (the law is then tested on the first draw; the non-reproducibility
        itself is shown by the same configuration without this option).
    """

    def __init__(
        self,
        target_dir,
        *,
        method=None,
        k=4,
        draft_dir=None,
        eagle_dir=None,
        draft_sample_method="probabilistic",
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        patch_expand=False,
        seed_global_rng=False,
        memoize=False,
    ):
        self.frequency_penalty, self.presence_penalty = float(frequency_penalty), float(presence_penalty)
        self.patch_expand = check_bool("patch_expand", patch_expand)
        self.seed_global_rng = check_bool("seed_global_rng", seed_global_rng)
        self._memo = OutputMemo(memoize)  # validates memoize
        if method is not None and method not in METHODS:
            raise InvalidArgument(f"method must be one of {list(METHODS)} or None, got {method!r}")
        if method == "draft_model" and draft_dir is None:
            raise InvalidArgument("method='draft_model' needs draft_dir")
        if method in ("eagle", "eagle3") and eagle_dir is None:
            raise InvalidArgument(f"method={method!r} needs eagle_dir")
        if draft_sample_method not in ("greedy", "probabilistic"):
            raise InvalidArgument(
                f"draft_sample_method must be 'greedy' or 'probabilistic', got {draft_sample_method!r}"
            )
        self.target_dir, self.draft_dir = str(target_dir), None if draft_dir is None else str(draft_dir)
        self.eagle_dir = None if eagle_dir is None else str(eagle_dir)
        self.method, self.k, self.draft_sample_method = method, check_int("k", k, minimum=1), draft_sample_method
        self.temperature, self.top_k, self.top_p = float(temperature), int(top_k), float(top_p)
        self._llm = None

    def __repr__(self) -> str:
        spec = "no speculation" if self.method is None else f"{self.method}, k={self.k}"
        if self.method in ("draft_model", "eagle", "eagle3", "mtp"):
            spec += f", draft_sample_method={self.draft_sample_method}"
        patched = ""
        if self.frequency_penalty or self.presence_penalty:
            patched += f", frequency_penalty={self.frequency_penalty}, presence_penalty={self.presence_penalty}"
        patched += ", patch_expand=True" if self.patch_expand else ""
        patched += ", seed_global_rng=True" if self.seed_global_rng else ""
        patched += ", memoize=True" if self._memo.enabled else ""
        return f"VllmDecoder({spec}, temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}{patched})"

    def _speculative_config(self):
        if self.method is None:
            return None
        if self.method == "ngram":
            return dict(method="ngram", num_speculative_tokens=self.k, prompt_lookup_max=3, prompt_lookup_min=1)
        if self.method == "mtp":  # the draft is read from the target's own directory
            return dict(method="mtp", num_speculative_tokens=self.k, draft_sample_method=self.draft_sample_method)
        return dict(
            method=self.method,
            model=self.eagle_dir if self.method in ("eagle", "eagle3") else self.draft_dir,
            num_speculative_tokens=self.k,
            draft_sample_method=self.draft_sample_method,
        )

    @property
    def llm(self):
        if self._llm is None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            from vllm import LLM

            if self.patch_expand:
                from vllm.v1.sample import rejection_sampler

                from specverify.adapters.vllm.layout import expand_to_tokens

                rejection_sampler.expand_batch_to_tokens = expand_to_tokens

            self._llm = LLM(
                model=self.target_dir,
                skip_tokenizer_init=True,
                dtype="float32",
                enforce_eager=True,
                gpu_memory_utilization=0.3,
                max_model_len=128,
                seed=0,
                speculative_config=self._speculative_config(),
            )
        return self._llm

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Sample ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long."""
        from vllm import SamplingParams

        n = check_int("num_samples", num_samples, minimum=1)
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        seed = check_int("seed", seed, minimum=0)
        ids = [int(t) for t in torch.as_tensor(prompt).reshape(-1).tolist()]
        key = (tuple(ids), n, L, seed)
        replay = self._memo.lookup(key)
        if replay is not None:
            return replay
        params = [
            SamplingParams(
                temperature=self.temperature,
                top_k=self.top_k if self.top_k > 0 else 0,
                top_p=self.top_p,
                frequency_penalty=self.frequency_penalty,
                presence_penalty=self.presence_penalty,
                max_tokens=L,
                ignore_eos=True,
                seed=(seed * 1_000_003 + i) % (2**63 - 1),
                detokenize=False,
            )
            for i in range(n)
        ]
        llm = self.llm
        prompts = [{"prompt_token_ids": ids}] * n
        if self.seed_global_rng:
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(seed)
                outputs = llm.generate(prompts, params, use_tqdm=False)
        else:  # no fork: restoring the global state after each call would hide an engine drawing from it
            outputs = llm.generate(prompts, params, use_tqdm=False)
        rows = [list(o.outputs[0].token_ids) for o in outputs]
        bad = [i for i, r in enumerate(rows) if len(r) != L]
        if bad:
            raise ImplementationError(f"vLLM returned {len(rows[bad[0]])} tokens for sample {bad[0]}, want {L}")
        tokens = torch.tensor(rows, dtype=torch.long)  # (num_samples, max_new_tokens)
        return self._memo.store(key, tokens)


def tiny_decoder(
    *,
    method="ngram",
    k=4,
    draft_sample_method="probabilistic",
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=0,
    patch_expand=False,
    seed_global_rng=False,
    memoize=False,
    eagle_fc_bias=False,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    model=None,
):
    """:class:`VllmDecoder` on the tiny seeded target and its perturbed draft or EAGLE head.

    ``method="none"``: no speculation; ``method="eagle"``: the head of
    :func:`specverify.adapters.fixtures.eagle_head.save_tiny_eagle` for ``seed``, with ``fc.bias`` and
    ``"bias": true`` in its config when ``eagle_fc_bias``; ``method="eagle3"``: the head of
    :func:`specverify.adapters.fixtures.eagle3_head.save_tiny_eagle3` (16 draft tokens of 32);
    ``method="mtp"``: the target is :func:`specverify.adapters.fixtures.mtp_model.save_tiny_mtp`'s
    MiMo model (its own MTP layer drafts), not the tiny Llama.  ``model`` (``"llama"`` or ``"mimo"``,
    :func:`tiny_target`'s), when given, must name that target.
    """
    from specverify.adapters.fixtures.eagle3_head import save_tiny_eagle3
    from specverify.adapters.fixtures.eagle_head import save_tiny_eagle

    if method != "none" and method not in METHODS:
        raise InvalidArgument(f"method must be one of {['none', *METHODS]}, got {method!r}")
    if model is not None and model != ("mimo" if method == "mtp" else "llama"):
        raise InvalidArgument(f"model={model!r} is not method={method!r}'s target (mtp: 'mimo', else 'llama')")
    target_dir, draft_dir = save_tiny_models(seed=seed)
    eagle_dir = None
    if method == "eagle":
        eagle_dir = save_tiny_eagle(seed=seed, fc_bias=eagle_fc_bias)
    elif method == "eagle3":
        eagle_dir = save_tiny_eagle3(seed=seed)
    elif method == "mtp":
        from specverify.adapters.fixtures.mtp_model import save_tiny_mtp

        target_dir = save_tiny_mtp(seed=seed)
    return VllmDecoder(
        target_dir,
        method=None if method == "none" else method,
        k=k,
        draft_dir=draft_dir,
        eagle_dir=eagle_dir,
        draft_sample_method=draft_sample_method,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        patch_expand=patch_expand,
        seed_global_rng=seed_global_rng,
        memoize=memoize,
    )


class VllmLawTarget:
    """The target protocol under vLLM's documented law: a transformers model's float32 logits processed in
    float64 by the reference processors (``engine="vllm"``: logit bias, penalties -- frequency and
    presence over the output, repetition over prompt and output -- temperature, min-p, top-k, top-p).

    ``sequences[:, :start]`` of :meth:`conditionals` is the prompt; :meth:`next_token_probs` takes the
    whole prefix as the prompt.
    """

    def __init__(self, model, sampling):
        self.model, self.sampling = model, sampling
        self.vocab_size = int(model.config.vocab_size)

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model(input_ids=tokens).logits.double()  # (B, S, V)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, V) float64."""
        from specverify_reference.penalties import History
        from specverify_reference.processors import logits_to_probs

        B, T = prefix.shape
        logits = self._logits(prefix)[:, -1:]  # (B, 1, V)
        history = History(prefix.long(), T, torch.full((B, 1), T, dtype=torch.long))
        return logits_to_probs(logits, self.sampling, history=history)[:, 0]  # (B, V)

    def conditionals(self, sequences: torch.Tensor, *, start: int) -> torch.Tensor:
        """(B, S) -> (B, S - start, V) float64: the law of token ``start + j`` after ``sequences[:, :start + j]``."""
        from specverify_reference.penalties import History
        from specverify_reference.processors import logits_to_probs

        B, S = sequences.shape
        logits = self._logits(sequences[:, :-1])[:, start - 1 :]  # (B, S - start, V)
        ends = torch.arange(start, S, dtype=torch.long).expand(B, -1)  # (B, S - start)
        return logits_to_probs(logits, self.sampling, history=History(sequences.long(), start, ends))


def tiny_target(*, temperature=1.0, top_k=0, top_p=1.0, seed=0, frequency_penalty=0.0, presence_penalty=0.0,
                model="llama"):  # fmt: skip
    """Exact processed conditionals of :func:`tiny_decoder`'s target, in transformers float32 (with a
    penalty: :class:`VllmLawTarget`, vLLM's law).  ``model="mimo"``: the MiMo target of ``method="mtp"``
    (its checkpoint read as transformers' ``Qwen2ForCausalLM``, which drops the MTP layer, as vLLM's
    ``MiMoForCausalLM`` loader does)."""
    from specverify.adapters.fixtures.llama import tiny_llama
    from specverify.adapters.hf import HFTarget

    if model not in ("llama", "mimo"):
        raise InvalidArgument(f"model must be 'llama' or 'mimo', got {model!r}")
    if model == "mimo":
        from transformers import Qwen2ForCausalLM

        from specverify.adapters.fixtures.mtp_model import save_tiny_mtp

        model = Qwen2ForCausalLM.from_pretrained(save_tiny_mtp(seed=seed), torch_dtype=torch.float32).eval()
    else:
        model = tiny_llama(num_key_value_heads=2, seed=seed, **MODEL_CONFIG)
    if frequency_penalty or presence_penalty:
        from specverify_reference.processors import SamplingConfig

        sampling = SamplingConfig(temperature=temperature, top_k=top_k or None, top_p=None if top_p >= 1 else top_p,
                                  engine="vllm", frequency_penalty=frequency_penalty, presence_penalty=presence_penalty)  # fmt: skip
        return VllmLawTarget(model, sampling)
    return HFTarget(model, temperature=temperature, top_k=top_k, top_p=top_p, num_threads=1)


def max_conditional_difference(*, seed: int = 0, num_sequences: int = 8, length: int = 12) -> float:
    """Largest |p_vLLM - p_transformers| over the raw next-token laws of random sequences (tiny target).

    vLLM's are its ``prompt_logprobs=-1`` (every token's log-probability at every prompt
    position, ``max_logprobs=-1``) from a separate engine without speculation; transformers'
    are float32 ``softmax(logits)`` of the same weights.  Sequences are drawn from a
    ``torch.Generator`` seeded with ``seed``.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from specverify.adapters.fixtures.llama import tiny_llama

    target_dir, _ = save_tiny_models(seed=seed)
    V = MODEL_CONFIG["vocab_size"]
    llm = LLM(
        model=str(target_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=128,
        max_logprobs=-1,
        seed=0,
    )
    params = SamplingParams(max_tokens=1, prompt_logprobs=-1, detokenize=False)

    def laws(sequences: torch.Tensor) -> torch.Tensor:
        outs = llm.generate([{"prompt_token_ids": s.tolist()} for s in sequences], params, use_tqdm=False)
        logp = torch.zeros(len(outs), sequences.shape[1] - 1, V, dtype=torch.float64)  # (N, T - 1, V)
        for b, out in enumerate(outs):
            for t, entry in enumerate(out.prompt_logprobs[1:]):  # entry t: law of token t+1 given sequences[b, :t+1]
                for token, logprob in entry.items():
                    logp[b, t, token] = float(getattr(logprob, "logprob", logprob))
        return logp.exp()  # (N, T - 1, V)

    model = tiny_llama(num_key_value_heads=2, seed=seed, **MODEL_CONFIG)
    return max_law_difference(laws, model, vocab_size=V, seed=seed, num_sequences=num_sequences, length=length)

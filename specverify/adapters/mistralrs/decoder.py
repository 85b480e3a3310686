"""mistral.rs (PyPI ``mistralrs``) behind the decoder protocol, and the exact law of its sampler.

The decoder protocol of ``docs/design.md``::

    generate(prompt (T,) long, *, num_samples, max_new_tokens, seed) -> (num_samples, max_new_tokens) long

:class:`MistralRsDecoder` builds a ``mistralrs.Runner`` on the tiny target (``Which.Plain``,
``ModelDType.F32``, ``max_seqs=1``, the KV cache in float32: below) and sends one ``CompletionRequest`` per sample (the prompt's
text, ``max_tokens=max_new_tokens``, ``ignore_eos=True``, the sampling options), one after
another; each completion's text maps back to ids character by character
(:mod:`~specverify.adapters.mistralrs.model`).

**Seeding.**  mistral.rs takes no per-request seed.  The engine draws every sampled token from
one ``Isaac64Rng`` that ``Engine::run`` seeds with the constant ``SEED = 0``
(``mistralrs-core/src/engine/mod.rs``) when the engine starts; ``Runner(seed=...)`` seeds only
candle's device RNG, and on CPU raises ``ValueError: cannot seed the CPU rng with set_seed``.  So
a call is made reproducible the only way the engine allows: every ``generate`` call builds a
fresh ``Runner`` (about 0.05 s for the tiny model) and sends its requests in a fixed order, so
the same call returns the same rows.  The protocol's ``seed`` is validated but cannot change the
draws: calls with different seeds (and different prompts) start from the same random stream.
Rows within a call are consecutive stretches of one stream, hence independent.  Requests with
``n_choices > 1`` are batched by the scheduler in an order that is not reproducible (two fresh
Runners gave different rows), so they are not used.

**The KV cache.**  Even for an ``F32`` model, mistral.rs 0.9.5 stores the KV cache in float16 on
CPUs with fast fp16 kernels (x86-64 with AVX-512F or AVX2 + FMA + F16C; aarch64 with fp16 + fhm)
unless ``MISTRALRS_CPU_KV_F32`` is set to anything but ``"0"`` (``cpu_kv_f16``,
``mistralrs-core/src/kv_cache/mod.rs``; the engine logs "Using f16 KV cache on CPU").  Keys and
values rounded to float16 move the tiny model's log-probabilities by up to about 1e-3 at every
position (the first included: a one-token prompt's attention output is its value vector), so the
engine's law is then not the float32 forward of its weights.  Every Runner here is built with
``MISTRALRS_CPU_KV_F32=1`` (:data:`KV_F32_ENV`), which the engine reads once per process (a
``OnceLock``): :func:`_runner` sets it before the process's first Runner and refuses a later one
that asks for the other setting.  With it the engine's raw conditionals match transformers'
float32 forward to float32 rounding (:func:`max_conditional_difference`).

**Speculation.**  The only speculative decoding mistral.rs 0.9.5 offers from Python is an MTP
assistant (``Runner(mtp_model=..., mtp_n_predict=...)``: Gemma 4 assistants, Qwen3.5 / Qwen3.8
built-in heads, DFlash drafters; the target/draft-model path was removed).  It needs
PagedAttention, which this CPU build does not have: ``assistant="draft"`` attaches the tiny draft
as ``mtp_model`` and the engine refuses it before looking at the model (:class:`ImplementationError`
with its message; see :func:`runner_probe`).

:class:`MistralRsTarget` gives the exact law: the same weights in transformers float32, each
position's logits processed by :func:`~specverify.adapters.mistralrs.sampler_chain.processed_probs`
in float64.  :func:`max_conditional_difference` compares mistral.rs's own law (its top
log-probabilities over the whole vocabulary) with transformers', with the KV cache in float32 (the
audited setting) or float16 (the engine's CPU default).  mistralrs is imported inside
functions only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from specverify.adapters.mistralrs.model import VOCAB_SIZE, ids_to_text, save_tiny_mistralrs, text_to_ids
from specverify.adapters.mistralrs.sampler_chain import SamplerOptions, processed_probs, sampler_options
from specverify.adapters.runtime import OutputMemo, max_law_difference
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_int, check_shape, check_tokens

__all__ = [
    "INSTALL",
    "ASSISTANTS",
    "KV_F32_ENV",
    "MistralRsDecoder",
    "MistralRsTarget",
    "tokens_from_texts",
    "tiny_decoder",
    "tiny_target",
    "max_conditional_difference",
    "runner_probe",
    "engine_raw_law",
    "engine_version",
]

#: One shell command, run from the repository root (the virtualenv lands in ``.venvs/mistralrs``).
INSTALL = (
    "python -m venv .venvs/mistralrs && . .venvs/mistralrs/bin/activate && pip install torch==2.13.0 && "
    'pip install mistralrs==0.9.5 && pip install -e ".[test,plots,hf]"'
)
ASSISTANTS = (None, "draft")
MAX_CONTEXT = 256  # the tiny Llama's max_position_embeddings
RAW_TEMPLATE = "{{ messages[0]['content'] }}"
#: The engine's switch from its float16 CPU KV cache to float32 (module docstring), read once per process.
KV_F32_ENV = "MISTRALRS_CPU_KV_F32"
_KV_IN_FORCE: list[str] = []  # the value set for this process's first Runner


def _set_kv_cache(kv_f32: bool) -> None:
    """Set :data:`KV_F32_ENV` for the next Runner; ImplementationError if this process already used the other one."""
    want = "1" if kv_f32 else "0"
    if _KV_IN_FORCE and _KV_IN_FORCE[0] != want:
        raise ImplementationError(
            f"{KV_F32_ENV}={_KV_IN_FORCE[0]} is already in force in this process (mistral.rs reads it once); "
            f"a Runner with {KV_F32_ENV}={want} needs a fresh process"
        )
    os.environ[KV_F32_ENV] = want
    if not _KV_IN_FORCE:
        _KV_IN_FORCE.append(want)


def _import_mistralrs():
    try:
        import mistralrs
    except ImportError as error:
        raise ImportError(
            f"specverify.adapters.mistralrs needs mistralrs ({error}); install it in its own virtualenv: {INSTALL}"
        ) from error
    return mistralrs


def engine_version() -> str:
    """The installed ``mistralrs`` distribution's version (ImportError naming the install line without it)."""
    import importlib.metadata as md

    _import_mistralrs()
    return md.version("mistralrs")


def tokens_from_texts(texts, *, num_samples: int, max_new_tokens: int) -> torch.Tensor:
    """Completion texts -> (num_samples, max_new_tokens) long ids; ImplementationError if one is malformed."""
    texts = list(texts)
    if len(texts) != num_samples:
        raise ImplementationError(f"mistralrs returned {len(texts)} completions, want {num_samples}")
    rows = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ImplementationError(f"mistralrs completion {i} is {type(text).__name__}, not text")
        try:
            ids = text_to_ids(text)
        except ValueError as error:
            raise ImplementationError(f"mistralrs completion {i} ({text!r}): {error}") from None
        if len(ids) != max_new_tokens:
            raise ImplementationError(
                f"mistralrs completion {i} ({text!r}) has {len(ids)} tokens, want max_new_tokens={max_new_tokens}"
            )
        rows.append(ids)
    return torch.tensor(rows, dtype=torch.long).reshape(num_samples, max_new_tokens)  # (N, L)


def _runner(model_dir, *, mtp_model=None, mtp_n_predict=None, kv_f32=True, **kwargs):
    """A fresh ``mistralrs.Runner`` on a local directory (float32 weights, one sequence at a time).

    ``kv_f32``: the KV cache in float32 (True, the audited setting) or the engine's CPU default
    (False: float16 where the CPU has fast fp16 kernels); see the module docstring.
    """
    mistralrs = _import_mistralrs()
    _set_kv_cache(kv_f32)
    which = mistralrs.Which.Plain(model_id=str(model_dir), dtype=mistralrs.ModelDType.F32)
    spec = {} if mtp_model is None else dict(mtp_model=str(mtp_model), mtp_n_predict=mtp_n_predict)
    try:
        return mistralrs.Runner(which=which, max_seqs=1, token_source="none", **spec, **kwargs)
    except Exception as error:  # the binding raises ValueError for every engine error
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ImplementationError(f"mistralrs.Runner({_describe({**spec, **kwargs})}) failed: {message}") from None


def _describe(kwargs: dict) -> str:
    """``key=value`` for the Runner arguments of an error message (paths by their last two parts)."""
    parts = []
    for key, value in kwargs.items():
        if isinstance(value, str) and "/" in value:
            value = "/".join(Path(value).parts[-2:])
        parts.append(f"{key}={value!r}")
    return ", ".join(parts)


class MistralRsDecoder:
    """``mistralrs.Runner`` completions behind the decoder protocol (module docstring: seeding).

    Parameters
    ----------
    model_dir : path
        The target's mistral.rs directory.
    assistant : {None, "draft"}
        None: plain decoding (the control); ``"draft"``: ``Runner(mtp_model=draft_dir,
        mtp_n_predict=mtp_n_predict)`` (refused on CPU: :class:`ImplementationError`).
    draft_dir : path, optional
        The assistant's directory (``assistant="draft"``).
    mtp_n_predict : int
        Draft tokens per speculative step.
    memoize : bool
        Diagnostic replay of repeated calls (:class:`specverify.adapters.runtime.OutputMemo`).
    **options
        Sampler options (:func:`~specverify.adapters.mistralrs.sampler_chain.sampler_options`).
    """

    def __init__(self, model_dir, *, assistant=None, draft_dir=None, mtp_n_predict=3, memoize=False, **options):
        if assistant not in ASSISTANTS:
            raise InvalidArgument(f"assistant must be one of {list(ASSISTANTS)}, got {assistant!r}")
        if assistant == "draft" and draft_dir is None:
            raise InvalidArgument("assistant='draft' needs draft_dir")
        self.model_dir, self.assistant, self.draft_dir = str(model_dir), assistant, draft_dir
        self.mtp_n_predict = check_int("mtp_n_predict", mtp_n_predict, minimum=1)
        self.options: SamplerOptions = sampler_options(**options)
        self._memo = OutputMemo(memoize)
        self.vocab_size = VOCAB_SIZE

    def __repr__(self) -> str:
        spec = "no draft" if self.assistant is None else f"MTP assistant, mtp_n_predict={self.mtp_n_predict}"
        return f"MistralRsDecoder({spec}, {self.options})"

    def runner(self):
        """A fresh Runner for one call (the engine's random stream restarts at its constant seed)."""
        if self.assistant is None:
            return _runner(self.model_dir)
        return _runner(self.model_dir, mtp_model=self.draft_dir, mtp_n_predict=self.mtp_n_predict)

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Sample ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long.

        ``seed`` is validated and keys the memo; the engine has no seed to give it (module docstring).
        """
        mistralrs = _import_mistralrs()
        n = check_int("num_samples", num_samples, minimum=1)
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        seed = check_int("seed", seed, minimum=0)
        prompt = torch.as_tensor(prompt).reshape(-1)  # (T,)
        check_tokens("prompt", prompt, self.vocab_size)
        if prompt.numel() == 0:
            raise InvalidArgument("prompt must hold at least one token")
        if prompt.numel() + L + self.mtp_n_predict + 1 > MAX_CONTEXT:
            raise InvalidArgument(f"prompt ({prompt.numel()}) + max_new_tokens ({L}) exceed the context {MAX_CONTEXT}")
        text = ids_to_text(prompt.tolist())
        key = (text, n, L, seed)
        replay = self._memo.lookup(key)
        if replay is not None:
            return replay
        runner, kwargs, texts = self.runner(), self.options.request_kwargs(), []
        for _ in range(n):
            request = mistralrs.CompletionRequest(prompt=text, model="tiny", max_tokens=L, ignore_eos=True, **kwargs)
            try:
                response = runner.send_completion_request(request)
            except Exception as error:
                raise ImplementationError(f"mistralrs completion request failed: {error}") from None
            if len(response.choices) != 1:
                raise ImplementationError(f"mistralrs returned {len(response.choices)} choices for one request")
            if response.usage.prompt_tokens != prompt.numel():
                raise ImplementationError(
                    f"mistralrs read the prompt as {response.usage.prompt_tokens} tokens, want {prompt.numel()}"
                )
            texts.append(response.choices[0].text)
        del runner
        tokens = tokens_from_texts(texts, num_samples=n, max_new_tokens=L)  # (N, L)
        return self._memo.store(key, tokens)


class MistralRsTarget:
    """Exact processed conditionals of mistral.rs's sampler on the tiny target's weights.

    Raw logits: transformers float32 on the Hugging Face directory the mistral.rs directory was
    copied from (the engine's own with its KV cache in float32, as :class:`MistralRsDecoder` runs
    it, to float32 rounding: :func:`max_conditional_difference`); each position processed by
    :func:`~specverify.adapters.mistralrs.sampler_chain.processed_probs` with the context before
    it (``conditionals(sequences, start)`` takes ``sequences[:, :start]`` as the prompt).

    Parameters
    ----------
    hf_dir : path
        The target's Hugging Face directory.
    **options
        Sampler options, as :class:`MistralRsDecoder`'s.
    """

    def __init__(self, hf_dir, **options):
        from transformers import LlamaForCausalLM

        self.hf_dir = str(hf_dir)
        self.options = sampler_options(**options)
        self.model = LlamaForCausalLM.from_pretrained(self.hf_dir, dtype=torch.float32).eval()
        self.vocab_size = VOCAB_SIZE

    def __repr__(self) -> str:
        return f"MistralRsTarget({self.hf_dir!r}, {self.options})"

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of every position (B, S) -> (B, S, V)."""
        check_shape("sequences", sequences, (None, None))
        check_tokens("sequences", sequences, self.vocab_size)
        with torch.no_grad():
            return self.model(input_ids=sequences.to(torch.long)).logits.to(torch.float32)  # (B, S, V)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Law of the first token a completion of ``prefix`` emits, (B, T) -> (B, V) float64."""
        logits = self.logits(prefix)[:, -1]  # (B, V)
        return processed_probs(logits, self.options, context=prefix, prompt_len=prefix.shape[1])

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced laws of ``sequences[:, start:]`` given the prompt ``sequences[:, :start]``: (B, S - start, V)."""
        S = check_shape("sequences", sequences, (None, None)).shape[1]
        start = check_int("start", start, minimum=1, maximum=S - 1)
        logits = self.logits(sequences)  # (B, S, V)
        steps = [
            processed_probs(logits[:, t - 1], self.options, context=sequences[:, :t], prompt_len=start)
            for t in range(start, S)
        ]
        return torch.stack(steps, dim=1)  # (B, S - start, V)


def tiny_decoder(*, assistant=None, mtp_n_predict=3, memoize=False, seed=0, **options):
    """:class:`MistralRsDecoder` on the tiny seeded target (and its perturbed draft for ``assistant="draft"``)."""
    assistant = None if assistant in (None, "none") else assistant
    target_dir, draft_dir, _ = save_tiny_mistralrs(seed=seed)
    return MistralRsDecoder(
        target_dir, assistant=assistant, draft_dir=draft_dir, mtp_n_predict=mtp_n_predict, memoize=memoize, **options
    )


def tiny_target(*, seed=0, **options):
    """Exact processed conditionals of :func:`tiny_decoder`'s target (transformers float32, sampler in float64)."""
    _, _, hf_dir = save_tiny_mistralrs(seed=seed)
    return MistralRsTarget(hf_dir, **options)


def _chat_runner(model_dir, *, kv_f32=True):
    """A Runner that takes a chat message as the raw prompt (a one-line template), for log-probabilities."""
    template = Path(model_dir).parent / "raw_prompt.jinja"
    if not template.exists():
        template.write_text(RAW_TEMPLATE)
    return _runner(model_dir, jinja_explicit=str(template), kv_f32=kv_f32)


def max_conditional_difference(
    *, seed: int = 0, num_sequences: int = 8, length: int = 12, kv_f32: bool = True
) -> float:
    """Largest |p_mistral.rs - p_transformers| over the raw next-token laws of random sequences (tiny target).

    mistral.rs's law after each prefix of each sequence is read from a one-token chat completion at
    temperature 1 with ``logprobs=True, top_logprobs=V`` (its reporting law: the softmax of its
    logits at the request's temperature, before top-k / top-p / min-p); transformers' from the
    float32 logits of the same weights.  Sequences are drawn from a ``torch.Generator`` seeded with
    ``seed``.  ``kv_f32``: the engine's KV cache in float32 (the audited setting) or its CPU default
    (float16); the process keeps the first setting it used (module docstring).
    """
    mistralrs = _import_mistralrs()
    target_dir, _, hf_dir = save_tiny_mistralrs(seed=seed)
    runner = _chat_runner(target_dir, kv_f32=kv_f32)
    target = MistralRsTarget(hf_dir)

    def laws(sequences: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((*sequences.shape, VOCAB_SIZE), dtype=torch.float64)  # (N, T, V)
        for i, row in enumerate(sequences.tolist()):
            for t in range(1, len(row) + 1):
                out[i, t - 1] = _one_token_law(mistralrs, runner, row[:t])
        return out

    return max_law_difference(
        laws, target.model, vocab_size=VOCAB_SIZE, seed=seed, num_sequences=num_sequences, length=length
    )


def engine_raw_law(prefix, *, seed: int = 0, kv_f32: bool = True) -> torch.Tensor:
    """mistral.rs's own raw law (T = 1, no truncation) of the token after ``prefix`` on the tiny target: (V,) float64.

    Read from a one-token chat completion with ``logprobs=True, top_logprobs=V`` (the softmax of the
    engine's float32 logits); ``kv_f32`` as in :func:`max_conditional_difference`.
    """
    mistralrs = _import_mistralrs()
    target_dir, _, _ = save_tiny_mistralrs(seed=seed)
    return _one_token_law(mistralrs, _chat_runner(target_dir, kv_f32=kv_f32), prefix)


def _one_token_law(mistralrs, runner, prefix) -> torch.Tensor:
    """The law after ``prefix`` from a one-token chat completion with ``top_logprobs=V``: (V,) float64."""
    request = mistralrs.ChatCompletionRequest(
        messages=[{"role": "user", "content": ids_to_text(list(prefix))}],
        model="tiny",
        max_tokens=1,
        temperature=1.0,
        logprobs=True,
        top_logprobs=VOCAB_SIZE,
        ignore_eos=True,
    )
    top = runner.send_chat_completion_request(request).choices[0].logprobs.content[0].top_logprobs
    law = torch.zeros(VOCAB_SIZE, dtype=torch.float64)  # (V,)
    for entry in top:
        law[int(entry.token)] = torch.tensor(entry.logprob, dtype=torch.float64).exp()
    return law


def runner_probe(*, seed: int = 0, rows: int = 16) -> dict:
    """What this build of mistral.rs does on CPU, as recorded facts (strings and booleans).

    * ``mtp``: the error of ``Runner(mtp_model=<tiny draft>, mtp_n_predict=3)`` (None if it loads);
    * ``mtp_paged``: the same with ``paged_attn=True``;
    * ``seed``: the error of ``Runner(seed=1)`` as the process's first Runner (run in a child
      process: the binding seeds its device once per process, so a later ``seed=`` is ignored
      silently); ``seed_later``: the same after another Runner was built (None: no error);
    * ``fresh_runners_agree``: whether two fresh Runners give the same ``rows`` completions of one
      prompt at T = 1 (the engine's stream restarts at its constant seed).
    """
    target_dir, draft_dir, _ = save_tiny_mistralrs(seed=seed)

    def error_of(**kwargs):
        try:
            _runner(target_dir, **kwargs)
        except ImplementationError as error:
            return str(error)
        return None

    code = (
        "import sys; from specverify.adapters.mistralrs.decoder import _runner\n"
        "try:\n    _runner(sys.argv[1], seed=1)\nexcept Exception as e:\n    print(e)\n"
    )
    child = subprocess.run([sys.executable, "-c", code, str(target_dir)], capture_output=True, text=True, check=False)
    seed_error = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else None
    decoder = MistralRsDecoder(target_dir)
    prompt = torch.tensor([3, 7, 9])
    a = decoder.generate(prompt, num_samples=rows, max_new_tokens=6, seed=seed)  # (rows, 6)
    b = decoder.generate(prompt, num_samples=rows, max_new_tokens=6, seed=seed + 1)  # (rows, 6)
    return dict(
        mtp=error_of(mtp_model=draft_dir, mtp_n_predict=3),
        mtp_paged=error_of(mtp_model=draft_dir, mtp_n_predict=3, paged_attn=True),
        seed=seed_error,
        seed_later=error_of(seed=1),
        fresh_runners_agree=bool(torch.equal(a, b)),
        rows=rows,
    )

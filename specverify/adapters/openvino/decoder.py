"""OpenVINO GenAI speculative decoding (``LLMPipeline(..., draft_model=...)``) as a decoder.

The decoder protocol of ``docs/design.md``::

    generate(prompt (T,) long, *, num_samples, max_new_tokens, seed) -> (num_samples, max_new_tokens) long

:class:`OpenVINODecoder` runs ``openvino_genai.LLMPipeline(target, "CPU", draft_model=draft_model(draft,
"CPU"), scheduler_config=...)`` (prefix caching off) with ``do_sample=True``, ``num_assistant_tokens``,
temperature, top-k and top-p, ``ignore_eos=True`` (not ``min_new_tokens``: it masks EOS and changes
the conditionals) and one ``rng_seed`` per sample: the engine seeds one ``std::mt19937`` per request
from it, so a batch of rows sharing a seed would be identical copies.  The per-sample seeds are
distinct 32-bit draws of a ``torch.Generator`` seeded with the protocol's ``seed``
(:func:`sample_seeds`; ``mt19937`` keeps 32 bits of its seed).  ``pipeline="llm"`` calls
``LLMPipeline.generate`` once per sample with a token-id ``ov.Tensor`` (1, T) and reads the token
ids of ``EncodedResults.tokens``; ``pipeline="continuous"`` submits all samples at once to
``ContinuousBatchingPipeline.generate`` (one request per sample, scheduled together as in
serving).  Without a draft model the same pipeline is the control.  Both models run with
``INFERENCE_PRECISION_HINT`` f32 and an f32 KV cache (``precision="f32"``): the CPU plugin's
defaults (bf16 where the CPU has it, a u8 KV cache) sample from a different law than the f32
target -- tokens outside the top-k/top-p support of the exact law -- which is a precision
choice, not the speculative rule (``precision="default"`` keeps them, for the diagnostic).

The exact processed conditionals (:class:`OpenVINOTarget`) come from the exported target compiled
directly with OpenVINO (``INFERENCE_PRECISION_HINT`` f32, full prefix per call, stateful KV reset),
processed by :func:`reference.processors.logits_to_probs` in float64 -- the order OpenVINO GenAI
applies (top-k, temperature, top-p) gives the same law.  :func:`max_conditional_difference`
compares the raw laws with the same weights in transformers float32.

Models are the tiny seeded Llamas of :func:`specverify.adapters.fixtures.llama.save_tiny_models`
(target, and a draft that is the target with Gaussian noise on every matrix, so both the accept
and the residual branch run often), exported offline by optimum-intel (``text-generation-with-past``,
fp32, stateful) into a cache directory keyed by seed and noise (:func:`export_tiny_models`).  The
pipeline needs the converted OpenVINO tokenizer in the model directory even with token-id inputs
(without it construction fails in ``Tokenizer::encode``); it is never used on our ids.

Install (own virtualenv; see :data:`INSTALL`).  References: openvino.genai
``src/cpp/src/sampling/sampler.cpp`` (``validate_candidate``, ``get_p_prime``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from specverify.adapters.runtime import OutputMemo, cache_root, max_law_difference
from specverify.core.errors import ImplementationError, InvalidArgument
from specverify.core.validation import check_bool, check_float, check_int, check_shape, check_tokens

__all__ = [
    "INSTALL",
    "export_tiny_models",
    "sample_seeds",
    "sampling_options",
    "tokens_from_rows",
    "OpenVINODecoder",
    "OpenVINOTarget",
    "tiny_decoder",
    "tiny_target",
    "max_conditional_difference",
    "engine_version",
]

#: One shell command, run from the repository root (the virtualenv lands in ``.venvs/openvino``).
#: torch is pinned to the reports' 2.13.0 and taken from PyTorch's CPU wheel index (2.13.0+cpu, and
#: a torchvision built for it); where that index is unreachable and pip is preset with a local
#: torch 2.13.0+cpu wheel, pip takes PyPI's torchvision, a CUDA build that cannot load next to the
#: +cpu torch (``operator torchvision::nms does not exist``) and breaks optimum's exporter, so the
#: command removes torchvision when it cannot be imported.  optimum-intel uses it only for vision
#: models; ``pip check`` then reports just that missing requirement.
INSTALL = (
    "python -m venv .venvs/openvino && . .venvs/openvino/bin/activate && "
    "pip install 'openvino-genai==2026.4.*' 'optimum-intel[openvino]==2.2.*' torch==2.13.0 "
    "--extra-index-url https://download.pytorch.org/whl/cpu && "
    "(python -c 'import torchvision' 2>/dev/null || pip uninstall -y torchvision) && "
    'pip install -e ".[test,plots]"'
)
PIPELINES = ("llm", "continuous")
#: ``precision="f32"``: the properties that make both models compute (and cache keys/values) in
#: float32, as the exact target does; ``"default"`` leaves the CPU plugin's defaults (bf16
#: inference where the CPU has it, a compressed KV cache).
PRECISION = {"f32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}, "default": {}}
#: Requests per ``ContinuousBatchingPipeline.generate`` call.
CHUNK = 1024
#: Rows per OpenVINO inference of the exact target.
TARGET_CHUNK = 2048


def _import_openvino():
    try:
        import openvino
        import openvino_genai
    except ImportError as error:
        raise ImportError(
            f"specverify.adapters.openvino needs openvino-genai ({error}); install it in its own virtualenv: {INSTALL}"
        ) from error
    return openvino, openvino_genai


def engine_version() -> str:
    """``openvino_genai.__version__`` (ImportError naming the install line without it)."""
    return _import_openvino()[1].__version__


def sampling_options(temperature=1.0, top_k=0, top_p=1.0) -> dict:
    """Validate sampling options: temperature > 0, ``top_k`` >= 0 (0 off), ``top_p`` in (0, 1] (1 off).

    ``temperature`` and ``top_p`` must be ints or floats (not bools, strings or tensors).
    """
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"{name} must be an int or a float, got {value!r}")
    temperature = check_float("temperature", temperature, minimum=0.0, exclusive_minimum=True)
    top_k = check_int("top_k", top_k, minimum=0)
    top_p = check_float("top_p", top_p, minimum=0.0, maximum=1.0, exclusive_minimum=True)
    return dict(temperature=temperature, top_k=top_k, top_p=top_p)


def sample_seeds(seed: int, num_samples: int) -> list[int]:
    """``num_samples`` distinct ``rng_seed`` values in [0, 2**32) drawn from a generator seeded with ``seed``."""
    seed = check_int("seed", seed, minimum=0)
    n = check_int("num_samples", num_samples, minimum=1, maximum=2**31)
    generator = torch.Generator().manual_seed(seed)
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for value in torch.randint(0, 2**32, (n - len(seeds),), generator=generator).tolist():  # (n',)
            if value not in seen:
                seen.add(value)
                seeds.append(value)
    return seeds


def tokens_from_rows(rows, *, num_samples: int, max_new_tokens: int, vocab_size: int) -> torch.Tensor:
    """Validate the engine's token-id rows -> (num_samples, max_new_tokens) long; else ImplementationError."""
    rows = [list(r) for r in rows]
    if len(rows) != num_samples:
        raise ImplementationError(f"OpenVINO GenAI returned {len(rows)} sequences, want {num_samples}")
    for i, row in enumerate(rows):
        if len(row) != max_new_tokens:
            raise ImplementationError(
                f"OpenVINO GenAI returned {len(row)} tokens for sample {i}, want max_new_tokens={max_new_tokens}: {row}"
            )
        bad = [t for t in row if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ImplementationError(f"OpenVINO GenAI sample {i} holds token ids outside [0, {vocab_size}): {bad}")
    return torch.tensor(rows, dtype=torch.long).reshape(num_samples, max_new_tokens)  # (N, L)


def _export(src: Path, dst: Path) -> None:
    """optimum-intel export of one Hugging Face directory (fp32, stateful, with the OV tokenizer), atomically."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    tmp = Path(tempfile.mkdtemp(prefix=dst.name + ".", dir=dst.parent))
    try:
        main_export(
            model_name_or_path=str(src),
            output=tmp,
            task="text-generation-with-past",
            ov_config=OVConfig(dtype="fp32"),
            stateful=True,
            convert_tokenizer=True,
            library_name="transformers",
            local_files_only=True,
        )
        if not (tmp / "openvino_model.xml").exists():
            raise RuntimeError(f"optimum-intel wrote no openvino_model.xml into {tmp}")
        try:
            tmp.rename(dst)
        except OSError:  # another process finished first
            if not (dst / "openvino_model.xml").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_tiny_models(root=None, *, seed: int = 0, draft_noise: float = 0.5) -> tuple[Path, Path]:
    """OpenVINO IR directories of the tiny target and its perturbed draft; return their paths.

    The Hugging Face directories come from :func:`specverify.adapters.fixtures.llama.save_tiny_models`;
    each is exported once to ``root/openvino-tiny-llama-s{seed}-n{draft_noise}/{target,draft}``
    (``root`` defaults to ``$SPECVERIFY_CACHE`` or ``~/.cache/specverify``) and reused after.
    """
    from specverify.adapters.fixtures.llama import save_tiny_models

    hf_dirs = save_tiny_models(root, seed=seed, draft_noise=draft_noise)  # validates seed, draft_noise
    root = cache_root(root)
    base = root / f"openvino-tiny-llama-s{seed}-n{float(draft_noise):g}"
    base.mkdir(parents=True, exist_ok=True)
    paths = base / "target", base / "draft"
    for src, dst in zip(hf_dirs, paths):
        if not (dst / "openvino_model.xml").exists():
            _export(src, dst)
    return paths


class OpenVINODecoder:
    """OpenVINO GenAI generation behind the decoder protocol (pipeline built lazily, once).

    Parameters
    ----------
    target_dir : path
        The exported target (OpenVINO IR with its tokenizer).
    draft_dir : path, optional
        The exported draft model; None runs the pipeline without speculation (the control).
    num_assistant_tokens : int
        Draft tokens per round, >= 1.
    temperature, top_k, top_p : sampling options (``top_k=0`` / ``top_p=1`` off)
    pipeline : {"llm", "continuous"}
        ``LLMPipeline.generate`` once per sample, or one ``ContinuousBatchingPipeline.generate``
        with a request per sample.
    precision : {"f32", "default"}
        Inference and KV-cache precision of both models (:data:`PRECISION`).
    num_threads : int
        ``INFERENCE_NUM_THREADS`` of both models.
    memoize : bool
        Diagnostic: a repeated call with the same arguments returns the first call's output, so
        ``check_decoder``'s determinism check cannot stop the statistical tests of a pipeline that
        is not reproducible (with a draft model a few percent of the samples differ on a repeat
        with the same ``rng_seed``: ``reports/openvino/repro_nondeterministic_rng_seed.py``).
    """

    def __init__(
        self,
        target_dir,
        *,
        draft_dir=None,
        num_assistant_tokens=3,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pipeline="llm",
        precision="f32",
        num_threads=1,
        memoize=False,
    ):
        self._memo = OutputMemo(memoize)  # validates memoize
        if pipeline not in PIPELINES:
            raise InvalidArgument(f"pipeline must be one of {list(PIPELINES)}, got {pipeline!r}")
        if precision not in PRECISION:
            raise InvalidArgument(f"precision must be one of {list(PRECISION)}, got {precision!r}")
        self.precision = precision
        self.target_dir, self.draft_dir = str(target_dir), None if draft_dir is None else str(draft_dir)
        self.num_assistant_tokens = check_int("num_assistant_tokens", num_assistant_tokens, minimum=1)
        self.options = sampling_options(temperature, top_k, top_p)
        self.pipeline, self.num_threads = pipeline, check_int("num_threads", num_threads, minimum=1)
        self.vocab_size = _vocab_size(self.target_dir)
        self._pipe = None

    def __repr__(self) -> str:
        spec = (
            "no draft" if self.draft_dir is None else f"draft model, num_assistant_tokens={self.num_assistant_tokens}"
        )
        o = self.options
        return (
            f"OpenVINODecoder({spec}, temperature={o['temperature']}, top_k={o['top_k']}, top_p={o['top_p']}, "
            f"pipeline={self.pipeline!r}, precision={self.precision!r}{', memoize=True' if self._memo.enabled else ''})"
        )

    def _build(self):
        ovg = _import_openvino()[1]
        scheduler = ovg.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        scheduler.cache_size = 1  # GB of KV cache
        props = {"INFERENCE_NUM_THREADS": self.num_threads, **PRECISION[self.precision]}
        draft = {} if self.draft_dir is None else {"draft_model": ovg.draft_model(self.draft_dir, "CPU", **props)}
        if self.pipeline == "llm":
            return ovg.LLMPipeline(self.target_dir, "CPU", scheduler_config=scheduler, **props, **draft)
        return ovg.ContinuousBatchingPipeline(self.target_dir, scheduler, "CPU", {**props, **draft})

    @property
    def pipe(self):
        if self._pipe is None:
            self._pipe = self._build()
        return self._pipe

    def generation_config(self, max_new_tokens: int, rng_seed: int):
        """The ``GenerationConfig`` of one sample."""
        config = _import_openvino()[1].GenerationConfig()
        config.do_sample = True
        config.max_new_tokens = max_new_tokens
        config.ignore_eos = True
        config.rng_seed = rng_seed
        config.temperature = self.options["temperature"]
        config.top_k = self.options["top_k"]
        config.top_p = self.options["top_p"]
        if self.draft_dir is not None:
            config.num_assistant_tokens = self.num_assistant_tokens
        return config

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Sample ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long."""
        ov = _import_openvino()[0]
        n = check_int("num_samples", num_samples, minimum=1)
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        prompt = torch.as_tensor(prompt).reshape(-1)  # (T,)
        check_tokens("prompt", prompt, self.vocab_size)
        ids = prompt.to(torch.int64).cpu().numpy()  # (T,)
        key = (tuple(ids.tolist()), n, L, seed)
        replay = self._memo.lookup(key)
        if replay is not None:
            return replay
        configs = [self.generation_config(L, s) for s in sample_seeds(seed, n)]
        pipe, rows = self.pipe, []
        tensor = ov.Tensor(ids.reshape(1, -1))  # (1, T)
        if self.pipeline == "llm":
            for config in configs:
                result = pipe.generate(tensor, config)
                if len(result.tokens) != 1:
                    raise ImplementationError(f"LLMPipeline.generate returned {len(result.tokens)} sequences, want 1")
                rows.append(result.tokens[0])
        else:
            for start in range(0, n, CHUNK):
                chunk = configs[start : start + CHUNK]
                results = pipe.generate([tensor] * len(chunk), chunk)
                for result in results:
                    if len(result.m_generation_ids) != 1:
                        raise ImplementationError(
                            f"ContinuousBatchingPipeline returned {len(result.m_generation_ids)} sequences, want 1"
                        )
                    rows.append(result.m_generation_ids[0])
        tokens = tokens_from_rows(rows, num_samples=n, max_new_tokens=L, vocab_size=self.vocab_size)  # (N, L)
        return self._memo.store(key, tokens)


def _vocab_size(model_dir: str) -> int:
    import json

    path = Path(model_dir) / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, KeyError, ValueError) as error:
        raise InvalidArgument(
            f"model directory {model_dir!r} has no readable config.json with vocab_size ({error})"
        ) from error


class OpenVINOTarget:
    """Exact processed next-token conditionals of an exported causal LM, compiled by OpenVINO in f32.

    Every call resets the stateful model's KV cache and runs the whole prefix; the float32 logits
    are processed in float64 by :func:`reference.processors.logits_to_probs`.

    Parameters
    ----------
    model_dir : path
        Directory holding ``openvino_model.xml`` (a stateful ``text-generation-with-past`` export).
    temperature, top_k, top_p : sampling options (``top_k=0`` / ``top_p=1`` off)
    num_threads : int
        ``INFERENCE_NUM_THREADS``.
    """

    def __init__(self, model_dir, *, temperature=1.0, top_k=0, top_p=1.0, num_threads=1):
        from specverify_reference.processors import SamplingConfig

        self.model_dir = str(model_dir)
        self.options = sampling_options(temperature, top_k, top_p)
        o = self.options
        self.config = SamplingConfig(o["temperature"], o["top_k"] or None, None if o["top_p"] == 1.0 else o["top_p"])
        self.vocab_size = _vocab_size(self.model_dir)
        self.num_threads = check_int("num_threads", num_threads, minimum=1)
        self._request = None

    def __repr__(self) -> str:
        return f"OpenVINOTarget({self.model_dir!r}, V={self.vocab_size}, {self.options}, f32)"

    @property
    def request(self):
        if self._request is None:
            ov = _import_openvino()[0]
            props = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": self.num_threads}
            model = ov.Core().compile_model(str(Path(self.model_dir) / "openvino_model.xml"), "CPU", props)
            self._request = model.create_infer_request()
        return self._request

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of every position of ``sequences`` (B, S) -> (B, S, V)."""
        import numpy as np

        check_shape("sequences", sequences, (None, None))
        check_tokens("sequences", sequences, self.vocab_size)
        B, S = sequences.shape
        out = []
        for start in range(0, B, TARGET_CHUNK):
            ids = sequences[start : start + TARGET_CHUNK].to(torch.int64).cpu().numpy()  # (b, S)
            b = ids.shape[0]
            request = self.request
            request.reset_state()
            request.infer(
                {
                    "input_ids": ids,
                    "attention_mask": np.ones((b, S), dtype=np.int64),
                    "position_ids": np.broadcast_to(np.arange(S, dtype=np.int64), (b, S)).copy(),  # (b, S)
                    "beam_idx": np.arange(b, dtype=np.int32),
                }
            )
            out.append(torch.from_numpy(request.get_tensor("logits").data.copy()).reshape(b, S, -1))  # (b, S, V)
        return torch.cat(out).to(torch.float32)  # (B, S, V)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Processed law of the next token after each row of ``prefix`` (B, T) -> (B, V) float64."""
        from specverify_reference.processors import logits_to_probs

        return logits_to_probs(self.logits(prefix)[:, -1], self.config)  # (B, V)

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced processed conditionals of ``sequences[:, start:]`` (B, S) -> (B, S - start, V)."""
        from specverify_reference.processors import logits_to_probs

        S = check_shape("sequences", sequences, (None, None)).shape[1]
        start = check_int("start", start, minimum=1, maximum=S - 1)
        return logits_to_probs(self.logits(sequences)[:, start - 1 : S - 1], self.config)  # (B, L, V)


def tiny_decoder(
    *,
    draft=True,
    num_assistant_tokens=3,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    pipeline="llm",
    precision="f32",
    memoize=False,
    seed=0,
):
    """:class:`OpenVINODecoder` on the tiny seeded target and (``draft=True``) its perturbed draft."""
    check_bool("draft", draft)
    target_dir, draft_dir = export_tiny_models(seed=seed)
    return OpenVINODecoder(
        target_dir,
        draft_dir=draft_dir if draft else None,
        num_assistant_tokens=num_assistant_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        pipeline=pipeline,
        precision=precision,
        memoize=memoize,
    )


def tiny_target(*, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    """Exact processed conditionals of :func:`tiny_decoder`'s target (OpenVINO, f32)."""
    target_dir, _ = export_tiny_models(seed=seed)
    return OpenVINOTarget(target_dir, temperature=temperature, top_k=top_k, top_p=top_p)


def max_conditional_difference(*, seed: int = 0, num_sequences: int = 8, length: int = 12) -> float:
    """Largest |p_OpenVINO - p_transformers| over the raw next-token laws of random sequences (tiny target).

    OpenVINO's are the exported target compiled in f32 (:class:`OpenVINOTarget`, temperature 1);
    transformers' are float32 ``softmax(logits)`` of the same Hugging Face directory.  Sequences
    are drawn from a ``torch.Generator`` seeded with ``seed``.
    """
    from transformers import LlamaForCausalLM

    from specverify.adapters.fixtures.llama import save_tiny_models

    hf_dir, _ = save_tiny_models(seed=seed)
    target = tiny_target(seed=seed)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, use_kernels=False).eval()  # offline, eager

    def laws(sequences: torch.Tensor) -> torch.Tensor:
        return torch.softmax(target.logits(sequences).double(), -1)  # (N, T, V)

    return max_law_difference(
        laws, model, vocab_size=target.vocab_size, seed=seed, num_sequences=num_sequences, length=length
    )

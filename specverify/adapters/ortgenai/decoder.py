"""ONNX Runtime GenAI base speculative decoding (``model.draft`` in ``genai_config.json``) as a decoder.

The decoder protocol of ``docs/design.md``::

    generate(prompt (T,) long, *, num_samples, max_new_tokens, seed) -> (num_samples, max_new_tokens) long

:class:`ORTGenAIDecoder` runs ``onnxruntime_genai.Generator`` once per sample (speculative decoding
is batch 1 in this release): ``GeneratorParams.set_search_options(do_sample=True, temperature,
top_k, top_p, max_length=T+L, min_length=T+L, random_seed=...)``, ``append_tokens(prompt)`` and
``generate_next_token`` until ``is_done``; the new tokens are ``get_sequence(0)[T:]``.  With a draft
the model directory is the composite configuration (:func:`~specverify.adapters.ortgenai.law.speculative_config`)
and ``set_speculative_options(max_draft_tokens=K)`` fixes the draft length; without one the
target's own configuration is the control.  The engine seeds one ``std::mt19937`` per generator
from ``random_seed`` (``CreateRandomGenerator``; -1 would seed it from ``std::random_device``),
so every sample gets its own seed: distinct draws in [0, 2**31 - 1] of a ``torch.Generator``
seeded with the protocol's ``seed`` (:func:`~specverify.adapters.ortgenai.law.sample_seeds`).
``do_sample=False`` (``greedy=True``) is greedy speculative decoding.

The tiny models have no end-of-sequence token but the engine requires one inside the
vocabulary, so the last token id (:data:`EOS_TOKEN`) is declared EOS and masked at every
position by ``min_length = max_length`` (its logit set to the lowest float, probability 0): the
audited law is the model's law without that token, and the exact target applies the same mask.

The exact conditionals (:class:`ORTGenAITarget`) come from the same Hugging Face weights in
transformers float32 (the builder's input), processed in float64 by
:func:`~specverify.adapters.ortgenai.law.processed_law`; :func:`max_conditional_difference`
compares them with the exported model's logits read from the engine (``Generator.get_logits``).

Models: the tiny seeded Llama pair of :func:`specverify.adapters.fixtures.llama.save_tiny_models`
with a word-level tokenizer (:func:`specverify.adapters.fixtures.vocab.word_tokenizer`, which the
builder needs), exported offline by ``python -m onnxruntime_genai.models.builder -p fp32 -e cpu``
into a cache directory keyed by seed and noise (:func:`export_tiny_models`).  References:
onnxruntime-genai ``src/speculative_decoding_strategy.cpp`` (``RunRound``),
``src/base_speculative_strategy.cpp`` (``Propose``), ``src/speculative_sampling.h``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from specverify.adapters.ortgenai.law import (
    plain_config,
    processed_law,
    sample_seeds,
    sampling_options,
    speculative_config,
    tokens_from_rows,
)
from specverify.adapters.runtime import OutputMemo, cache_root, max_law_difference, torch_threads
from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_bool, check_int, check_shape, check_tokens

__all__ = [
    "INSTALL",
    "EOS_TOKEN",
    "export_tiny_models",
    "ORTGenAIDecoder",
    "ORTGenAITarget",
    "tiny_decoder",
    "tiny_target",
    "engine_logits",
    "max_conditional_difference",
    "engine_version",
]

#: One shell command, run from the repository root (the virtualenv lands in ``.venvs/ortgenai``).
INSTALL = (
    "python -m venv .venvs/ortgenai && . .venvs/ortgenai/bin/activate && pip install torch==2.13.0 && "
    "pip install onnxruntime-genai==0.18.0 onnxruntime==1.32.0 onnx==1.23.2 onnx-ir==1.1.0 && "
    'pip install -e ".[test,plots,hf]" transformers==5.25.0'
)
#: The tiny vocabulary's last id, declared end-of-sequence and masked by ``min_length``.
EOS_TOKEN = 31


def _import_engine():
    try:
        import onnxruntime_genai
    except ImportError as error:
        raise ImportError(
            f"specverify.adapters.ortgenai needs onnxruntime-genai ({error}); install it in its own virtualenv: {INSTALL}"
        ) from error
    return onnxruntime_genai


def engine_version() -> str:
    """``onnxruntime_genai.__version__`` (ImportError naming the install line without it)."""
    return _import_engine().__version__


def _build(src: Path, dst: Path) -> None:
    """The model builder (fp32, CPU) on one Hugging Face directory, in a subprocess, atomically."""
    tmp = Path(tempfile.mkdtemp(prefix=dst.name + ".", dir=dst.parent))
    try:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(tmp / "out")]
        cmd += ["-p", "fp32", "-e", "cpu", "-c", str(tmp / "cache")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not (tmp / "out" / "genai_config.json").exists():
            raise RuntimeError(f"the model builder failed on {src}:\n{proc.stderr[-3000:]}")
        try:
            (tmp / "out").rename(dst)
        except OSError:  # another process finished first
            if not (dst / "genai_config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_tiny_models(root=None, *, seed: int = 0, draft_noise: float = 0.5) -> Path:
    """Export the tiny target and its perturbed draft once; return the composite model directory.

    Layout under ``root/ortgenai-tiny-llama-s{seed}-n{draft_noise}`` (``root`` defaults to
    ``$SPECVERIFY_CACHE`` or ``~/.cache/specverify``): ``hf/{target,draft}`` (the Hugging Face
    weights with a word-level tokenizer and ``eos_token_id`` :data:`EOS_TOKEN`), ``target/`` and
    ``draft/`` (the builder's output, one ORT thread), and the composite ``genai_config.json``
    with the tokenizer beside them.  The plain target is ``<dir>/target``.
    """
    from specverify.adapters.fixtures.llama import save_tiny_models
    from specverify.adapters.fixtures.vocab import word_tokenizer

    hf_dirs = save_tiny_models(root, seed=seed, draft_noise=draft_noise)  # validates seed, draft_noise
    base = cache_root(root) / f"ortgenai-tiny-llama-s{seed}-n{float(draft_noise):g}"
    if (base / "genai_config.json").exists():
        return base
    base.mkdir(parents=True, exist_ok=True)
    configs = {}
    for src, name in zip(hf_dirs, ("target", "draft")):
        hf = base / "hf" / name
        if not (hf / "tokenizer.json").exists():
            shutil.copytree(src, hf, dirs_exist_ok=True)
            config = json.loads((hf / "config.json").read_text())
            config["eos_token_id"] = EOS_TOKEN
            (hf / "config.json").write_text(json.dumps(config, indent=1))
            word_tokenizer([f"w{i}" for i in range(config["vocab_size"])]).save_pretrained(hf)
        if not (base / name / "genai_config.json").exists():
            _build(hf, base / name)
        path = base / name / "genai_config.json"
        configs[name] = plain_config(json.loads(path.read_text()), eos_token_id=EOS_TOKEN)
        path.write_text(json.dumps(configs[name], indent=1))
    for tokenizer_file in (base / "target").glob("tokenizer*"):
        shutil.copy(tokenizer_file, base / tokenizer_file.name)
    text = json.dumps(speculative_config(configs["target"], configs["draft"]), indent=1)
    (base / "genai_config.json.tmp").write_text(text)
    (base / "genai_config.json.tmp").rename(base / "genai_config.json")
    return base


def _vocab_size(model_dir: Path) -> int:
    try:
        return int(json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise InvalidArgument(
            f"model directory {str(model_dir)!r} has no readable genai_config.json with model.vocab_size ({error})"
        ) from error


class ORTGenAIDecoder:
    """ONNX Runtime GenAI generation behind the decoder protocol (model loaded lazily, once).

    Parameters
    ----------
    model_dir : path
        A ``genai_config.json`` directory: the composite one (with ``model.draft``) for
        speculative decoding, a plain one for the control.
    max_draft_tokens : int
        ``set_speculative_options(max_draft_tokens=K)``, 1..16; ignored without a draft.
    temperature, top_k, top_p : sampling options (``top_k=0`` / ``top_p=1`` off)
    greedy : bool
        ``do_sample=False`` (the sampling options are then not passed).
    memoize : bool
        Diagnostic: a repeated call with the same arguments returns the first call's output
        (:class:`~specverify.adapters.runtime.OutputMemo`).
    """

    def __init__(
        self, model_dir, *, max_draft_tokens=4, temperature=1.0, top_k=0, top_p=1.0, greedy=False, memoize=False
    ):
        self._memo = OutputMemo(memoize)  # validates memoize
        self.model_dir = Path(model_dir)
        self.vocab_size = _vocab_size(self.model_dir)
        config = json.loads((self.model_dir / "genai_config.json").read_text())
        self.speculative = "draft" in config.get("model", {})
        self.max_draft_tokens = check_int("max_draft_tokens", max_draft_tokens, minimum=1, maximum=16)
        self.options = sampling_options(temperature, top_k, top_p)
        self.greedy = check_bool("greedy", greedy)
        self._model = None

    def __repr__(self) -> str:
        spec = f"draft model, max_draft_tokens={self.max_draft_tokens}" if self.speculative else "no draft"
        law = "greedy" if self.greedy else ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"ORTGenAIDecoder({spec}, {law}{', memoize=True' if self._memo.enabled else ''})"

    @property
    def model(self):
        if self._model is None:
            self._model = _import_engine().Model(str(self.model_dir))
        return self._model

    def search_options(self, length: int, random_seed: int) -> dict:
        """The ``set_search_options`` keywords of one sample whose sequence ends at ``length`` tokens."""
        if self.greedy:
            options: dict = dict(do_sample=False)
        else:
            options = dict(do_sample=True, **self.options)
        return dict(options, max_length=length, min_length=length, random_seed=random_seed)

    def generate_one(self, ids, max_new_tokens: int, random_seed: int) -> list[int]:
        """One sample: the ``max_new_tokens`` tokens after ``ids`` (int32 numpy (T,))."""
        og = _import_engine()
        params = og.GeneratorParams(self.model)
        params.set_search_options(**self.search_options(len(ids) + max_new_tokens, random_seed))
        if self.speculative:
            params.set_speculative_options(max_draft_tokens=self.max_draft_tokens)
        generator = og.Generator(self.model, params)
        generator.append_tokens(ids)
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)[len(ids) :]]

    def generate(self, prompt, *, num_samples: int, max_new_tokens: int, seed: int) -> torch.Tensor:
        """Sample ``num_samples`` continuations of ``prompt`` (T,) -> (num_samples, max_new_tokens) long."""
        import numpy as np

        n = check_int("num_samples", num_samples, minimum=1)
        L = check_int("max_new_tokens", max_new_tokens, minimum=1)
        prompt = torch.as_tensor(prompt).reshape(-1)  # (T,)
        check_tokens("prompt", prompt, self.vocab_size)
        ids = prompt.cpu().numpy().astype(np.int32)  # (T,)
        key = (tuple(ids.tolist()), n, L, seed)
        replay = self._memo.lookup(key)
        if replay is not None:
            return replay
        rows = [self.generate_one(ids, L, s) for s in sample_seeds(seed, n)]
        tokens = tokens_from_rows(rows, num_samples=n, max_new_tokens=L, vocab_size=self.vocab_size)  # (N, L)
        return self._memo.store(key, tokens)


class ORTGenAITarget:
    """Exact processed next-token conditionals: the Hugging Face weights in float32, ORT GenAI's law in float64.

    Parameters
    ----------
    hf_dir : path
        The Hugging Face directory the engine's model was built from.
    temperature, top_k, top_p : sampling options (``top_k=0`` / ``top_p=1`` off, ``top_k=1`` greedy)
    banned : sequence of int
        Token ids of probability 0 (the masked end-of-sequence token).
    num_threads : int
        torch intra-op threads while computing.
    """

    def __init__(self, hf_dir, *, temperature=1.0, top_k=0, top_p=1.0, banned=(EOS_TOKEN,), num_threads=1):
        from transformers import LlamaForCausalLM

        self.hf_dir = str(hf_dir)
        self.options = sampling_options(temperature, top_k, top_p)
        self.banned = tuple(banned)
        self.num_threads = check_int("num_threads", num_threads, minimum=1)
        self.model = LlamaForCausalLM.from_pretrained(self.hf_dir, dtype=torch.float32).eval()
        self.vocab_size = int(self.model.config.vocab_size)

    def __repr__(self) -> str:
        return f"ORTGenAITarget(V={self.vocab_size}, {self.options}, banned={list(self.banned)}, float32 logits)"

    def logits(self, sequences: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of every position of ``sequences`` (B, S) -> (B, S, V)."""
        check_shape("sequences", sequences, (None, None))
        check_tokens("sequences", sequences, self.vocab_size)
        with torch.no_grad(), torch_threads(self.num_threads):
            ids = sequences.to(torch.long).cpu()
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float()

    def _law(self, logits: torch.Tensor) -> torch.Tensor:
        return processed_law(logits, **self.options, banned=self.banned)

    def next_token_probs(self, prefix: torch.Tensor) -> torch.Tensor:
        """Processed law of the next token after each row of ``prefix`` (B, T) -> (B, V) float64."""
        return self._law(self.logits(prefix)[:, -1]).to(prefix.device)  # (B, V)

    def conditionals(self, sequences: torch.Tensor, start: int) -> torch.Tensor:
        """Teacher-forced processed conditionals of ``sequences[:, start:]`` (B, S) -> (B, S - start, V)."""
        S = check_shape("sequences", sequences, (None, None)).shape[1]
        start = check_int("start", start, minimum=1, maximum=S - 1)
        logits = self.logits(sequences)[:, start - 1 : S - 1]  # (B, L, V)
        B, L, V = logits.shape
        return self._law(logits.reshape(B * L, V)).reshape(B, L, V).to(sequences.device)


def tiny_decoder(
    *, draft=True, max_draft_tokens=4, temperature=1.0, top_k=0, top_p=1.0, greedy=False, memoize=False, seed=0
):
    """:class:`ORTGenAIDecoder` on the tiny seeded target and (``draft=True``) its perturbed draft."""
    check_bool("draft", draft)
    base = export_tiny_models(seed=seed)
    return ORTGenAIDecoder(
        base if draft else base / "target",
        max_draft_tokens=max_draft_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
        memoize=memoize,
    )


def tiny_target(*, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    """Exact processed conditionals of :func:`tiny_decoder`'s target (EOS masked)."""
    base = export_tiny_models(seed=seed)
    return ORTGenAITarget(base / "hf" / "target", temperature=temperature, top_k=top_k, top_p=top_p)


def engine_logits(model_dir, sequences: torch.Tensor) -> torch.Tensor:
    """The engine's raw logits after every prefix of each row of ``sequences`` (N, S) -> (N, S, V) float32.

    Tokens are appended one at a time to a plain generator (``Generator.get_logits`` after each).
    """
    import numpy as np

    og = _import_engine()
    model = og.Model(str(model_dir))
    out = []
    for row in sequences.tolist():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(row) + 1)
        generator = og.Generator(model, params)
        rows = []
        for token in row:
            generator.append_tokens(np.array([token], dtype=np.int32))
            rows.append(torch.from_numpy(np.array(generator.get_logits()).reshape(-1).copy()))  # (V,)
        out.append(torch.stack(rows))  # (S, V)
    return torch.stack(out).float()  # (N, S, V)


def max_conditional_difference(*, seed: int = 0, num_sequences: int = 8, length: int = 12) -> float:
    """Largest |p_engine - p_transformers| over the raw next-token laws of random sequences (tiny target)."""
    base = export_tiny_models(seed=seed)
    target = ORTGenAITarget(base / "hf" / "target")

    def laws(sequences: torch.Tensor) -> torch.Tensor:
        return torch.softmax(engine_logits(base / "target", sequences).double(), -1)  # (N, S, V)

    with torch_threads(1):
        return max_law_difference(
            laws, target.model, vocab_size=target.vocab_size, seed=seed, num_sequences=num_sequences, length=length
        )

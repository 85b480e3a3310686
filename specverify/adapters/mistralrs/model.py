"""The tiny seeded Llamas written as mistral.rs model directories (offline, no download).

mistral.rs loads a local Hugging Face directory (``config.json``, ``model.safetensors``,
``tokenizer.json``).  The weights are those of
:func:`specverify.adapters.fixtures.llama.save_tiny_models` (V = 32, 2 layers, hidden 64, float32;
the draft is the target with Gaussian noise), copied with two changes mistral.rs 0.9.5 needs:

* ``config.json`` gains a top-level ``rope_theta`` (its Llama config reads that field; transformers
  5 writes it under ``rope_parameters`` only, and loading fails with "missing field `rope_theta`");
* ``tokenizer.json`` is a byte-level BPE with no merges over the 32 one-character pieces
  :data:`PIECES` (id i is ``PIECES[i]``; no special tokens).  mistral.rs needs a tokenizer whose
  decoder it can classify (a word-level tokenizer without a decoder fails with "can't determine
  decoder type: None"); with one-character pieces a prompt is its characters and a completion's
  text maps back to ids character by character.  No ``generation_config.json`` is written, so no
  model default fills an unset sampling option.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specverify.adapters.runtime import cache_root
from specverify.core.errors import InvalidArgument
from specverify.core.validation import check_int

__all__ = ["PIECES", "VOCAB_SIZE", "ids_to_text", "text_to_ids", "save_tiny_mistralrs", "write_tokenizer"]

#: Token id i is the one-character piece ``PIECES[i]`` ("a".."z", "A".."F").
PIECES = tuple("abcdefghijklmnopqrstuvwxyz") + tuple("ABCDEF")
VOCAB_SIZE = len(PIECES)
_INDEX = {c: i for i, c in enumerate(PIECES)}


def ids_to_text(ids) -> str:
    """The text of token ids (each id one character)."""
    out = []
    for t in ids:
        t = int(t)
        if not 0 <= t < VOCAB_SIZE:
            raise InvalidArgument(f"token id {t} outside [0, {VOCAB_SIZE})")
        out.append(PIECES[t])
    return "".join(out)


def text_to_ids(text: str) -> list[int]:
    """Token ids of a text made of :data:`PIECES` (ValueError naming the first other character)."""
    bad = [c for c in text if c not in _INDEX]
    if bad:
        raise ValueError(f"character {bad[0]!r} is not one of the {VOCAB_SIZE} pieces")
    return [_INDEX[c] for c in text]


def write_tokenizer(path) -> Path:
    """Write the byte-level BPE ``tokenizer.json`` over :data:`PIECES` to ``path`` (a file)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=dict(_INDEX), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    path = Path(path)
    tok.save(str(path))
    return path


def _convert(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "model.safetensors", tmp / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    config["rope_theta"] = float(config.get("rope_theta", theta))
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    write_tokenizer(tmp / "tokenizer.json")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def save_tiny_mistralrs(root=None, *, seed: int = 0) -> tuple[Path, Path, Path]:
    """Write (once) the tiny target and draft as mistral.rs directories.

    Returns ``(target_dir, draft_dir, hf_target_dir)``: the two mistral.rs directories and the
    Hugging Face directory of the target (the exact law's weights).  ``root`` defaults to
    ``$SPECVERIFY_CACHE`` or ``~/.cache/specverify``.
    """
    from specverify.adapters.fixtures.llama import save_tiny_models

    seed = check_int("seed", seed, minimum=0, maximum=2**62)
    hf_target, hf_draft = save_tiny_models(root, seed=seed)
    base = cache_root(root) / f"mistralrs-tiny-llama-s{seed}"
    out = base / "target", base / "draft"
    for src, dst in zip((hf_target, hf_draft), out):
        if not (dst / "tokenizer.json").exists():
            _convert(Path(src), dst)
    return out[0], out[1], Path(hf_target)

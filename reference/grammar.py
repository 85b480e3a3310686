"""Grammar-constrained decoding: the allowed-token mask after each prefix, from a real grammar engine.

A structured-output request (a JSON schema, a regular expression or an EBNF grammar) lets the
sampler draw only tokens that keep the output a prefix of a string of the grammar's language: at
each position the logits of every other token become ``-inf`` before any other processor, so the
law is the model's renormalised over the allowed set (after the penalties and the cuts that follow,
which then act on the allowed tokens only).  The mask depends on the output so far, so teacher
forcing computes it per prefix, like the penalties (:class:`~specverify_reference.penalties.History`
says which tokens each law conditions on; the grammar reads the tokens after the prompt).

The masks come from xgrammar (``pip install xgrammar``), the grammar engine vLLM and SGLang use by
default, compiled as vLLM compiles them (``vllm/v1/structured_output/backend_xgrammar.py``:
``compile_json_schema(schema, any_whitespace=True)``, ``compile_regex``, ``compile_grammar``).
What happens at the edges is vLLM's (``vllm/v1/structured_output/__init__.py``
``StructuredOutputManager.grammar_bitmask``):

* once the grammar has terminated (it accepted a stop token, which it allows only where the
  output is a complete string of the language), the mask is lifted: every later token is
  allowed (an audit asks ``ignore_eos``, so the output goes on past the stop token);
* a history that holds a token the grammar refuses (a draft the verification pass must reject)
  has no mask after it (every token allowed): a law after such a prefix is never used.

The tiny models' token strings are :func:`synthetic_vocabulary`: single characters that JSON and
regular expressions need first, then multi-character tokens, then two- and three-letter strings;
the last id is the stop token ``</s>``.  The independent check of these masks (tests) is a
partial regular-expression match of the decoded prefix plus each token's text.
"""

from __future__ import annotations

import functools
import itertools
import json
import string
from dataclasses import dataclass

import torch

from specverify.core.errors import InvalidArgument
from specverify_reference.penalties import History

__all__ = [
    "GRAMMAR_KINDS", "STOP_TEXT", "Grammar", "synthetic_vocabulary", "stop_id", "compiles", "grammar_bitmask",
    "allowed_masks", "mask_logits_",
]  # fmt: skip

#: The structured-output kinds (vLLM's ``structured_outputs`` fields ``json``, ``regex``, ``grammar``).
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
#: The stop token's text in :func:`synthetic_vocabulary` (its last id).
STOP_TEXT = "</s>"

_FIRST = '{}":, ' + string.ascii_lowercase + string.digits + "[]-."  # what JSON and simple regexes need
_MULTI = ('{"', '":', '",', '"}', ", ", ": ", "true", "false", "null", "  ", "ab", "the", "name", "id")


def synthetic_vocabulary(vocab_size: int) -> tuple[str, ...]:
    """The token strings of a ``vocab_size``-token tiny model: id ``vocab_size - 1`` is ``</s>``.

    Ids follow a fixed order: the characters JSON needs (``{}":, ``), lowercase letters, digits,
    ``[]-.``, the other printable ASCII characters, a few multi-character tokens (``{"``, ``":``,
    ``true``, ...), then every two-letter and three-letter lowercase string, then ``<tN>`` filler
    tokens (never a prefix of anything a grammar of these characters allows).
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise InvalidArgument(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    rest = [c for c in string.printable[:95] if c not in _FIRST]
    letters = string.ascii_lowercase
    words = itertools.chain(
        _FIRST, rest, _MULTI,
        ("".join(p) for p in itertools.product(letters, repeat=2) if "".join(p) not in _MULTI),
        ("".join(p) for p in itertools.product(letters, repeat=3) if "".join(p) not in _MULTI),
        (f"<t{i}>" for i in itertools.count()),
    )  # fmt: skip
    return (*itertools.islice(words, vocab_size - 1), STOP_TEXT)


def stop_id(vocab_size: int) -> int:
    """The stop token's id in :func:`synthetic_vocabulary` (the last)."""
    return vocab_size - 1


@dataclass(frozen=True)
class Grammar:
    """A structured-output constraint: ``kind`` (one of :data:`GRAMMAR_KINDS`) and its ``source``.

    A JSON schema is stored canonically (``json.dumps(..., sort_keys=True)``); the source is
    compiled on first use for a vocabulary width, and a schema, expression or grammar xgrammar
    cannot compile is an :class:`InvalidArgument` then.  ``tokenizer``: the served model's tokenizer
    (a Hugging Face tokenizer directory), whose token strings the masks are computed over, read as
    vLLM reads it (``xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=V)``, its
    end-of-sequence id the stop token); None: :func:`synthetic_vocabulary` (the tiny models').
    """

    kind: str
    source: str
    tokenizer: str | None = None

    def __post_init__(self):
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise InvalidArgument(f"grammar tokenizer must be a directory path, got {self.tokenizer!r}")
        if self.kind not in GRAMMAR_KINDS:
            raise InvalidArgument(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        source = self.source
        if self.kind == "json_schema" and isinstance(source, dict):
            source = json.dumps(source, sort_keys=True)
        if not isinstance(source, str) or not source:
            raise InvalidArgument(f"the {self.kind} grammar must be a non-empty string, got {source!r}")
        if self.kind == "json_schema":
            try:
                schema = json.loads(source)
            except ValueError as error:
                raise InvalidArgument(f"json_schema is not JSON: {error}") from None
            if not isinstance(schema, dict):
                raise InvalidArgument(f"json_schema must be a JSON object, got {source[:80]!r}")
            source = json.dumps(schema, sort_keys=True)
        object.__setattr__(self, "source", source)

    def record(self) -> dict:
        """The grammar as a report records it (:meth:`of` reads it back)."""
        out = {"kind": self.kind, "source": self.source}
        return out if self.tokenizer is None else {**out, "tokenizer": self.tokenizer}

    @classmethod
    def of(cls, value) -> Grammar | None:
        """``value`` as a Grammar: None, a Grammar, or a :meth:`record` mapping ``{"kind", "source"}``
        (and ``"tokenizer"``)."""
        if value is None or isinstance(value, Grammar):
            return value
        if isinstance(value, dict) and {"kind", "source"} <= set(value) <= {"kind", "source", "tokenizer"}:
            return cls(value["kind"], value["source"], value.get("tokenizer"))
        raise InvalidArgument(f"grammar must be a Grammar or a mapping with kind and source, got {value!r}")


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise InvalidArgument(
            "grammar-constrained decoding needs the grammar engine xgrammar: pip install 'specverify-suite[grammar]'"
        ) from None
    return xgrammar


@functools.lru_cache(maxsize=8)
def _tokenizer_info(tokenizer: str | None, vocab_size: int):
    """xgrammar's view of the vocabulary: :func:`synthetic_vocabulary`, or a Hugging Face tokenizer read
    as vLLM's ``XgrammarBackend`` reads it (``from_huggingface``; stop token: its end-of-sequence id)."""
    xgr = _xgrammar()
    if tokenizer is None:
        return xgr.TokenizerInfo(
            list(synthetic_vocabulary(vocab_size)), vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size,
            stop_token_ids=[stop_id(vocab_size)],
        )  # fmt: skip
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(tokenizer)
    except (ImportError, OSError, ValueError) as error:
        raise InvalidArgument(f"grammar tokenizer {tokenizer!r} cannot be loaded: {error}") from None
    if len(hf) > vocab_size:
        raise InvalidArgument(
            f"grammar tokenizer {tokenizer!r} has {len(hf)} tokens, more than the {vocab_size} of the laws"
        )
    stops = None if hf.eos_token_id is None else [int(hf.eos_token_id)]
    return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stops)


@functools.lru_cache(maxsize=32)
def _compiled(grammar: Grammar, vocab_size: int):
    """The compiled grammar over the grammar's vocabulary of ``vocab_size`` tokens (cached)."""
    xgr = _xgrammar()
    info = _tokenizer_info(grammar.tokenizer, vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    try:
        if grammar.kind == "json_schema":
            return compiler.compile_json_schema(grammar.source, any_whitespace=True)
        if grammar.kind == "regex":
            return compiler.compile_regex(grammar.source)
        return compiler.compile_grammar(grammar.source)
    except (RuntimeError, ValueError) as error:
        raise InvalidArgument(f"xgrammar cannot compile the {grammar.kind} grammar: {error}") from None


def compiles(grammar: Grammar, vocab_size: int) -> None:
    """Compile ``grammar`` for a ``vocab_size``-token vocabulary now (InvalidArgument if xgrammar cannot)."""
    _compiled(grammar, vocab_size)


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's int32 bitmask (..., W) as bool rows (..., V) (bit i of word w: token 32w + i)."""
    bits = (bitmask[..., None] >> torch.arange(32, dtype=torch.int32)) & 1  # (..., W, 32)
    return bits.flatten(-2)[..., :vocab_size].bool()


def grammar_bitmask(grammar: Grammar, history: History, vocab_size: int) -> torch.Tensor:
    """The allowed tokens after each of ``history``'s prefixes as xgrammar's bitmask: (B, n, W) int32,
    W = ceil(V / 32) (V / 8 bytes per law).

    The grammar reads each row's tokens after the prompt (``history.tokens[b, prompt_len:end]``);
    a terminated grammar and a prefix the grammar refuses allow every token (the module docstring).
    Each row is replayed once, through its prefixes in increasing order.
    """
    xgr = _xgrammar()
    compiled = _compiled(grammar, vocab_size)
    B, n = history.ends.shape
    bitmask = xgr.allocate_token_bitmask(B * n, vocab_size)  # (B * n, W) int32, every bit set: all allowed
    tokens = history.tokens.tolist()
    ends = history.ends.tolist()
    for b in range(B):
        matcher = xgr.GrammarMatcher(compiled)
        at, refused = history.prompt_len, False
        for j in sorted(range(n), key=ends[b].__getitem__):
            while at < ends[b][j]:
                if not refused and not matcher.is_terminated():
                    refused = not matcher.accept_token(tokens[b][at])
                at += 1
            if not refused and not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, b * n + j)
    return bitmask.view(B, n, -1)


def allowed_masks(grammar: Grammar, history: History, vocab_size: int) -> torch.Tensor:
    """Which tokens ``grammar`` allows after each of ``history``'s prefixes: (B, n, V) bool
    (:func:`grammar_bitmask` unpacked)."""
    return _unpack(grammar_bitmask(grammar, history, vocab_size), vocab_size)


#: Laws unpacked at a time by :func:`mask_logits_` (its temporaries: 4 bytes per entry of a block).
MASK_BLOCK_ENTRIES = 1 << 22


def mask_logits_(logits: torch.Tensor, grammar: Grammar, history: History) -> torch.Tensor:
    """Set to ``-inf``, in place, the logits (B, n, V) of the tokens ``grammar`` does not allow after
    each prefix; the masks are unpacked a block of laws at a time (memory: V / 8 bytes per law, plus one
    block's temporaries, never 4 bytes per entry of the whole tensor)."""
    B, n, V = logits.shape
    bitmask = grammar_bitmask(grammar, history, V).view(B * n, -1)  # (B * n, W)
    flat = logits.view(B * n, V)
    rows = max(1, MASK_BLOCK_ENTRIES // V)
    for start in range(0, B * n, rows):
        allowed = _unpack(bitmask[start : start + rows], V).to(logits.device)  # (rows, V)
        flat[start : start + rows].masked_fill_(~allowed, -float("inf"))
    return logits

"""Grammar-constrained decoding: xgrammar's masks against an independent matcher, and the law it gives.

The independent implementation is the ``regex`` module's partial matching: a token is allowed
after the decoded output ``s`` iff ``s + text(token)`` can still be extended to a full match; the
stop token iff ``s`` is a full match.  A JSON schema and an EBNF grammar are checked against a
regular expression of the same language.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specverify.core.errors import InvalidArgument
from specverify_reference.grammar import Grammar, allowed_masks, stop_id, synthetic_vocabulary
from specverify_reference.penalties import History
from specverify_reference.processors import SamplingConfig, logits_to_probs

xgrammar = pytest.importorskip("xgrammar")
regex = pytest.importorskip("regex")

V = 160
VOCAB = synthetic_vocabulary(V)
STOP = stop_id(V)

#: (grammar, a regular expression of the same language in Python's syntax)
LANGUAGES = [
    (Grammar("regex", "(ab|a)c*d"), "(ab|a)c*d"),
    (Grammar("regex", "[a-c]{2,4}(-[0-9]+)?"), "[a-c]{2,4}(-[0-9]+)?"),
    (Grammar("regex", '"[a-z ]*"'), '"[a-z ]*"'),
    (Grammar("regex", "(true|false|null)"), "(true|false|null)"),
    (Grammar("ebnf", 'root ::= ("ab" | "a") "c"* "d"'), "(ab|a)c*d"),
    (Grammar("ebnf", 'root ::= "x" root | "y"'), "x*y"),
    (
        Grammar(
            "json_schema",
            {
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
                "additionalProperties": False,
            },
        ),
        r'\{[ ]*"id"[ ]*:[ ]*-?(0|[1-9][0-9]*)[ ]*\}',
    ),  # fmt: skip
    (Grammar("json_schema", {"enum": ["ab", "cd"]}), '"(ab|cd)"'),
]


def oracle_mask(pattern: str, text: str, state: str) -> torch.Tensor:
    """The allowed tokens after decoded ``text`` (V,) bool; ``state`` 'live', 'terminated' or 'refused'."""
    if state != "live":
        return torch.ones(V, dtype=torch.bool)
    mask = torch.tensor([regex.fullmatch(pattern, text + t, partial=True) is not None for t in VOCAB])
    mask[STOP] = regex.fullmatch(pattern, text) is not None
    return mask


def _walk(pattern: str, rng: random.Random, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """A token path (mostly allowed tokens, sometimes any) and the oracle's mask before each token."""
    tokens, masks, text, state = [], [], "", "live"
    for _ in range(steps + 1):
        mask = oracle_mask(pattern, text, state)
        masks.append(mask)
        allowed = torch.nonzero(mask).view(-1).tolist()
        token = rng.choice(allowed) if rng.random() < 0.9 else rng.randrange(V)
        if state == "live":
            if not mask[token]:
                state = "refused"
            elif token == STOP:
                state = "terminated"
            else:
                text += VOCAB[token]
        tokens.append(token)
    return tokens[:-1], masks


@settings(max_examples=120, deadline=None)
@given(which=st.integers(0, len(LANGUAGES) - 1), seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 10))
def test_masks_are_the_independent_matchers(which, seed, steps):
    grammar, pattern = LANGUAGES[which]
    rng = random.Random(seed)
    tokens, masks = _walk(pattern, rng, steps)
    prompt = [rng.randrange(V) for _ in range(rng.randrange(3))]  # the grammar reads after the prompt
    ends = list(range(len(prompt), len(prompt) + steps + 1))
    rng.shuffle(ends)  # any order of prefixes in one call
    history = History(torch.tensor([prompt + tokens], dtype=torch.long), len(prompt), torch.tensor([ends]))
    got = allowed_masks(grammar, history, V)[0]  # (n, V)
    for j, end in enumerate(ends):
        want = masks[end - len(prompt)]
        assert torch.equal(got[j], want), (grammar, tokens[: end - len(prompt)], torch.nonzero(got[j] ^ want))


def test_the_law_is_the_model_renormalised_over_the_allowed_tokens():
    logits = torch.randn(2, 3, V, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (B, n, V)
    grammar, pattern = LANGUAGES[0]
    tokens = torch.tensor([[5, 6, 8, 8], [5, 6, 7, 8]])  # prompt [5], then "acc" and "abc"
    history = History(tokens, 1, torch.tensor([[1, 2, 4], [1, 3, 4]]))
    config = SamplingConfig(engine="vllm", temperature=0.8, top_k=3, grammar=grammar)
    probs = logits_to_probs(logits, config, history=history)
    for b, j, text in [(0, 0, ""), (0, 1, "a"), (0, 2, "acc"), (1, 0, ""), (1, 1, "ab"), (1, 2, "abc")]:
        allowed = oracle_mask(pattern, text, "live")
        want = torch.softmax(logits[b, j].masked_fill(~allowed, -torch.inf) / 0.8, -1)
        keep = want >= torch.topk(want, min(3, int(allowed.sum()))).values[-1]
        want = torch.where(keep, want, 0.0)
        torch.testing.assert_close(probs[b, j], want / want.sum(), rtol=1e-12, atol=1e-15)
        assert float(probs[b, j][~allowed].sum()) == 0.0


def test_bad_grammars_are_refused():
    with pytest.raises(InvalidArgument, match="kind"):
        Grammar("cfg", "x")
    with pytest.raises(InvalidArgument, match="not JSON"):
        Grammar("json_schema", "{not json")
    with pytest.raises(InvalidArgument, match="cannot compile"):
        allowed_masks(Grammar("ebnf", "root ::= ("), History.of_prefixes(torch.zeros(1, 1, dtype=torch.long), 1), V)
    with pytest.raises(InvalidArgument, match="grammar must be"):
        SamplingConfig(grammar="(a|b)")


def test_sampled_documents_are_valid_json():
    """The reference decoder under a JSON schema: every output that reached the stop token parses."""
    from specverify.cli.factories import reference_decoder

    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
              "additionalProperties": False}  # fmt: skip
    decoder = reference_decoder(vocab_size=V, engine="vllm", temperature=0.5, json_schema=json.dumps(schema))
    out = decoder.generate_batch(torch.zeros(64, 2, dtype=torch.long), 12, generator=torch.Generator().manual_seed(1))
    complete = 0
    for row in out.tokens.tolist():
        text = "".join(VOCAB[t] for t in row[: row.index(STOP)] if STOP in row) if STOP in row else None
        if text is not None:
            document = json.loads(text)
            assert set(document) == {"id"} and isinstance(document["id"], int)
            complete += 1
        prefix = "".join(VOCAB[t] for t in (row[: row.index(STOP)] if STOP in row else row))
        assert regex.fullmatch(LANGUAGES[6][1], prefix, partial=True), prefix
    assert complete >= 1  # the stop token is reached (and then lifts the mask)


def test_the_selftest_reports_the_grammar_mutant_not_run_without_xgrammar(monkeypatch):
    from specverify.selftest.battery_runs import NOT_RUN, run_decoder_mutants
    from specverify.selftest.render import outcome

    monkeypatch.setitem(__import__("sys").modules, "xgrammar", None)  # import xgrammar now raises ImportError
    (row,) = run_decoder_mutants(tier="smoke", seed=0, alpha=1e-3, names={"grammar_first_row_only"})
    assert row["expected"] == NOT_RUN and row["ok"] and not row["killed"]
    assert outcome(row).startswith("not run (needs the grammar engine xgrammar")


def test_masking_block_by_block_is_the_whole_mask(monkeypatch):
    """mask_logits_ unpacks a few laws at a time: the same -inf entries as the whole (B, n, V) mask."""
    import specverify_reference.grammar as grammar_module

    grammar = LANGUAGES[1][0]
    tokens = torch.randint(V, (5, 7), generator=torch.Generator().manual_seed(3))
    history = History(tokens, 2, torch.tensor([[2, 3, 5, 7]] * 5))
    logits = torch.randn(5, 4, V, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(grammar_module, "MASK_BLOCK_ENTRIES", 3 * V)  # blocks of 3 laws, the last one short
    masked = grammar_module.mask_logits_(logits.clone(), grammar, history)
    allowed = allowed_masks(grammar, history, V)
    assert torch.equal(torch.isfinite(masked), allowed) and torch.equal(masked[allowed], logits[allowed])


# ----------------------------------------------------------------------------- a served model's own tokenizer


def _byte_level_tokenizer(path) -> list[str]:
    """A GPT-2-style byte-level BPE tokenizer (``Ġ`` is a space), written offline; its token strings by id."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    words = ["a", "b", "Ġ", "Ġa", "ab", "aa", "Ġb", "{", "}", '"', "</s>"]
    model = tokenizers.models.BPE(vocab={w: i for i, w in enumerate(words)}, merges=[])
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>").save_pretrained(path)
    return words


def test_masks_follow_a_served_tokenizers_strings(tmp_path):
    """With ``tokenizer``, the masks are over that tokenizer's decoded strings (byte-level ``Ġ`` read as a
    space, as vLLM's xgrammar backend reads it), its end-of-sequence id the stop token: the independent
    matcher over those strings agrees at every prefix of a walk."""
    pytest.importorskip("transformers")
    words = _byte_level_tokenizer(tmp_path / "tok")
    texts = [w.replace("Ġ", " ") for w in words]
    width, stop = 16, words.index("</s>")  # the laws may be wider than the tokenizer (a padded head)
    grammar = Grammar("regex", "a+( b?a)*", str(tmp_path / "tok"))
    path = [words.index(w) for w in ("a", "aa", "Ġa", "Ġb", "a")]  # "aaa a ba": every step allowed
    masks = allowed_masks(grammar, History(torch.tensor([[0, *path]]), 1, torch.arange(1, 7)[None]), width)
    text = ""
    for j in range(len(path) + 1):
        want = torch.zeros(width, dtype=torch.bool)
        for i, piece in enumerate(texts):
            if i != stop:
                want[i] = regex.fullmatch("a+( b?a)*", text + piece, partial=True) is not None
        want[stop] = regex.fullmatch("a+( b?a)*", text) is not None
        assert torch.equal(masks[0, j], want), (j, repr(text))
        text += texts[path[j]] if j < len(path) else ""
    assert masks[0, 1, words.index("Ġa")] and not masks[0, 0, words.index("Ġa")]  # a space only after a letter
    record = grammar.record()
    assert record == {"kind": "regex", "source": "a+( b?a)*", "tokenizer": str(tmp_path / "tok")}
    assert Grammar.of(record) == grammar and Grammar.of({"kind": "regex", "source": "a"}).tokenizer is None


def test_a_tokenizer_that_cannot_serve_the_laws_is_refused(tmp_path):
    pytest.importorskip("transformers")
    _byte_level_tokenizer(tmp_path / "tok")
    one = History.of_prefixes(torch.zeros(1, 1, dtype=torch.long), 1)
    with pytest.raises(InvalidArgument, match="11 tokens, more than the 8"):
        allowed_masks(Grammar("regex", "a+", str(tmp_path / "tok")), one, 8)
    with pytest.raises(InvalidArgument, match="cannot be loaded"):
        allowed_masks(Grammar("regex", "a+", str(tmp_path / "absent")), one, 16)
    with pytest.raises(InvalidArgument, match="directory path"):
        Grammar("regex", "a+", "")


def test_the_cli_sends_the_grammar_tokenizer_into_the_canonical_command(tmp_path):
    from specverify.cli.commands import parse_command
    from specverify.cli.endpoint import endpoint_command, grammar

    base = "specverify audit --endpoint http://127.0.0.1:1 --model m --regex a+"
    args = parse_command(base + f" --grammar-tokenizer {tmp_path}")
    assert grammar(args) == Grammar("regex", "a+", str(tmp_path))
    assert f"--regex a+ --grammar-tokenizer {tmp_path}" in endpoint_command(args)
    with pytest.raises(InvalidArgument, match="--grammar-tokenizer needs a grammar"):
        grammar(
            parse_command(f"specverify audit --endpoint http://127.0.0.1:1 --model m --grammar-tokenizer {tmp_path}")
        )

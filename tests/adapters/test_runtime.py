"""The adapters' shared runtime helpers (``specverify.adapters.runtime``), engine-free.

:class:`OutputMemo` is the ``memoize`` option of the vLLM and OpenVINO decoders;
:func:`max_law_difference` is the comparison behind their ``max_conditional_difference``.
"""

from __future__ import annotations

import types

import pytest
import torch

from specverify.adapters.runtime import OutputMemo, max_law_difference
from specverify.core.errors import InvalidArgument


def test_memo_replays_a_copy_of_the_first_output():
    memo = OutputMemo(True)
    key = ((1, 2), 3, 4, 0)
    assert memo.lookup(key) is None
    first = torch.arange(12).reshape(3, 4)  # (N, L)
    assert memo.store(key, first) is first
    first[0, 0] = 99  # the caller's tensor changes; the stored output does not
    replay = memo.lookup(key)
    assert replay is not None and replay.tolist()[0] == [0, 1, 2, 3]
    replay[0, 0] = 98
    assert memo.lookup(key)[0, 0] == 0
    assert memo.lookup(((1, 2), 3, 4, 1)) is None


def test_memo_off_stores_nothing():
    memo = OutputMemo(False)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert memo.store("k", tokens) is tokens and memo.lookup("k") is None


@pytest.mark.parametrize("memoize", [1, "yes", None])
def test_memo_option_must_be_a_bool(memoize):
    with pytest.raises(InvalidArgument, match=f"memoize must be True or False, got {memoize!r}"):
        OutputMemo(memoize)


def _uniform_model(vocab_size):
    """A stand-in causal LM whose logits are all 0: every next-token law is uniform."""

    def model(*, input_ids):
        return types.SimpleNamespace(logits=torch.zeros(*input_ids.shape, vocab_size))  # (N, T, V) float32

    return model


def test_max_law_difference_compares_the_first_positions():
    V, N, T = 5, 3, 4
    seen = []

    def laws(sequences):
        seen.append(sequences)
        out = torch.full((N, T - 1, V), 1.0 / V, dtype=torch.float64)  # (N, T - 1, V)
        out[1, 2, 0] += 0.25
        return out

    diff = max_law_difference(laws, _uniform_model(V), vocab_size=V, seed=7, num_sequences=N, length=T)
    assert diff == pytest.approx(0.25)
    (sequences,) = seen
    assert sequences.shape == (N, T) and int(sequences.max()) < V
    expected = torch.randint(0, V, (N, T), generator=torch.Generator().manual_seed(7))
    assert torch.equal(sequences, expected)


def test_max_law_difference_without_positions_is_zero():
    def laws(sequences):
        return torch.zeros(sequences.shape[0], 0, 4, dtype=torch.float64)  # (N, 0, V)

    assert max_law_difference(laws, _uniform_model(4), vocab_size=4, seed=0, num_sequences=2, length=1) == 0.0

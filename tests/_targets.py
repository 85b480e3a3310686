"""Test helpers shared by the decoder-check and pipeline tests."""

import torch


class WithConditionals:
    """A table target that also offers the batched teacher-forced ``conditionals`` extension."""

    def __init__(self, model):
        self.model, self.vocab_size = model, model.vocab_size

    def next_token_probs(self, prefix):
        return self.model.next_token_probs(prefix)

    def conditionals(self, sequences, start):
        B, S = sequences.shape
        rows = [self.model.probs_at(sequences, torch.full((B,), t, dtype=torch.long)) for t in range(start, S)]
        return torch.stack(rows, dim=1)  # (B, S - start, V)

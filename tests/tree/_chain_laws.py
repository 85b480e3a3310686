"""Exact laws of one chain-verification round on table models, by enumerating draft blocks.

Used by the block-verification tests: the law of the emitted block (accepted drafts + last
token) for token-wise verification (Leviathan et al. 2023) and block verification (Sun et al.
2024, arXiv 2403.10444), written from the algorithms' definitions in float64, independently
of ``reference.block``'s batched code except for its ``block_weights`` / ``block_thresholds``
formulas, which the lossless checks then put under test.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch

from specverify.core.tables import TableModel
from specverify_reference.block import block_thresholds, block_weights


def _fold(model: TableModel, context: int, tokens) -> int:
    for t in tokens:
        context = int(model.next_context(torch.tensor([context]), torch.tensor([t]))[0])
    return context


def block_rows(target: TableModel, drafter: TableModel, block, tc: int, dc: int):
    """Rows p_1..p_{K+1} (K+1, V) and q_1..q_K (K, V) along a drafted block from contexts (tc, dc)."""
    target_rows, draft_rows = [], []
    for i in range(len(block) + 1):
        target_rows.append(target.table[_fold(target, tc, block[:i])])
        if i < len(block):
            draft_rows.append(drafter.table[_fold(drafter, dc, block[:i])])
    return torch.stack(target_rows), torch.stack(draft_rows)


def _last_passed(h: torch.Tensor) -> torch.Tensor:
    """P(tau = i), i = 0..K, for tau = max{i : eta_i < h_i} with independent eta (0 if none passes)."""
    one = torch.ones(1, dtype=torch.float64)
    after = torch.cat([torch.flip(torch.cumprod(torch.flip(1.0 - h, [0]), 0), [0]), one])  # (K+1,) prod_{j>i}(1-h_j)
    return torch.cat([one, h]) * after


def _first_failed(a: torch.Tensor) -> torch.Tensor:
    """P(tau = i), i = 0..K, for tau = the number of tests passed before the first failure."""
    one = torch.ones(1, dtype=torch.float64)
    return torch.cat([one, torch.cumprod(a, 0)]) * torch.cat([1.0 - a, one])


def _stop_law(rule: str, target_rows, draft_rows, block):
    """P(tau = i | block), i = 0..K, and the normalised last-token law after tau = i, (K+1, V)."""
    K = len(block)
    x = torch.tensor(block)[None]  # (1, K)
    if rule == "token":  # token-wise: accept while u q < p; the residual after tau is (p - q)+
        p_x = target_rows[:K].gather(-1, x[0][:, None]).squeeze(-1)  # (K,)
        q_x = draft_rows.gather(-1, x[0][:, None]).squeeze(-1)  # (K,)
        a = torch.where(q_x > 0, (p_x / torch.where(q_x > 0, q_x, 1.0)).clamp(max=1.0), (p_x > 0).double())
        w = torch.ones(K + 1, dtype=torch.float64)
        tau = _first_failed(a)
    else:
        w = block_weights(target_rows[None], draft_rows[None], x)[0]  # (K+1,)
        h = block_thresholds(target_rows[None], draft_rows[None], w[None])[0]  # (K,)
        tau = _first_failed(h) if rule == "block_first_failure" else _last_passed(h)
        if rule == "block_plain_residual":
            w = torch.ones_like(w)
    last = []
    for i in range(K + 1):
        weights = target_rows[K] if i == K else (w[i] * target_rows[i] - draft_rows[i]).clamp_min(0.0)
        if not weights.sum() > 0:
            weights = target_rows[i]
        last.append(weights / weights.sum())
    return tau, torch.stack(last)


def chain_round_law(target: TableModel, drafter: TableModel, K: int, *, rule: str, tc=None, dc=None) -> dict:
    """Law {emitted tuple: prob} of one round (K drafts from the drafter, verified by ``rule``).

    rule: "token" (token-wise), "block" (Algorithm 2), or a deliberately wrong block variant:
    "block_plain_residual" (last token from (p - q)+, not (w p - q)+), "block_first_failure"
    (tau = the last position before the first failed test instead of the last passed one).
    """
    tc = target.initial_context if tc is None else tc
    dc = drafter.initial_context if dc is None else dc
    V = target.vocab_size
    law = defaultdict(float)
    for block in itertools.product(range(V), repeat=K):
        target_rows, draft_rows = block_rows(target, drafter, block, tc, dc)
        prob = float(torch.prod(draft_rows[torch.arange(K), torch.tensor(block)]))
        if prob == 0.0:
            continue
        tau, last = _stop_law(rule, target_rows, draft_rows, block)
        for i in range(K + 1):
            for y in last[i].nonzero().flatten().tolist():
                law[block[:i] + (y,)] += prob * float(tau[i]) * float(last[i, y])
    return dict(law)


def next_token_error(law: dict, target: TableModel, tc=None) -> float:
    """max over prefixes s, tokens y of |P(e continues s with y) - P(e continues past s) p(y | s)|."""
    tc = target.initial_context if tc is None else tc
    V = target.vocab_size
    past = defaultdict(float)  # P(|e| > len(s), e starts with s)
    for e, prob in law.items():
        for j in range(len(e)):
            past[e[:j]] += prob
    err = 0.0
    for s, mass in past.items():  # the token after s, whether or not the block continues after it
        row = target.table[_fold(target, tc, s)]
        cont = defaultdict(float)
        for e, prob in law.items():
            if len(e) > len(s) and e[: len(s)] == s:
                cont[e[len(s)]] += prob
        for y in range(V):
            err = max(err, abs(cont[y] - mass * float(row[y])))
    return err


def expected_accepted(law: dict) -> float:
    """E[tau] = E[len(e)] - 1."""
    return sum(prob * (len(e) - 1) for e, prob in law.items())


def multi_round_chain_law(target: TableModel, drafter: TableModel, K: int, L: int, *, rule: str) -> torch.Tensor:
    """Joint law (V,) * L of the first L tokens of repeated rounds."""
    V = target.vocab_size
    out = torch.zeros((V,) * L, dtype=torch.float64)
    rounds = {}
    frontier = {(): 1.0}
    while frontier:
        following = defaultdict(float)
        for prefix, mass in frontier.items():
            key = (_fold(target, target.initial_context, prefix), _fold(drafter, drafter.initial_context, prefix))
            if key not in rounds:
                rounds[key] = chain_round_law(target, drafter, K, rule=rule, tc=key[0], dc=key[1])
            for e, prob in rounds[key].items():
                seq = prefix + e
                if len(seq) >= L:
                    out[seq[:L]] += mass * prob
                else:
                    following[seq] += mass * prob
        frontier = following
    return out

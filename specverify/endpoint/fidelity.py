"""Logprob fidelity: are the log-probabilities a server reports for the tokens it emitted the target's?

A sampling request with ``logprobs = L`` (OpenAI's completions field) asks the server for each
emitted token's log-probability and the ``L`` most likely tokens' at that position.  Under vLLM's
documented default (``--logprobs-mode raw_logprobs``) they are the target model's *raw*
log-probabilities after the prefix: the same numbers teacher forcing returns as prompt logprobs.
With speculation on, every emitted token was scored by the verification pass, so its reported
logprob is the target's whatever the drafter proposed.  Engines have shipped otherwise: llama.cpp
#27972 (llama-server reports logprob 0.0, probability 1, for every token under speculative
decoding), llama.cpp PR #27196 (only the first token's logprobs right with speculation on).

The check is deterministic, not statistical: every reported value is compared with the teacher-
forced raw law after the same prefix (fetched by the exact-conditional audit for its own tests),
within an absolute tolerance (:data:`LOGPROB_TOLERANCE`: both numbers come from float32 logits, in
passes of different shapes), and the listed top tokens must be the most likely ones (none listed
below an unlisted token by more than the tolerance).  Its verdict is shown on its own line: "the
law is right but the reported logprobs are not" is a finding of its own.  Values the teacher-forced
law does not hold (a top-M law that does not list the token) are counted as unchecked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specverify.endpoint.http import EndpointError, server_text

__all__ = ["LOGPROB_TOLERANCE", "MAX_TOP_LOGPROBS", "LogprobFidelity", "reported_logprobs", "check_logprob_fidelity"]

#: How far a reported log-probability may be from the teacher-forced one (float32 logits, JSON).
LOGPROB_TOLERANCE = 1e-3
#: The most top logprobs a request may ask for per token (OpenAI's API allows 5; vLLM's cap is 20).
MAX_TOP_LOGPROBS = 20


def _id(key, upper: int, where: str) -> int:
    text = key[9:] if isinstance(key, str) and key.startswith("token_id:") else key
    if isinstance(text, str) and text.isdigit() and len(text) < 12:
        text = int(text)
    if not isinstance(text, int) or isinstance(text, bool) or not 0 <= text < upper:
        raise EndpointError(f"{where} lists {server_text(repr(key), limit=40)}, not a token id in [0, {upper})")
    return text


def _value(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 1e-6:
        raise EndpointError(f"{where} is {server_text(repr(value), limit=40)}, not a finite log-probability <= 0")
    return float(value)


def reported_logprobs(reply, *, n: int, max_tokens: int, top: int, vocab_size: int | None) -> list[list[list]]:
    """Each choice's reported logprobs: per token ``[logprob, [[id, logprob], ...]]`` (the top list).

    Reads OpenAI's completions ``choices[i].logprobs``: ``token_logprobs`` (one per token) and
    ``top_logprobs`` (one object per token, keys the token ids as vLLM's ``token_id:N`` or decimal
    strings).  Raises EndpointError for a reply that does not hold them as asked.
    """
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        raise EndpointError(f"the completion reply does not hold {n} choices with logprobs")
    upper = vocab_size if vocab_size is not None else 1 << 20
    out = []
    for i, choice in enumerate(sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)):
        where = f"choices[{i}].logprobs"
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(values, list) or len(values) != max_tokens:
            raise EndpointError(
                f"{where}.token_logprobs is not a list of {max_tokens} numbers (logprobs={top} was asked)"
            )
        if top and (not isinstance(tops, list) or len(tops) != max_tokens):
            raise EndpointError(
                f"{where}.top_logprobs is not a list of {max_tokens} objects (logprobs={top} was asked)"
            )
        rows = []
        for j, value in enumerate(values):
            listed = tops[j] if top and isinstance(tops, list) else {}
            if not isinstance(listed, dict) or len(listed) > top + 1:
                raise EndpointError(f"{where}.top_logprobs[{j}] is not an object of at most {top + 1} entries")
            entries = sorted(
                [_id(k, upper, f"{where}.top_logprobs[{j}]"), _value(v, f"{where}.top_logprobs[{j}]")]
                for k, v in listed.items()
            )
            rows.append([_value(value, f"{where}.token_logprobs[{j}]"), entries])
        out.append(rows)
    return out


@dataclass(frozen=True)
class LogprobFidelity:
    """The verdict of the logprob-fidelity check (see the module docstring).

    Attributes
    ----------
    verdict : str
        ``"pass"`` (every checked value within ``tolerance``), ``"fail"``, or ``"not checked"``.
    semantics : str
        What the reported values are compared with (``"raw"``: the target's raw log-probabilities).
    tolerance : float
    tokens_checked, top_entries_checked, unchecked : int
        Emitted tokens' logprobs and listed top entries compared; values the teacher-forced law did not hold.
    mismatches : int
        Values beyond the tolerance, and top lists that leave out a more likely token.
    max_abs_error : float
        The largest difference seen (0 when nothing was checked).
    first_mismatch : dict or None
        The first mismatch: prompt, prefix length, token, reported and teacher-forced values.
    what : str
        Which logprobs: ``"logprob fidelity"`` (the sampled tokens') or ``"prompt logprob fidelity"``.
    """

    verdict: str
    semantics: str
    tolerance: float
    tokens_checked: int
    top_entries_checked: int
    unchecked: int
    mismatches: int
    max_abs_error: float
    first_mismatch: Mapping[str, Any] | None = field(default=None)
    what: str = "logprob fidelity"

    def line(self) -> str:
        """One line for the summary: ``logprob fidelity: PASS (2,400 tokens, ...)``."""
        head = f"{self.what} ({self.semantics} logprobs, tolerance {self.tolerance:g}): {self.verdict.upper()}"
        counts = (
            f"{self.tokens_checked:,} emitted tokens and {self.top_entries_checked:,} top entries checked, "
            f"{self.mismatches:,} beyond the tolerance, largest difference {self.max_abs_error:.3g}"
        )
        first = ""
        if self.first_mismatch:
            m = self.first_mismatch
            first = (
                f"; first: token {m['token']} after {m['prefix_length']} tokens of prompt {m['prompt']}: "
                f"reported {m['reported']:.6g}, target {m['target']:.6g} ({m['what']})"
            )
        unchecked = f", {self.unchecked:,} unchecked (not in the teacher-forced law)" if self.unchecked else ""
        return f"{head} -- {counts}{unchecked}{first}"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict, "semantics": self.semantics, "tolerance": self.tolerance,
            "tokens_checked": self.tokens_checked, "top_entries_checked": self.top_entries_checked,
            "unchecked": self.unchecked, "mismatches": self.mismatches, "max_abs_error": self.max_abs_error,
            "first_mismatch": dict(self.first_mismatch) if self.first_mismatch else None, "line": self.line(),
            "what": self.what,
        }  # fmt: skip


def check_logprob_fidelity(
    reported: Mapping[tuple, Sequence[tuple[tuple, list]]],
    raw_law: Callable[[tuple], Any],
    *,
    top: int = 0,
    tolerance: float = LOGPROB_TOLERANCE,
    what: str = "logprob fidelity",
) -> LogprobFidelity:
    """Compare reported logprobs with the teacher-forced raw laws.

    Parameters
    ----------
    reported : mapping
        prompt (tuple of ids) -> [(continuation, per-token ``[logprob, [[id, logprob], ...]]``), ...]
        (a token's own logprob None: not reported, counted as unchecked).
    raw_law : callable
        prefix (tuple of ids) -> the raw law after it: a (V,) array of log-probabilities, an
        ``(ids, values)`` pair (a top-M law), or None (not fetched).
    top : int
        The top logprobs asked per token: the ``top`` largest listed values must be the law's
        ``top`` largest (the emitted token, listed beyond them when it is not among them, is left
        out of that comparison).
    tolerance : float
        Absolute tolerance on each log-probability.
    what : str
        The check's name in its verdict line.
    """
    checked = tops = unchecked = mismatches = 0
    worst = 0.0
    first: dict | None = None

    def compare(prompt, prefix, token, value, target, what) -> None:
        nonlocal checked, tops, mismatches, worst, first
        error = abs(value - target) if math.isfinite(target) else math.inf
        worst = max(worst, error)
        if error > tolerance:
            mismatches += 1
            if first is None:
                first = {"prompt": list(prompt), "prefix_length": len(prefix), "token": token,
                         "reported": value, "target": target, "what": what}  # fmt: skip

    for prompt, rows in reported.items():
        for continuation, entries in rows:
            for j, (value, listed) in enumerate(entries):
                prefix = tuple(prompt) + tuple(continuation[:j])
                law = raw_law(prefix)
                lookup = _lookup(law)
                if lookup is None:
                    unchecked += 1 + len(listed)
                    continue
                token = int(continuation[j])
                target = lookup(token)
                if target is None or value is None:
                    unchecked += 1
                else:
                    checked += 1
                    compare(prompt, prefix, token, value, target, "emitted token")
                for tid, tvalue in listed:
                    target = lookup(int(tid))
                    if target is None:
                        unchecked += 1
                        continue
                    tops += 1
                    compare(prompt, prefix, int(tid), tvalue, target, "top entry")
                missed = _left_out(law, listed, top, tolerance)  # the list must hold the most likely tokens
                if missed is not None:
                    compare(prompt, prefix, missed[0], missed[2], missed[1],
                            f"a more likely token left out of the top {top} (reported: the {top}-th listed value)")  # fmt: skip
    verdict = "not checked" if checked + tops == 0 else ("fail" if mismatches else "pass")
    return LogprobFidelity(verdict, "raw", float(tolerance), checked, tops, unchecked, mismatches,
                           0.0 if worst == 0.0 else float(worst), first, what)  # fmt: skip


def _left_out(law, listed, top: int, tolerance: float) -> tuple[int, float, float] | None:
    """The most likely unlisted token of a whole-vocabulary law, when it beats the ``top``-th largest
    listed value by more than ``tolerance``: (token, its log-probability, that listed value); else None."""
    if not top or len(listed) < top or not isinstance(law, np.ndarray):
        return None
    unlisted = np.ones(law.size, dtype=bool)
    unlisted[[int(t) for t, _ in listed]] = False
    if not unlisted.any():
        return None
    kth = sorted((v for _, v in listed), reverse=True)[top - 1]
    best = int(np.argmax(np.where(unlisted, law, -np.inf)))
    return (best, float(law[best]), kth) if law[best] > kth + tolerance else None


def _lookup(law) -> Callable[[int], float | None] | None:
    if law is None:
        return None
    if isinstance(law, tuple):
        values = dict(zip((int(t) for t in law[0]), (float(v) for v in law[1])))
        return values.get
    row = np.asarray(law, dtype=np.float64)
    return lambda token: float(row[token])

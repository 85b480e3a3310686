"""Prompt logprob fidelity: are the prompt logprobs a speculative server reports the target's?

Users score text with a server's prompt logprobs (``prompt_logprobs = L``: for every prompt token,
its log-probability and the ``L`` most likely tokens' given the tokens before it).  With speculation
on, that path runs the target's prefill, not the verification pass, and engines have refused or
broken it (vLLM rejected ``prompt_logprobs`` with speculative decoding for a while).  When the audit
has a reference endpoint (the same weights without speculation, whose laws the exact-conditional
tests use), the first :data:`PROMPT_SEQUENCES` distinct sampled continuations of each prompt are
sent back to the server under test as prompts, and every listed value at the positions of the
continuation is compared with the reference's teacher-forced raw law after the same prefix, as
:mod:`specverify.endpoint.fidelity` compares the sampled tokens' logprobs (its tolerance, its
top-list rule).  A token's own value is checked when the server lists it (the parser keeps the
``L`` most likely entries).  Without a reference endpoint the laws are the server's own prompt
logprobs, and the check would compare them with themselves: it is not run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from specverify.endpoint.fidelity import LOGPROB_TOLERANCE, LogprobFidelity, check_logprob_fidelity
from specverify.endpoint.pool import Fetcher
from specverify.endpoint.subjects import teacher_forcing_request

__all__ = ["PROMPT_SEQUENCES", "check_prompt_logprob_fidelity", "combined"]

#: Distinct sampled continuations per prompt sent back as prompts (each one request).
PROMPT_SEQUENCES = 8


def _sequences(reported: Mapping[tuple, Sequence[tuple]]) -> list[tuple[tuple, tuple]]:
    """The first :data:`PROMPT_SEQUENCES` distinct continuations of each prompt: (prompt, continuation) pairs."""
    plan = []
    for prompt, rows in reported.items():
        seen = list(dict.fromkeys(tuple(continuation) for continuation, _ in rows))[:PROMPT_SEQUENCES]
        plan += [(tuple(prompt), continuation) for continuation in seen]
    return plan


def check_prompt_logprob_fidelity(
    fetcher: Fetcher,
    model: str,
    reported: Mapping[tuple, Sequence[tuple]],
    raw_law: Callable[[tuple], object],
    *,
    top: int,
    vocab_size: int,
    tolerance: float = LOGPROB_TOLERANCE,
) -> LogprobFidelity:
    """Ask the server under test (role ``"decoder"``) for the top-``top`` prompt logprobs of sampled
    sequences and compare them with ``raw_law`` (the reference's teacher-forced raw laws)."""
    top = max(int(top), 1)
    plan = _sequences(reported)
    requests = [
        teacher_forcing_request("decoder", model, [*prompt, *continuation],
                                list(range(len(prompt), len(prompt) + len(continuation))), top, vocab_size)
        for prompt, continuation in plan
    ]  # fmt: skip
    replies = fetcher.fetch(requests, what="prompt logprobs of the server under test") if requests else []
    as_reported: dict[tuple, list] = {}
    for (prompt, continuation), rows in zip(plan, replies):
        entries: list[list] = []
        for token, (ids, values) in zip(continuation, rows):
            own = {int(i): float(v) for i, v in zip(ids, values)}
            entries.append([own.get(int(token)), [[i, v] for i, v in own.items()]])
        as_reported.setdefault(prompt, []).append((continuation, entries))
    return check_logprob_fidelity(as_reported, raw_law, top=top, tolerance=tolerance, what="prompt logprob fidelity")


def combined(sampled: LogprobFidelity, prompt: LogprobFidelity | None) -> dict:
    """The report's ``logprob_fidelity`` record: the sampled tokens' check, the prompt check under ``"prompt"``,
    one line and one verdict for both (``fail`` when either fails)."""
    record = sampled.to_dict()
    if prompt is None:
        return record
    verdicts = {sampled.verdict, prompt.verdict}
    verdict = "fail" if "fail" in verdicts else "pass" if "pass" in verdicts else "not checked"
    return {**record, "verdict": verdict, "prompt": prompt.to_dict(), "line": f"{sampled.line()}; {prompt.line()}"}

"""The logprobs the bundled local server reports for the tokens it emitted, and its planted logprob faults.

OpenAI's completions ``logprobs = L``: per emitted token its log-probability and the ``L`` most
likely tokens' (the emitted one added when it is not among them), keys ``token_id:N`` as vLLM's
``--return-tokens-as-token-ids`` writes them.  The honest server reports the target's raw
log-probabilities after each prefix (vLLM's default ``raw_logprobs``), from one teacher-forced pass
over prompt and continuation.  ``--logprob-fault`` plants what engines shipped:

* ``zero``: every emitted token reported at logprob 0.0 (probability 1) -- llama.cpp #27972
  (llama-server under speculative decoding);
* ``first_only``: the first token's values right, every later token given the first position's
  law -- modelled on llama.cpp PR #27196 (with speculation on, only the first token's logprobs
  were right);
* ``processed``: the law after temperature and the cuts (floored at -1e4 where it is 0) reported
  where the raw one is documented -- vLLM V0's semantics, which V1 changed (the note in
  ``vllm/v1/sample/sampler.py``);
* ``prompt_draft``: the sampled tokens' logprobs right, but ``prompt_logprobs`` computed by the
  drafter's prefill instead of the target's -- a modelled fault (no engine is known to have shipped
  it) on the path speculative engines add beside the target's, which only the prompt logprob
  fidelity check (:mod:`specverify.endpoint.prompt_fidelity`, with a reference endpoint) sees.

The output law is untouched in every case: an audit's law verdict passes and only the logprob
fidelity checks (:mod:`specverify.endpoint.fidelity`) can see the fault.
"""

from __future__ import annotations

import torch

from specverify.endpoint.fidelity import MAX_TOP_LOGPROBS
from specverify_reference.direct import TargetAdapter
from specverify_reference.processors import SamplingConfig

__all__ = ["LOGPROB_FAULTS", "choice_logprobs", "reported_laws"]

#: The planted logprob faults (see the module docstring).
LOGPROB_FAULTS = ("zero", "first_only", "processed", "prompt_draft")
#: The log-probability reported for a token the processed law gives 0 (``processed`` fault).
FLOOR = -1e4


def reported_laws(
    target, sampling: SamplingConfig, prompt: list[int], rows: torch.Tensor, fault: str | None
) -> torch.Tensor:
    """(n, L, V) log-probabilities after each prefix of each continuation, as the server reports them."""
    seqs = torch.cat([torch.tensor(prompt).expand(rows.shape[0], -1), rows], dim=1)  # (n, T + L)
    T = len(prompt)
    with torch.no_grad():
        if fault == "processed":
            probs = TargetAdapter(target, sampling).conditionals(seqs, start=T)  # (n, L, V)
            return torch.log(probs).clamp(min=FLOOR)
        logits = target(seqs[:, :-1])[:, T - 1 :].double()  # (n, L, V) the law of token T + j after T + j tokens
        laws = torch.log_softmax(logits, -1)
    if fault == "first_only":
        laws = laws[:, :1].expand_as(laws)  # every position given the first position's law
    return laws


def choice_logprobs(target, sampling: SamplingConfig, prompt: list[int], rows: torch.Tensor, top: int,
                    fault: str | None = None) -> list[dict]:  # fmt: skip
    """The ``logprobs`` object of each choice (one per row of ``rows`` (n, L))."""
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    laws = reported_laws(target, sampling, prompt, rows, fault)  # (n, L, V)
    out = []
    for b in range(rows.shape[0]):
        tokens = rows[b].tolist()
        values = laws[b].gather(-1, rows[b][:, None])[:, 0].tolist()  # (L,)
        if fault == "zero":
            values = [0.0] * len(values)
        tops = []
        for j, token in enumerate(tokens):
            best = torch.topk(laws[b, j], top).indices.tolist() if top else []
            listed = {f"token_id:{t}": float(laws[b, j, t]) for t in best}
            listed[f"token_id:{token}"] = values[j]
            tops.append(listed)
        out.append({
            "tokens": [f"token_id:{t}" for t in tokens],
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": list(range(len(tokens))),
        })  # fmt: skip
    return out

"""The endpoint section of a report: the server audited over HTTP, what was sent, the prefix trie, the time.

``Report.extra["endpoint"]`` is written by :func:`specverify.endpoint.check_endpoint`; this turns
it into sentences, the same in Markdown and HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specverify.core.results import Report

__all__ = ["endpoint_items", "rendered_keys"]


def _data(report: Report) -> Mapping[str, Any] | None:
    data = report.extra.get("endpoint") if isinstance(report.extra, Mapping) else None
    return data if isinstance(data, Mapping) and data.get("url") else None


def rendered_keys(report: Report) -> set[str]:
    """``{"endpoint"}`` (and ``"logprob_fidelity"``) when the report has an endpoint section (so they
    are not repeated as JSON)."""
    if _data(report) is None:
        return set()
    return {"endpoint", "logprob_fidelity"} if _fidelity(report) is not None else {"endpoint"}


def _fidelity(report: Report) -> Mapping[str, Any] | None:
    data = report.extra.get("logprob_fidelity") if isinstance(report.extra, Mapping) else None
    return data if isinstance(data, Mapping) and isinstance(data.get("line"), str) else None


def _sampling(sampling: Any) -> str:
    if not isinstance(sampling, Mapping):
        return "?"
    parts = [f"temperature {sampling.get('temperature')}"]
    parts += [f"top-k {sampling['top_k']}"] if sampling.get("top_k") is not None else []
    parts += [f"top-p {sampling['top_p']}"] if sampling.get("top_p") is not None else []
    names = ("min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
    parts += [f"{name.replace('_', ' ')} {sampling[name]}" for name in names if sampling.get(name) is not None]
    if isinstance(sampling.get("logit_bias"), Mapping):
        parts.append("logit bias " + ", ".join(f"{k}: {v:g}" for k, v in sampling["logit_bias"].items()))
    grammar = sampling.get("grammar")
    if isinstance(grammar, Mapping) and isinstance(grammar.get("source"), str):
        source = grammar["source"]
        parts.append(f"structured output ({grammar.get('kind')}) {source[:200]}{'...' if len(source) > 200 else ''}")
    if sampling.get("engine"):
        parts.append(f"{sampling['engine']}'s law")
    return ", ".join(parts)


def endpoint_items(report: Report) -> list[str]:
    """The endpoint section as sentences ([] when the report is not an endpoint audit)."""
    e = _data(report)
    if e is None:
        return []
    exact = e.get("mode") == "exact"
    laws = e.get("reference_url") or "the same server"
    mode = (
        f"exact-conditional (the target's laws by teacher forcing from {laws})"
        if exact
        else f"two-sample (against {e.get('reference_model')} at {e.get('reference_url')})"
    )
    out = [f"Server: {e.get('model')} at {e.get('url')}; mode {mode}; {_sampling(e.get('sampling'))}."]
    sent = e.get("requests_sent") or {}
    sent_text = ", ".join(f"{k} {v:,}" for k, v in sorted(sent.items())) or "none"
    out.append(
        f"Requests sent: {sent_text}; answered from the sample store: {e.get('requests_from_store', 0):,} "
        f"({e.get('requests_in_store_at_start', 0):,} replies in the store at the start); retried: "
        f"{e.get('retried', 0)}; tokens received: {e.get('tokens_received', 0):,}."
    )
    memo = e.get("memo")
    if isinstance(memo, Mapping) and memo.get("teacher_forcing_requests"):
        out.append(
            f"Prefix trie: {memo.get('distinct_prefix_laws', 0):,} distinct prefix laws from "
            f"{memo['teacher_forcing_requests']:,} teacher-forcing requests ({memo.get('laws_per_request')} laws per "
            f"request) for the {memo.get('laws_asked', 0):,} laws the battery asked for."
        )
    fraction = e.get("client_overhead_fraction")
    share = f" ({fraction:.1%} of the audit)" if isinstance(fraction, (int, float)) else ""
    out.append(
        f"Time: {e.get('waiting_seconds', 0)} s with requests in flight; the client alone "
        f"{e.get('client_overhead_seconds', 0)} s{share}."
    )
    fidelity = _fidelity(report)
    if fidelity is not None:
        line = str(fidelity["line"])
        out.append(line[0].upper() + line[1:] + ".")
    fault = e.get("declared_fault")
    if isinstance(fault, Mapping) and isinstance(fault.get("note"), str):
        out.append(("Note: " if fault.get("reachable") else "Warning: ") + fault["note"] + ".")
    if e.get("determinism"):
        out.append(f"Determinism for a fixed seed: {e['determinism']}.")
    inv = e.get("batch_invariance")
    if isinstance(inv, Mapping):
        out.append(
            f"Batch invariance: {inv.get('samples_per_composition')} continuations sent alone vs as many among "
            f"{inv.get('distractor_requests')} distractor requests (scenario batch_invariance); seeded rows that "
            f"changed when re-sent among neighbours: {inv.get('seeded_rows_changed_among_neighbours')} of "
            f"{inv.get('seeded_rows_resent')}."
        )
    if e.get("tolerance"):
        out.append(str(e["tolerance"]))
    return out

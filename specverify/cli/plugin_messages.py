"""Failure messages of the pytest plugin (:mod:`specverify.cli.plugin`).

A failing item says, for each failing test, what it measured and how far off it was in the
test's own units (worst bins, offending tokens, score sums, PIT means), the statistic, p,
adjusted p, allocated alpha, N, the seed and the test's degrees of freedom, bins and
detectable TV.
"""

from __future__ import annotations

import re

__all__ = ["label", "observed_vs_expected", "describe", "mentions"]


def label(result) -> str:
    name = result.family if result.name in ("", result.family) else f"{result.family}/{result.name}"
    return f"{name}@{result.position}" if result.position else name


def observed_vs_expected(result, limit: int = 3) -> str:
    """The deviation in the units of the test: worst bins, offending tokens, score sums, PIT means, counts."""
    import math

    from specverify.report.content import bin_label, counts_of, fmt

    d = result.details if hasattr(result.details, "get") else {}
    if result.family == "support" and (d.get("pairs") or d.get("tokens")):
        return f"emitted tokens of target probability 0: {list(d.get('pairs') or d.get('tokens'))[:5]}"
    for key, what in (("error", "protocol violation"), ("first", "first mismatch")):
        if d.get(key):
            return f"{what}: {d[key]}"
    counts = counts_of(result)
    if counts is not None:
        observed, expected, tokens = counts
        z = [(o - e) / math.sqrt(e) if e > 0 else math.inf for o, e in zip(observed, expected)]
        worst = sorted(range(len(z)), key=lambda i: -abs(z[i]))[:limit]
        return "; ".join(
            f"{'token ' if tokens[i] is not None else ''}{bin_label(tokens[i], i)}: "
            f"{fmt(observed[i], '.6g')} vs {fmt(expected[i], '.6g')} (z={z[i]:+.1f})"
            for i in worst
        )
    if "sum" in d and "variance" in d:
        return f"sum of scores {fmt(d['sum'], '.4g')} vs 0 (sd {fmt(math.sqrt(max(float(d['variance']), 0.0)), '.4g')})"
    if "mean" in d and "ks_critical" in d:
        return (
            f"mean PIT {fmt(d['mean'], '.4g')} vs 0.5; KS distance {fmt(result.statistic, '.4g')} "
            f"vs critical {fmt(d['ks_critical'], '.4g')}"
        )
    pairs = [
        (str(k)[len("observed") :], k) for k in d if str(k).startswith("observed") and f"expected{str(k)[8:]}" in d
    ]
    text = "; ".join(
        f"{suffix.strip('_') + ' ' if suffix else ''}{fmt(d[k], '.6g')} vs {fmt(d['expected' + suffix], '.6g')}"
        for suffix, k in pairs[:limit]
    )
    return text or "see the report's details"


def describe(result, settings) -> str:
    from specverify.report.content import fmt

    seed = result.details.get("seed", settings.seed) if hasattr(result.details, "get") else settings.seed
    extras = "".join(
        f", {k}={fmt(v)}"
        for k, v in (("df", result.df), ("bins", result.bins), ("detectable TV", result.mde_tv))
        if v is not None
    )
    return (
        f"  {label(result)} [{(result.grade or '?').upper()}] ({result.method})\n"
        f"    observed vs expected: {observed_vs_expected(result)}\n"
        f"    statistic={fmt(result.statistic, '.4g')}, p={fmt(result.pvalue)}, adjusted p={fmt(result.adjusted_pvalue)}"
        f" (allocated alpha {fmt(result.alpha)}), N={result.n}{extras}, seed={seed}"
    )


def mentions(text: str, scenario: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(scenario)}(?![\w-])", text) is not None

"""Text, JSON and Markdown renderings of a :class:`~specverify.selftest.SelftestResult`."""

from __future__ import annotations

import json
import math

from specverify.selftest.battery_runs import NOT_RUN
from specverify.selftest.verifiers import BELOW_TIER

__all__ = ["render_text", "render_json", "render_markdown", "MATRIX_COLUMNS", "outcome"]

#: Columns of the Markdown mutation matrix (the specverify part).
MATRIX_COLUMNS = (
    "entry",
    "kind",
    "provenance",
    "specverify",
    "killing test",
    "adj. p",
    "samples needed",
    "time (s)",
    "LR limit (tokens)",
    "ratio",
)


def outcome(row: dict) -> str:
    if row["expected"] == "fail":
        return "killed" if row["killed"] else "SURVIVED"
    if row["expected"] == BELOW_TIER:
        return "killed" if row["killed"] else f"below tier (needs > {row['tokens_to_detect']:,} tokens)"
    if row["expected"] == NOT_RUN:
        return f"not run ({row['needs']})"
    return "FALSE ALARM" if row["killed"] else "passed"


def _test(row: dict) -> str:
    t = row.get("killing_test")
    if not t:
        return ""
    where = "/".join(x for x in (t.get("scenario", ""), t.get("position", "")) if x)
    return f"{t['family']}/{t['name']}" + (f" @ {where}" if where else "")


def _p(value) -> str:
    if value is None:
        return ""
    return "0" if value == 0 else f"{value:.1e}"


def _n(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return f"{int(round(value)):,}"


def _ratio(row: dict) -> str:
    r = row.get("lr_ratio")
    if r is None:
        lr = row.get("lr") or {}
        return "n/a" if lr else ""
    lr = row.get("lr") or {}
    flag = ("*" if lr.get("mc_limited") else "") + ("+" if lr.get("small_n") else "")
    return f"{r:.2f}{flag}"


def _needed(row: dict) -> str:
    n = row.get("samples_needed")
    if n is None:
        return ""
    prefix = (
        "~" if (row.get("samples_method") or "").startswith("power") else ("<=" if row.get("samples_at_most") else "")
    )
    return prefix + _n(n)


def _summary_lines(result) -> list[str]:
    killed, total = result.mutation_score
    lines = [
        f"mutation score: {killed}/{total} mutants killed"
        + (f"; SURVIVED: {', '.join(r['name'] for r in result.survivors)}" if result.survivors else "")
    ]
    below = [r for r in result.rows if r["expected"] == BELOW_TIER]
    if below:
        lines.append(
            f"below this tier's detectable deviation (reported, not scored): {len(below)} mutants, "
            + "; ".join(f"{r['name']} {outcome(r)}" for r in below)
        )
    not_run = [r for r in result.rows if r["expected"] == NOT_RUN]
    if not_run:
        lines.append("not run here (not scored): " + "; ".join(f"{r['name']} {outcome(r)}" for r in not_run))
    correct = [r for r in result.rows if r["expected"] == "pass"]
    lines.append(
        f"false alarms on correct variants: {len(result.false_alarms)}/{len(correct)}"
        + (f" ({', '.join(r['name'] for r in result.false_alarms)})" if result.false_alarms else "")
    )
    by_group = {}
    for r in result.rows:
        g = by_group.setdefault(r["group"], [0, 0])
        g[0] += int(r["ok"])
        g[1] += 1
    lines.append("by group (as expected / entries): " + ", ".join(f"{g} {a}/{b}" for g, (a, b) in by_group.items()))
    other_rule = [r["name"] for r in correct if r.get("conformance") == "fail" and not r["killed"]]
    if other_rule:
        lines.append(
            "lossless, not the declared rule (verdict pass, rule conformance FAIL: acceptance differs): "
            + ", ".join(other_rule)
        )
    ratios = [r["lr_ratio"] for r in result.rows if r.get("lr_ratio") is not None]
    if ratios:
        within = sum(x <= 2.0 for x in ratios)
        lines.append(
            f"LR efficiency (samples needed / LR limit): median {sorted(ratios)[len(ratios) // 2]:.2f}, "
            f"range {min(ratios):.2f}..{max(ratios):.2f}, within 2x: {within}/{len(ratios)}"
        )
        fine = [r["lr_ratio"] for r in result.rows if r.get("lr_ratio") is not None and not r["lr"].get("small_n")]
        if fine:
            lines.append(
                f"  excluding gross mutants (LR limit < 30 stratum observations): median "
                f"{sorted(fine)[len(fine) // 2]:.2f}, within 2x: {sum(x <= 2.0 for x in fine)}/{len(fine)}"
            )
    cal = result.calibration
    if cal:
        lo, hi = cal["ci95"]
        lines.append(
            f"calibration: {cal['rejections']}/{cal['trials']} runs rejected at alpha={cal['alpha']} "
            f"(rate {cal['rate']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}]; "
            f"{'consistent with' if cal['consistent'] else 'ABOVE'} alpha) over {cal['seeds']} seeds x "
            f"{len(cal['scenarios'])} scenarios, {cal['rows_per_run']} rows each; implementations: "
            + ", ".join(f"{n} {v['rejections']}/{v['trials']}" for n, v in cal["implementations"].items())
        )
        g = cal["gof_pvalues"]
        if g["count"]:
            lines.append(
                f"  gof p-values under H0: {g['count']}, fraction <= alpha {g['fraction_below_alpha']:.3f}, "
                f"KS distance to uniform {g['ks_statistic']:.3f} (tests within a run are dependent)"
            )
    if result.peers:
        lines += _peer_summary(result)
    lines.append(f"total time {result.seconds:.1f} s; verdict: {'PASS' if result.passed else 'FAIL'}")
    return lines


def _scored_mutants(result) -> set[str]:
    """Names of the mutants a run is scored on (below-tier mutants are reported, not scored)."""
    return {r["name"] for r in result.rows if r["expected"] == "fail"}


def _scored_peer_rows(peers, result) -> list[dict]:
    """The peers' rows of scored mutants: every lossy entry (chain mutants and the tree mutants run as
    chains, named ``tree:<name>``) except the chain mutants below this tier."""
    below = {r["name"] for r in result.rows if r["expected"] == BELOW_TIER}
    return [p for p in peers if p["kind"] == "verifier" and p["name"] not in below]


def _peer_summary(result) -> list[str]:
    names = list(result.peers[0]["caught"]) if result.peers else []
    scored = _scored_peer_rows(result.peers or (), result)
    lines = []
    for n in names:
        caught = sum(r["caught"][n] for r in scored)
        mutants = len(scored)
        alarms = [r["name"] for r in result.peers if r["kind"] != "verifier" and r["caught"][n]]
        lines.append(
            f"peer {n}: {caught}/{mutants} verifier mutants caught, false alarms {len(alarms)}"
            + (f" ({', '.join(alarms)})" if alarms else "")
        )
    return lines


def render_text(result) -> str:
    head = (
        f"{'entry':28s} {'group':18s} {'outcome':11s} {'killing test':62s} {'adj p':>8s} {'needed':>11s} "
        f"{'LR ratio':>8s} {'time':>6s}"
    )
    lines = [
        f"specverify selftest --tier {result.tier} --seed {result.seed} (alpha {result.alpha:g})",
        head,
        "-" * len(head),
    ]
    for r in result.rows:
        test = (
            _test(r)
            if r["killed"]
            else ("closest: " + _test({"killing_test": r["closest_test"]}) if r.get("closest_test") else "")
        )
        p = (
            (r.get("killing_test") or {}).get("adjusted_pvalue")
            if r["killed"]
            else (r.get("closest_test") or {}).get("adjusted_pvalue")
        )
        lines.append(
            f"{r['name']:28s} {r['group']:18s} {outcome(r):11s} {test[:62]:62s} {_p(p):>8s} "
            f"{_needed(r):>11s} {_ratio(r):>8s} {r['seconds']:6.1f}"
        )
    lines.append("")
    lines += _summary_lines(result)
    lines += [f"note: {n}" for n in result.notes if n]
    if any(r.get("lr") for r in result.rows):
        lines.append(
            "note: LR ratio = samples needed (doubling schedule, factor-2 resolution) / tokens the "
            "likelihood-ratio test knowing the mutant's law needs (alpha, power 0.9); * = Monte Carlo "
            "noise floor above 10% of the signal"
        )
    return "\n".join(lines)


def render_json(result) -> str:
    return json.dumps(result.to_dict(), indent=2, default=_default)


def _default(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _frac(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _cut(lr: dict) -> str:
    """`` (R of A rows: vocabulary cap)`` where the Monte Carlo rows were cut to the law-entry budget."""
    rows, asked = lr.get("mc_rows"), lr.get("mc_rows_asked")
    return f" ({_n(rows)} of {_n(asked)} rows: law-entry cap)" if rows and asked and rows < asked else ""


def _g(value) -> str:
    return "" if value is None else f"{value:.3g}"


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(result, *, command: str = "") -> str:
    env = result.environment
    lines = [
        "# specverify mutation matrix",
        "",
        f"Generated by `{command or 'specverify selftest'}` -- specverify {env.get('specverify', '?')}, "
        f"torch {env.get('torch', '?')}, numpy {env.get('numpy', '?')}, scipy {env.get('scipy', '?')}, "
        f"python {env.get('python', '?')}; tier {result.tier}, seed {result.seed}, alpha {result.alpha:g}, "
        f"{env.get('threads', '?')} threads, {result.seconds:.0f} s. Do not edit by hand.",
        "",
        "## Summary",
        "",
    ]
    lines += [f"- {line}" for line in _summary_lines(result)]
    peers = {r["name"]: r for r in (result.peers or ())}
    peer_names = list(next(iter(peers.values()))["caught"]) if peers else []
    lines += [
        "",
        "## Verifier mutants and equivalent variants",
        "",
        "specverify: the battery on the entry's scenarios (smoke: those exposing its bug class) at alpha; "
        "samples needed = emitted tokens of the smallest doubling level (8, 16, 32, ... rows of the killing "
        "scenario, up to its full size; <= when the first level already kills) at which the battery on that "
        "scenario fails; LR limit = emitted tokens the likelihood-ratio "
        "test that knows the mutant's law (estimated by Monte Carlo) needs at alpha with power 0.9, on the "
        "killing test's tokens or on all tokens by (in-block position, context), whichever needs fewer; "
        "ratio = samples needed / LR limit (* Monte Carlo limited; + LR limit under 30 observations: gross "
        "mutant, normal approximation rough, and the doubling schedule's first level (64-80 tokens) is "
        "then the floor). Peers: caught? "
        "(samples, seconds); for an equivalent variant a catch is a false alarm.",
        "",
    ]
    cols = list(MATRIX_COLUMNS) + [f"peer {n}" for n in peer_names]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result.rows:
        if r["group"] not in ("verifier", "equivalent"):
            continue
        t = r.get("killing_test") or {}
        lr = r.get("lr") or {}
        cells = [
            f"`{r['name']}`",
            r["kind"],
            _md(r["provenance"]),
            outcome(r),
            _md(_test(r)),
            _p(t.get("adjusted_pvalue")) if r["killed"] else "",
            _needed(r),
            f"{r['seconds']:.1f}",
            _n(lr.get("n_lr_tokens")) if lr.get("n_lr_tokens") else ("n/a" if lr else ""),
            _ratio(r),
        ]
        pr = peers.get(r["name"])
        for n in peer_names:
            if pr is None:
                cells.append("")
                continue
            res = pr["results"][n]
            cells.append(
                f"{'caught' if pr['caught'][n] else 'missed' if r['expected'] != 'pass' else 'passed'}"
                f" ({_n(res['samples'])}, {res['seconds']:.1f})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    if peers:
        lines += [
            "",
            "### Totals",
            "",
            "Chain and tree entries (the peers test each tree entry as a chain verifier, one path per tree).",
            "",
            "| approach | mutants caught | false alarms on equivalents |",
            "|---|---|---|",
        ]
        scored = _scored_mutants(result)
        vrows = [r for r in result.rows if r["group"] in ("verifier", "equivalent")]
        # the same entries as the peers' rows: chain entries and tree entries (which the peers run as chains)
        ours = [r for r in result.rows if r["group"] in ("verifier", "tree") and r["name"] in scored]
        correct = [r for r in result.rows if r["group"] in ("equivalent", "tree_equivalent")]
        lines.append(
            f"| specverify | {sum(r['killed'] for r in ours)}/{len(ours)} | "
            f"{sum(r['killed'] for r in correct)}/{len(correct)} |"
        )
        mut = _scored_peer_rows(peers.values(), result)
        for n in peer_names:
            eq = [p for p in peers.values() if p["kind"] != "verifier"]
            lines.append(
                f"| peer {n} | {sum(p['caught'][n] for p in mut)}/{len(mut)} | "
                f"{sum(p['caught'][n] for p in eq)}/{len(eq)} |"
            )
        below = sorted(r["name"] for r in vrows if r["expected"] == BELOW_TIER)
        if below:
            lines += ["", f"Not in the totals (below this tier's detectable deviation): {', '.join(below)}."]
    other = [r for r in result.rows if r["group"] not in ("verifier", "equivalent")]
    if other:
        lines += [
            "",
            "## Decoder and drafter entries",
            "",
            "samples needed (~): power estimate from the killing test's noncentrality, in its own units.",
            "",
            "| entry | group | provenance | specverify | killing test | adj. p | samples run | samples needed "
            "| time (s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in other:
            t = r.get("killing_test") or {}
            lines.append(
                f"| `{r['name']}` | {r['group']} | {_md(r['provenance'])} | {outcome(r)} | {_md(_test(r))} | "
                f"{_p(t.get('adjusted_pvalue')) if r['killed'] else ''} | {_n(r['samples_run'])} | "
                f"{_needed(r)} | {r['seconds']:.1f} |"
            )
    lr_rows = [r for r in result.rows if r.get("lr")]
    if lr_rows:
        lines += [
            "",
            "## Likelihood-ratio limit details",
            "",
            "| mutant | stratum | mu1 - mu0 | support mass | n_LR (stratum) | fraction | LR limit (tokens) "
            "| Monte Carlo |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in lr_rows:
            lr = r["lr"]
            sig = lr.get("signal")
            lines.append(
                f"| `{r['name']}` | {_md(lr.get('stratum', lr.get('note', '')))} | "
                f"{_g(sig)} | {_g(lr.get('support_mass')) if lr.get('support_mass') else ''} | "
                f"{_n(lr.get('n_lr'))} | {_frac(lr.get('fraction'))} | "
                f"{_n(lr.get('n_lr_tokens'))} | {_n(lr.get('mc_tokens')) or '-'} tokens{_cut(lr)}"
                f"{', limited' if lr.get('mc_limited') else ''} |"
            )
    if result.calibration:
        cal = result.calibration
        lines += [
            "",
            "## Calibration",
            "",
            "| implementation | runs | rejections | rate | 95% CI | alpha |",
            "|---|---|---|---|---|---|",
        ]
        for n, v in cal["implementations"].items():
            lines.append(
                f"| `{n}` | {v['trials']} | {v['rejections']} | {v['rate']:.3f} | "
                f"[{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}] | {cal['alpha']} |"
            )
    if result.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result.notes if n]
    return "\n".join(lines) + "\n"

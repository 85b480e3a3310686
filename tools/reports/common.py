"""What the engine report generators share (``reports/<engine>/``, never written by hand).

Each engine's generator (:mod:`tools.reports.vllm_reports`,
:mod:`tools.reports.openvino_reports`, :mod:`tools.reports.eagle_reports`) holds its
configurations, its README template and its ``write_readme``; what they share is here:

* :func:`decoder_target_args` -- the audit arguments of an end-to-end configuration
  (``module:tiny_decoder`` against ``module:tiny_target``);
* :func:`run_config` -- one configuration's ``specverify audit`` in its own process, so its
  report records the command that reproduces it;
* :func:`evidence`, :func:`detectable`, :func:`readme_rows`, :func:`readme_fields` -- a README's
  table rows and evidence lines from the ``report.json`` files (verdict, strongest evidence,
  detectable binned TV, link) and the template fields every README shares;
* :func:`report_main` -- the command line (``--out``, ``--seed``, ``--tier``, ``--only``,
  ``--readme-only``);
* :func:`read_template` -- a README template of ``templates/`` (Markdown with ``str.format``
  fields; literal braces doubled).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from specverify.core.conformance import CONFORMANCE_FAMILIES

__all__ = [
    "TEMPLATES",
    "read_template",
    "decoder_target_args",
    "run_config",
    "evidence",
    "detectable",
    "readme_rows",
    "engine_versions",
    "package_version",
    "readme_fields",
    "repro_lines",
    "report_main",
]


#: The README templates (Markdown with ``str.format`` fields).
TEMPLATES = Path(__file__).resolve().parent / "templates"


def read_template(name: str) -> str:
    """The text of ``templates/<name>``."""
    return (TEMPLATES / name).read_text()


def package_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"absent"``."""
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"


def engine_versions(**packages: str) -> dict:
    """``{field: package_version(distribution)}`` for each ``field=distribution``, plus torch and python."""
    import torch

    return {
        **{field: package_version(name) for field, name in packages.items()},
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def repro_lines(out: Path) -> list[str]:
    """One Markdown bullet per ``out/repro_*.py``: its link and the first line of its docstring."""
    lines = []
    for script in sorted(out.glob("repro_*.py")):
        text = script.read_text()
        first = text.split('"""')[1].strip().splitlines()[0] if '"""' in text else ""
        lines.append(f"- [`{script.name}`]({script.name}): {first}")
    return lines


def decoder_target_args(module: str, *, target_keys=("temperature", "top_k", "top_p"), **options) -> list[str]:
    """Audit arguments: ``module:tiny_decoder`` with ``options`` against ``module:tiny_target`` with those in ``target_keys``."""
    args = ["--decoder", f"{module}:tiny_decoder"]
    for key, value in options.items():
        args += ["--decoder-option", f"{key}={value}"]
    args += ["--target", f"{module}:tiny_target"]
    for key in target_keys:
        if key in options:
            args += ["--target-option", f"{key}={options[key]}"]
    return args


def run_config(name: str, args: list[str], *, out: Path, seed: int, tier: str) -> float:
    """Run one configuration's ``specverify audit`` in a subprocess; return its wall time in seconds.

    ``args`` starts with the role flag and its spec (``--verifier X``, ``--decoder X``); the
    configuration's own options come after the common ones, so one of its own ``--tier`` wins.
    """
    argv = ["audit", *args[:2], "--tier", tier, "--seed", str(seed), "--out", str(out / name), *args[2:]]
    code = "import sys; from specverify.cli import main; sys.exit(main(sys.argv[1:]))"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    if proc.returncode not in (0, 1, 2) or not (out / name / "report.json").exists():
        raise RuntimeError(f"{name}: specverify audit exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def _num(value) -> float:
    """A JSON number, or the string a report uses for inf / nan, as a float."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _result_text(r: dict) -> str:
    where = f"{r['scenario']}/{r['position']}" if r.get("position") else r["scenario"]
    adj = r["adjusted_pvalue"]
    return (
        f"[{r['grade'].upper()}] {r['family']}/{r['name']} {where}: statistic={_num(r['statistic']):.4g}, "
        f"p={_num(r['pvalue']):.3g}, adjusted p={'-' if adj is None else f'{adj:.3g}'}, N={r['n']}"
    )


def evidence(report: dict) -> str:
    """The first implementation error and the flagged statistical test with the smallest adjusted p."""
    parts = []
    if report["errors"]:
        parts.append(f"implementation error in {len(report['errors'])} scenarios, e.g. {report['errors'][0]}")
    gated = report.get("gate_conformance", True)  # a schema-1 report graded acceptance with the law
    rule = [r for r in report["results"] if r["family"] in CONFORMANCE_FAMILIES and r["adjusted_pvalue"] is not None]
    stats = [
        r
        for r in report["results"]
        if r["family"] != "protocol" and r["adjusted_pvalue"] is not None and (gated or r not in rule)
    ]
    flagged = [r for r in stats if r["grade"] in ("fail", "suspicious")]
    if flagged:
        parts.append(
            "strongest: " + _result_text(min(flagged, key=lambda r: (r["adjusted_pvalue"], -abs(_num(r["statistic"])))))
        )
    elif stats:
        smallest = min(stats, key=lambda r: _num(r["pvalue"]))
        parts.append(f"no test flagged; smallest raw p: {_result_text(smallest)}")
    else:
        parts.append("no test flagged")
    rule_flagged = [r for r in rule if r["grade"] in ("fail", "suspicious")]
    if not gated and rule_flagged:
        worst = min(rule_flagged, key=lambda r: (r["adjusted_pvalue"], -abs(_num(r["statistic"]))))
        parts.append(f"rule conformance {worst['grade'].upper()} (not gating): {_result_text(worst)}")
    return "; ".join(parts)


def detectable(report: dict) -> str:
    """The detectable binned TV of a report's tests: median (best, worst), or a dash."""
    tvs = sorted(
        r["mde_tv"] for r in report["results"] if isinstance(r["mde_tv"], float) and math.isfinite(r["mde_tv"])
    )
    if not tvs:
        return "- (exact equality)" if report.get("extra", {}).get("mode") == "greedy" else "-"
    return f"median {tvs[len(tvs) // 2]:.3g} (best {tvs[0]:.3g}, worst {tvs[-1]:.3g})"


def readme_rows(out: Path, configs) -> tuple[list[str], list[str]]:
    """The README table rows and evidence lines of the configurations ``(name, what, expected or None)``
    that have a ``report.json`` under ``out``."""
    rows, lines = [], []
    for name, what, expected in configs:
        path = out / name / "report.json"
        if not path.exists():
            continue
        rep = json.loads(path.read_text())
        secs = rep["timings"].get("total", float("nan"))
        middle = f"{what} | {expected} |" if expected is not None else f"{what} |"
        rows.append(
            f"| [`{name}`]({name}/report.md) | {middle} **{rep['verdict'].upper()}** | "
            f"{detectable(rep)} | {len(rep['results'])} | {secs:.0f} s |"
        )
        lines.append(f"- `{name}`: {evidence(rep)}\n  `{rep['command']}`")
    return rows, lines


def readme_fields(out: Path, configs, *, module: str, seed: int, tier: str) -> dict:
    """The template fields every engine README shares: ``seed``, ``tier``, ``table``, ``evidence``, ``command``.

    ``configs`` as in :func:`readme_rows`; ``module`` is the generator run as ``python -m module``
    (the ``command`` field reruns it with the same ``--out``, ``--seed`` and ``--tier``).
    """
    rows, lines = readme_rows(out, configs)
    return dict(
        seed=seed,
        tier=tier,
        table="\n".join(rows),
        evidence="\n".join(lines),
        command=f"python -m {module} --out {out} --seed {seed} --tier {tier}",
    )


def report_main(argv, *, doc: str, default_out: str, configs, write_readme) -> int:
    """The command line of an engine's report generator: ``configs`` are ``(name, audit args)``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tier", default="smoke", choices=("smoke", "standard", "deep"))
    parser.add_argument("--only", action="append", help="run only these configurations (README keeps the others)")
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from existing reports")
    args = parser.parse_args(argv)
    known = [name for name, _ in configs]
    unknown = [n for n in args.only or () if n not in known]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {known}")
    if not args.readme_only:
        for name, audit_args in configs:
            if args.only and name not in args.only:
                continue
            secs = run_config(name, audit_args, out=args.out, seed=args.seed, tier=args.tier)
            verdict = json.loads((args.out / name / "report.json").read_text())["verdict"]
            print(f"{name}: {verdict} ({secs:.0f} s)", flush=True)
    print(write_readme(args.out, seed=args.seed, tier=args.tier))
    return 0

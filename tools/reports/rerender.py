"""Render committed reports again with the current renderers, from their recorded results.

Every ``report.json`` under the given directories (default ``reports/``) is read back and
written again through :func:`specverify.report.write_report`: ``report.md`` and
``report.html`` get the current layout (plots embedded where the old page had them), a
``module:name`` spec of its recorded command and implementation whose module moved
(:data:`specverify.core.loading.MOVED_MODULES`) names the new module, and the verdict is recomputed from the recorded graded results and implementation errors by
:func:`specverify.stats.run_verdict` -- the same function a rerun would apply to the same
results, so a verdict changes only where the rule that maps results to verdicts changed.
Every ``sweep.json`` is rendered again the same way (:func:`specverify.report.sweep.write_sweep`).
No implementation is run: the statistics are the recorded ones.  ``--check`` writes nothing
and exits 1 if a file would change (JSON and Markdown only: PNG bytes depend on the
matplotlib build).

Run: python tools/reports/rerender.py [DIR ...] [--check]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from specverify import stats
from specverify.core.loading import moved_module
from specverify.core.results import Report
from specverify.report import load_report, render_markdown, write_report
from specverify.report.sweep import render_sweep_markdown, write_sweep
from specverify.measure.sweep import SweepResult

ROOT = Path(__file__).resolve().parents[2]


#: A ``package.module:name`` spec in a recorded command or implementation name.
SPEC = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*):([A-Za-z_][\w.]*)")


def current_specs(text: str) -> str:
    """``text`` with every spec whose module moved naming its new module."""

    def new(match: re.Match) -> str:
        module, name = match.groups()
        moved = moved_module(module, name)
        return f"{moved}:{name}" if moved else match.group(0)

    return SPEC.sub(new, text)


def rerendered(report: Report) -> Report:
    """``report`` with current specs and its verdict recomputed from its recorded results and errors."""
    return dataclasses.replace(
        report,
        verdict=stats.run_verdict(report.results, report.errors, gate_conformance=report.gate_conformance),
        command=current_specs(report.command),
        implementation=current_specs(report.implementation),
    )


def rerender(directory: Path, *, check: bool) -> list[str]:
    """Render every report and sweep under ``directory``; return what changed (or would change)."""
    changed = []
    for path in sorted(directory.rglob("report.json")):
        old = load_report(path)
        new = rerendered(old)
        markdown = path.with_name("report.md")
        stale = new != old or (markdown.exists() and markdown.read_text() != render_markdown(new))
        if stale:
            note = f" (verdict {old.verdict} -> {new.verdict})" if new.verdict != old.verdict else ""
            note += " (moved specs)" if new.command != old.command else ""
            changed.append(f"{path.parent.relative_to(ROOT)}{note}")
        if not check:
            html = path.with_name("report.html")
            write_report(new, path.parent, plots=not html.exists() or "data:image/png" in html.read_text())
    for path in sorted(directory.rglob("sweep.json")):
        sweep = SweepResult.from_dict(json.loads(path.read_text()))
        markdown = path.with_name("sweep.md")
        if markdown.exists() and markdown.read_text() != render_sweep_markdown(sweep):
            changed.append(str(path.parent.relative_to(ROOT)))
        if not check:
            html = path.with_name("sweep.html")
            write_sweep(sweep, path.parent, plots=not html.exists() or "data:image/png" in html.read_text())
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, default=[ROOT / "reports"])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a report would change")
    args = parser.parse_args(argv)
    changed = [line for d in args.dirs for line in rerender(d.resolve(), check=args.check)]
    for line in changed:
        print(("stale: " if args.check else "rendered again: ") + line)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

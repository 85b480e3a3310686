"""The engine matrix that opens ``reports/README.md``: every committed engine report in one table.

::

    python -m tools.reports.matrix [--reports reports]   # rewrites the matrix section of reports/README.md

One row per ``report.json`` under an engine's directory (``reports/<engine>/.../report.json``), and
one per configuration that wrote no report (a ``run.json`` whose ``error`` says why: refused with HTTP
4xx, the server crashed, it answered HTTP 5xx or did not start; or whose ``not_audited`` says why a
server that ran was not audited):
engine, configuration (linked to its report), what was audited (subject and mode: exact
conditionals, two-sample, greedy; in process or served over HTTP), the options the report
records, the verdict, logprob fidelity where the audit checked it, and the median detectable
binned TV at power 0.9 over the report's tests.  Every cell is read from the report, never
written by hand; ``tests/test_committed_reports.py`` checks the committed section is this
module's rendering of the committed reports.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

from specverify.bench.output import median_detectable_tv

__all__ = ["ENGINES", "matrix_rows", "render_matrix", "update_readme"]

#: Engine directories under reports/ and how the matrix names them.
ENGINES = {
    "vllm": "vLLM",
    "hf-transformers": "transformers",
    "llama-cpp": "llama-cpp-python",
    "llama-server": "llama.cpp llama-server",
    "mistralrs": "mistral.rs",
    "onnxruntime-genai": "ONNX Runtime GenAI",
    "openvino": "OpenVINO GenAI",
    "eagle": "EAGLE (SafeAILab)",
    "sglang": "SGLang",
}
START, END = "<!-- engine-matrix:start -->", "<!-- engine-matrix:end -->"


def _median_tv(results: list) -> str:
    tv = median_detectable_tv(results)
    return "n/a" if tv is None else f"{tv:.3g}"


def _options(report: dict) -> str:
    endpoint = (report.get("extra") or {}).get("endpoint")
    if isinstance(endpoint, dict) and isinstance(endpoint.get("sampling"), dict):
        sampling = endpoint["sampling"]
        return ", ".join(f"{k}={v}" for k, v in sampling.items() if v is not None)
    implementation = str(report.get("implementation") or "")
    head, _, args = implementation.partition("(")
    return args[:-1] if args.endswith(")") else ""


def _audit(report: dict) -> str:
    extra = report.get("extra") or {}
    endpoint = extra.get("endpoint")
    mode = (endpoint or {}).get("mode") if isinstance(endpoint, dict) else extra.get("mode")
    where = "served" if isinstance(endpoint, dict) else "in process"
    return f"{report.get('kind', '?')}, {mode.replace('_', '-') if mode else 'battery'}, {where}"


def _fidelity(report: dict) -> str:
    fidelity = (report.get("extra") or {}).get("logprob_fidelity")
    return fidelity["verdict"] if isinstance(fidelity, dict) and "verdict" in fidelity else "not checked"


#: ``specverify audit`` arguments that say how an audit ran, not what the server was asked (value-taking first).
_RUN_FLAGS = ("--endpoint", "--model", "--samples-per-request", "--tier", "--seed", "--out", "--alpha",
              "--reference-endpoint", "--num-samples", "--api")  # fmt: skip
_RUN_SWITCHES = ("--skip-determinism", "--no-plots")


def _asked(command: str) -> str:
    """The sampling options of a recorded ``specverify audit`` command (what the server was asked)."""
    words, kept = shlex.split(command)[2:], []
    while words:
        word = words.pop(0)
        if word in _RUN_FLAGS:
            words = words[1:]
        elif word not in _RUN_SWITCHES:
            kept.append(word)
    return shlex.join(kept)


def _failure(run: dict) -> tuple[str, str]:
    """How a configuration that wrote no report ended, and the server's words: ``refused`` (an HTTP 4xx
    answer), ``crashed`` (the server stopped answering; its logged root cause), ``server error`` (HTTP 5xx),
    ``not run`` (it did not start) or ``not audited`` (it ran, and the record says why no audit did)."""
    if not run.get("error") and run.get("not_audited"):
        return "not audited", str(run["not_audited"])
    error = str(run.get("error") or "")
    words = error.split(": ", 2)[-1] if error.startswith("EndpointError: POST ") else error
    logged = run.get("server_error")
    if re.search(r"HTTP 4\d\d", words):
        return "refused", words
    if "unreachable" in words and logged:
        return "crashed", f"the server died: {logged}"
    if re.search(r"HTTP 5\d\d", words):
        return "server error", words + (f"; it logged: {logged}" if logged else "")
    return "not run", words


def matrix_rows(reports: Path) -> list[dict]:
    """One row per engine report (or recorded refusal) under ``reports``, by engine, then configuration."""
    rows = []
    for folder, engine in ENGINES.items():
        found = {p.parent: p for p in (reports / folder).rglob("report.json")}
        for path in (reports / folder).rglob("run.json"):
            run = json.loads(path.read_text(encoding="utf-8"))
            if path.parent not in found and (run.get("error") or run.get("not_audited")):
                found[path.parent] = path
        for directory in sorted(found):
            relative = directory.relative_to(reports)
            row = {"engine": engine, "configuration": str(relative.relative_to(folder))}
            if found[directory].name == "run.json":
                run = json.loads(found[directory].read_text(encoding="utf-8"))
                command = str(run.get("audit_command") or "")
                verdict, words = _failure(run)
                rows.append({**row, "link": f"{relative.as_posix()}/run.json", "audit": "decoder, served",
                             "options": (_asked(command) + "; " if command else "") + f"{verdict}: {words}",
                             "verdict": verdict, "fidelity": "-", "tv": "-"})  # fmt: skip
                continue
            report = json.loads(found[directory].read_text(encoding="utf-8"))
            rows.append({
                **row,
                "link": f"{relative.as_posix()}/report.md",
                "audit": _audit(report),
                "options": _options(report),
                "verdict": report.get("verdict", "?"),
                "fidelity": _fidelity(report),
                "tv": _median_tv(report.get("results") or []),
            })  # fmt: skip
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_matrix(rows: list[dict]) -> str:
    """The matrix section (between its markers) as Markdown."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    lines = [
        START,
        "## Engine matrix",
        "",
        "Every committed engine report, one row each: engine x configuration x options -> verdict, logprob "
        "fidelity and the median detectable binned TV at power 0.9 (alpha 1e-3 per run, whatever the tier). "
        "Generated from the reports by `python -m tools.reports.matrix`; do not edit by hand. "
        f"{len(rows)} reports: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) + ". "
        "An `error` is a finding too (the engine crashed or broke the protocol), and so are the rows that "
        "wrote no report: `refused` (the server answered the configuration's requests with HTTP 4xx), "
        "`crashed` (the server died during the audit; its logged root cause is in the row), `server error` "
        "(HTTP 5xx), `not run` (the server did not start; its logged error) and `not audited` (it ran; why "
        "no audit did); each "
        "engine's README says what every FAIL and ERROR is, with its standalone repro and upstream status.",
        "",
        "| engine | configuration | audit | options | verdict | logprob fidelity | detectable TV (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['engine']} | [{_cell(row['configuration'])}]({row['link']}) | {_cell(row['audit'])} | "
            f"{_cell(row['options'])} | **{row['verdict']}** | {row['fidelity']} | {row['tv']} |"
        )
    return "\n".join(lines + ["", END])


def update_readme(reports: Path) -> Path:
    """Write the matrix into ``reports/README.md``: replace its section, or insert it after the title."""
    path = reports / "README.md"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Reports\n"
    section = render_matrix(matrix_rows(reports))
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{section}\n{rest}"
    path.write_text(text, encoding="utf-8")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", default="reports", help="the reports directory (default reports)")
    args = parser.parse_args(argv)
    print(update_readme(Path(args.reports)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

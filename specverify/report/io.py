"""Writing and reading report files: atomic writes, JSON only (never pickles).

:func:`write_report` renders all three files in memory first and then writes each
one to a temporary file in the destination directory and ``os.replace``-s it over
the old one, so a reader sees either the previous file or the new one, never a
torn write; on any error the temporary file is removed and the previous file is
left untouched.  :func:`load_report` parses ``report.json`` with :mod:`json` and
:meth:`specverify.core.results.Report.from_json` (which checks the schema version).
"""

from __future__ import annotations

import json
from pathlib import Path

from specverify.core.errors import InvalidArgument
from specverify.core.files import atomic_write_text, check_out_dir
from specverify.core.results import Report
from specverify.report.html import render_html
from specverify.report.markdown import render_markdown

__all__ = ["FILENAMES", "atomic_write_text", "check_out_dir", "load_report", "write_report"]

FILENAMES = {"json": "report.json", "markdown": "report.md", "html": "report.html"}


def write_report(report: Report, out_dir, *, plots: bool = True) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``report.html`` into ``out_dir`` (created if needed).

    Parameters
    ----------
    report : Report
        The run to write; ``report.to_json()`` is the JSON file verbatim.
    out_dir : str or os.PathLike
        Destination directory.
    plots : bool, keyword-only
        Embed PNG plots in the HTML (needs matplotlib; without it the HTML says so).

    Returns
    -------
    dict
        ``{"json": Path, "markdown": Path, "html": Path}``.
    """
    if not isinstance(report, Report):
        raise InvalidArgument(f"report must be a specverify.core.results.Report, got {type(report).__name__}")
    out = check_out_dir(out_dir)
    texts = {
        "json": report.to_json() + "\n",
        "markdown": render_markdown(report),
        "html": render_html(report, plots=bool(plots)),
    }
    out.mkdir(parents=True, exist_ok=True)
    return {key: atomic_write_text(out / FILENAMES[key], text) for key, text in texts.items()}


def load_report(path) -> Report:
    """Read a report written by :func:`write_report` (a ``report.json`` file or its directory)."""
    try:
        path = Path(path)
    except TypeError:
        raise InvalidArgument(f"path must be a path, got {path!r}") from None
    if path.is_dir():
        path = path / FILENAMES["json"]
    if not path.is_file():
        raise InvalidArgument(f"path {str(path)!r} is not a report.json file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"path {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"path {str(path)!r} does not hold a JSON object")
    try:
        return Report.from_dict(data)
    except InvalidArgument:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"path {str(path)!r} is not a valid specverify report: {exc}") from None

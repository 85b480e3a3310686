"""Every engine finding's repro script runs where specverify is not installed.

The scripts under ``reports/<engine>/repro_*.py`` are for the engine's maintainers, who have the
engine and not this project: each must build what it needs itself (a tiny model from a config,
the exact law in float64) and import nothing of ``specverify`` or ``reference``.  Parsed with
``ast`` only (the engines are not installed in CI); the scripts themselves run in the engines'
virtualenvs (their docstrings give the pip line and the expected output).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parent.parent / "reports"
SCRIPTS = sorted(REPORTS.glob("*/repro_*.py"))
PROJECT_PACKAGES = ("specverify", "reference")


def _imported_modules(tree: ast.AST) -> list[str]:
    """Top-level names of every module the code imports (``import a.b`` / ``from a.b import c`` -> ``a``)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            names += [arg.value.split(".")[0] for arg in node.args[:1] if isinstance(arg, ast.Constant)]
    return names


def test_every_engine_folder_with_findings_has_repro_scripts():
    folders = {path.parent.name for path in SCRIPTS}
    assert {"vllm", "openvino", "eagle", "hf-transformers"} <= folders, folders


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(REPORTS)) for p in SCRIPTS])
def test_repro_script_does_not_import_the_project(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    project = sorted({name for name in _imported_modules(tree) if name in PROJECT_PACKAGES})
    assert not project, f"{path.relative_to(REPORTS)} imports {project}: an engine maintainer cannot run it"


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(REPORTS)) for p in SCRIPTS])
def test_repro_script_says_what_it_shows_how_to_run_it_and_what_it_prints(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert doc.splitlines() and doc.splitlines()[0].strip(), f"{path.name}: no one-line summary"
    assert "pip install" in doc, f"{path.name}: the docstring gives no pip line"
    assert "Expected output" in doc, f"{path.name}: the docstring gives no expected output"


def test_the_import_scan_sees_every_form():
    code = "import os, specverify.adapters\nfrom reference import rules\nfrom . import x\nimportlib.import_module('specverify.x')\n"
    assert sorted(set(_imported_modules(ast.parse(code)))) == ["os", "reference", "specverify"]

"""The command line's first minutes: usage errors said in one line before torch is imported,
``python -m specverify``, packages in the working directory, and ``list_scenarios`` by battery kind.

Timings are not asserted here (``benchmarks/bench_cli.py`` measures them); what makes usage
errors fast is checked instead: torch, numpy and scipy are not imported when they are reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specverify as sv
from specverify.core.errors import InvalidArgument
from specverify.core.loading import load_object, put_on_import_path

CONSOLE_SCRIPT = Path(sys.executable).with_name("specverify")

USAGE_ERRORS = {
    "seed": (
        ["audit", "--verifier", "reference.rules:verify", "--seed", "-1"],
        "argument --seed: must be an integer >= 0",
    ),
    "alpha": (
        ["audit", "--verifier", "reference.rules:verify", "--alpha", "2"],
        "argument --alpha: must be a number in (0, 1)",
    ),
    "tier": (
        ["audit", "--verifier", "reference.rules:verify", "--tier", "huge"],
        "argument --tier: invalid choice: 'huge'",
    ),
    "workers": (
        ["audit", "--verifier", "reference.rules:verify", "--workers", "0"],
        "argument --workers: must be an integer >= 1",
    ),
    "level": (
        ["measure", "--verifier", "reference.lossy:ensemble", "--level", "1.5"],
        "argument --level: must be a number in (0, 1)",
    ),
    "module": (["audit", "--verifier", "nosuch.mod:verify"], "cannot import module 'nosuch.mod'"),
}

PROBE = """
import contextlib, io, json, sys
from specverify.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        status = main(json.loads(sys.argv[1]))
    except SystemExit as exit:
        status = exit.code
heavy = sorted(m for m in ("torch", "numpy", "scipy") if m in sys.modules)
print(json.dumps({"status": status, "stderr": err.getvalue(), "heavy": heavy}))
"""


def _probe(argv: list[str], cwd: Path | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, cwd=cwd, check=True
    )
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_errors_are_one_line_and_a_hint_before_torch_is_imported(case):
    argv, message = USAGE_ERRORS[case]
    out = _probe(argv)
    assert out["status"] == 2
    lines = out["stderr"].strip().splitlines()
    assert message in lines[0]
    assert "usage:" not in out["stderr"], "the usage block is not printed"
    assert len(lines) <= 2 and (len(lines) == 1 or "--help" in lines[1])
    assert out["heavy"] == [], f"imported {out['heavy']} before reporting a usage error"


def test_python_dash_m_specverify_is_the_command():
    done = subprocess.run([sys.executable, "-m", "specverify", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage: specverify")
    done = subprocess.run([sys.executable, "-m", "specverify", "audit", "--seed", "x"], capture_output=True, text=True)
    assert done.returncode == 2 and "--seed: must be an integer >= 0, got 'x'" in done.stderr


def _user_package(root: Path) -> None:
    (root / "mybad").mkdir()
    (root / "mybad" / "__init__.py").write_text("")
    (root / "mybad" / "spec.py").write_text(
        "def verify(target_probs, draft_probs, draft_tokens, *, generator):\n    pass\n"
    )


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the console script is not installed next to this python")
def test_the_console_script_finds_a_package_in_the_working_directory(tmp_path):
    _user_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = [str(CONSOLE_SCRIPT), "audit", "--verifier"]
    found = subprocess.run([*run, "mybad.spec:nosuch"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert found.returncode == 2
    assert "'mybad.spec' has no attribute 'nosuch'" in found.stderr  # imported from the working directory
    elsewhere = subprocess.run(
        [*run, "mybad.spec:verify"], cwd=tmp_path.parent, env=env, capture_output=True, text=True
    )
    assert elsewhere.returncode == 2
    assert "'mybad' is not on the import path" in elsewhere.stderr and "PYTHONPATH" in elsewhere.stderr


def test_put_on_import_path_adds_the_directory_once(tmp_path, monkeypatch):
    _user_package(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "mybad", raising=False)
    monkeypatch.delitem(sys.modules, "mybad.spec", raising=False)
    with pytest.raises(InvalidArgument, match="not on the import path"):
        load_object("mybad.spec:verify")
    put_on_import_path()
    put_on_import_path()
    assert sys.path.count(str(tmp_path)) == 1
    assert callable(load_object("mybad.spec:verify"))


def test_a_module_that_fails_inside_gets_no_path_hint(tmp_path, monkeypatch):
    (tmp_path / "brokenmod.py").write_text("import nosuch_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InvalidArgument) as info:
        load_object("brokenmod:verify")
    assert "nosuch_dependency" in str(info.value) and "not on the import path" not in str(info.value)


def test_list_scenarios_takes_the_battery_kind():
    from specverify.verifier.tree.scenarios import get_tree_scenarios
    from specverify_reference.tree_rules import verify_tree

    chain = sv.list_scenarios("verifier")
    assert chain == sv.list_scenarios() and len(chain) == len(set(chain)) == 17
    trees = sv.list_scenarios("tree_verifier")
    assert trees == [s.name for s in get_tree_scenarios()]
    plain = sv.list_scenarios("tree_verifier", verify_tree=verify_tree)
    edge = [s.name for s in get_tree_scenarios() if s.edge_coins]
    assert edge and plain == [n for n in trees if n not in edge]
    with pytest.raises(InvalidArgument, match="tier is a keyword"):
        sv.list_scenarios("smoke")
    with pytest.raises(InvalidArgument, match="no greedy mode"):
        sv.list_scenarios("tree_verifier", greedy=True)

"""The README's install instructions install this suite, not the unrelated ``specverify`` on PyPI.

The fast tests read the README: every ``pip install`` names this distribution by a direct
reference (a git address or a path), never by the bare PyPI name, and the GitHub Actions
snippet's ``SPECVERIFY`` is such a reference.  The slow test runs the snippet's ``run:`` steps,
exactly as written, in a fresh virtualenv of a fresh user project, with ``SPECVERIFY`` pointing at
this checkout, and checks that the plugin ran the battery on the user's verifier.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import venv
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DISTRIBUTION = "specverify-suite"


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _ci_snippet() -> str:
    blocks = [b for b in _code_blocks(README, "yaml") if "pytest -m specverify" in b]
    assert len(blocks) == 1, "the README has one GitHub Actions snippet running the plugin"
    return blocks[0]


def _pip_install_words(line: str) -> list[str]:
    """The requirement words of one ``pip install ...`` command (options and their values dropped)."""
    words = shlex.split(line.split("#")[0])
    out, i = [], words.index("install") + 1
    while i < len(words) and words[i] not in ("&&", ";", "|"):
        word = words[i]
        if word in ("--extra-index-url", "--index-url", "-r", "-c", "--find-links", "-f"):
            i += 2
            continue
        if not word.startswith("-"):
            out.append(word)
        i += 1
    return out


def _pip_lines(text: str) -> list[str]:
    lines = []
    for block in _code_blocks(text, "bash") + _code_blocks(text, "yaml"):
        for line in block.splitlines():
            for part in re.split(r"&&|;", line):
                if re.search(r"\bpip install\b", part):
                    lines.append(part.strip().removeprefix("- run:").strip())
    return lines


def test_the_distribution_name_is_not_the_unrelated_pypi_project():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert project["scripts"] == {"specverify": "specverify.cli:console_main"}


def test_no_install_line_asks_pypi_for_the_bare_name():
    lines = _pip_lines(README)
    assert len(lines) >= 5
    bare = re.compile(r"specverify(\[[^\]]*\])?([=<>~!].*)?", re.I)
    offenders = [line for line in lines for word in _pip_install_words(line) if bare.fullmatch(word)]
    assert offenders == [], "pip would install the unrelated PyPI 'specverify'"


def test_the_ci_snippet_installs_this_suite_by_a_direct_reference():
    snippet = _ci_snippet()
    (source,) = re.findall(r'SPECVERIFY: "(.*)"', snippet)
    name, at, address = source.partition(" @ ")
    assert at and re.fullmatch(rf"{DISTRIBUTION}\[[a-z,]*test[a-z,]*\]", name), source
    assert address.startswith("git+https://")
    runs = re.findall(r"- run: (.*)", snippet)
    assert any('"$SPECVERIFY"' in run for run in runs)
    assert any(run.startswith("pip install torch==") for run in runs), "CPU torch first"


USER_SPEC = '''\
"""A user's verifier: the canonical rule, under the user's own name."""
from specverify_reference.rules import verify as _canonical


def verify(target_probs, draft_probs, draft_tokens, *, generator):
    return _canonical(target_probs, draft_probs, draft_tokens, generator=generator)
'''

USER_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "mypkg"
version = "0.0.1"

[tool.setuptools]
packages = ["mypkg"]
"""


@pytest.mark.slow
def test_the_ci_snippet_installs_the_suite_and_its_plugin_in_a_fresh_user_project(tmp_path):
    project = tmp_path / "user-project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "spec.py").write_text(USER_SPEC)
    (project / "pyproject.toml").write_text(USER_PYPROJECT)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    snippet = _ci_snippet()
    (source,) = re.findall(r'SPECVERIFY: "(.*)"', snippet)
    name = source.partition(" @ ")[0]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}",
        VIRTUAL_ENV=str(env_dir),
        SPECVERIFY=f"{name} @ {ROOT.as_uri()}",  # this checkout, where the snippet names a git address
    )
    for run in re.findall(r"- run: (.*)", snippet):
        done = subprocess.run(["bash", "-c", run], cwd=project, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{run}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    listed = subprocess.run(
        [str(env_dir / "bin" / "pip"), "show", DISTRIBUTION], env=env, capture_output=True, text=True
    ).stdout
    assert f"Name: {DISTRIBUTION}" in listed
    assert (project / "specverify.xml").is_file() and (project / "specverify-report" / "report.json").is_file()
    junit = (project / "specverify.xml").read_text()
    assert 'name="specverify[protocol]"' in junit and "<failure" not in junit


def test_every_package_is_in_the_wheel_and_reference_installs_under_its_own_name():
    """pyproject lists its packages (discovery cannot rename reference/): none may be missing."""
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert set(find_packages(str(ROOT), include=["specverify", "specverify.*"])) <= listed
    assert config["package-dir"] == {"specverify_reference": "reference"} and "reference" not in listed

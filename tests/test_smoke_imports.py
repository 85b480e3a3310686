"""The installed packages import and the console script's entry point runs."""

import subprocess
import sys


def test_imports_from_installed_package():
    code = "import specverify, specverify_reference.rules, specverify.core.sampling, specverify.core.errors; print(specverify.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == __import__("specverify").__version__


def test_no_generic_top_level_name_is_installed_and_reference_specs_still_load():
    """Outside the checkout ``reference`` is not importable (no clash with a user's package), yet the
    documented ``reference.rules:verify`` loads ours; a user's own ``reference`` package wins."""
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('reference') is None\n"
        "from specverify.core.loading import load_object\n"
        "print(load_object('reference.rules:verify').__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "specverify_reference.rules"


def test_a_users_own_reference_package_is_theirs(tmp_path):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "__init__.py").write_text("")
    (tmp_path / "reference" / "rules.py").write_text("def verify():\n    return 'theirs'\n")
    code = "from specverify.core.loading import load_object; print(load_object('reference.rules:verify')())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "theirs"


def test_cli_version():
    from specverify.cli import main

    try:
        main(["--version"])
    except SystemExit as exit:
        assert exit.code == 0


def test_the_version_is_the_distributions():
    """``specverify.__version__`` (what reports record) is the installed distribution's version."""
    from importlib.metadata import version

    import specverify

    assert specverify.__version__ == version("specverify-suite")

"""The installed packages import and the console script's entry point runs."""

import subprocess
import sys


def test_imports_from_installed_package():
    code = "import specverify, reference.rules, specverify.core.sampling, specverify.core.errors; print(specverify.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == __import__("specverify").__version__


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

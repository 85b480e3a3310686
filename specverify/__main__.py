"""``python -m specverify``: the ``specverify`` command (see :mod:`specverify.cli.commands`)."""

import sys

from specverify.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())

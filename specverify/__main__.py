"""``python -m specverify``: the ``specverify`` command (see :mod:`specverify.cli.commands`)."""

import sys

from specverify.cli import main

if __name__ == "__main__":
    sys.exit(main())

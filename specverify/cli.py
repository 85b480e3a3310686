"""The ``specverify`` command line."""

from __future__ import annotations

import argparse
import sys

import specverify


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specverify", description=__doc__)
    parser.add_argument("--version", action="version", version=f"specverify {specverify.__version__}")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("demo", help="run the canonical rule against an adversarial drafter and print the emitted law")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from specverify.demo import main as demo_main

        return demo_main()
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())

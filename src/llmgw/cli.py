"""`llmgw`: one command line, one place that maps errors to exit codes."""

from __future__ import annotations

import argparse
import os
import sys

from llmgw import __version__
from llmgw.errors import LlmgwError
from llmgw.text import printable


def build_parser() -> argparse.ArgumentParser:
    from llmgw.ctl import main as ctl
    from llmgw.pki import commands as pki

    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw fleet control")
    parser.add_argument("--version", action="version", version=f"llmgw {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pki.add_parser(sub)
    ctl.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except LlmgwError as e:
        # The words may be a node's (a refusal relayed): shown, never obeyed by the terminal.
        words = printable(str(e), keep="\n")
        print(f"llmgw: {words}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away early (`llmgw ctl replicas --json | head`): what
        # it wanted it has.  Point stdout at /dev/null so the flush at exit does
        # not raise a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""llmgw-tui: the terminal dashboard of the fleet (see docs/tui.rst).

Importing this package imports neither Textual nor Twisted's reactor; ``main``
does, in that order that lets it put Twisted on Textual's event loop.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from llmgw.tui.cli import main as run

    return run(argv)

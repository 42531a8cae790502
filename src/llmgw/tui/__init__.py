"""llmgw-tui: the terminal dashboard (arrives with its own issue)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "llmgw-tui: the dashboard is not built yet; use `llmgw ctl nodes` meanwhile.",
        file=sys.stderr,
    )
    return 2

"""docs/placement.rst's table of filters is the filters placement runs, in their order.

The page said disk was not checked for a while after the disk filter ran;
an operator reading why a node was refused reads this table.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.control.placement_filters import FILTERS

DOC = Path(__file__).resolve().parents[2] / "docs" / "placement.rst"


def documented_filters(text: str) -> list[str]:
    """The first column of the table under "Filters: who could", one name per row."""
    section = text.split("Filters: who could", 1)[1]
    lines = section.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("=====")]
    body = lines[rules[1] + 1 : rules[2]]
    return [line.split()[0] for line in body if line[:1].strip()]


def test_the_filter_table_lists_every_filter_in_the_order_they_run() -> None:
    assert documented_filters(DOC.read_text()) == [f.__name__ for f in FILTERS]


def test_the_page_no_longer_says_disk_is_unchecked() -> None:
    assert "not checked here yet" not in DOC.read_text()

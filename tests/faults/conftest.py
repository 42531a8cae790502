"""The fault suite's fixtures, and the table of its figures printed at the end of the session.

Each test records one row (``record_figures``); the rows go to
``fault-figures.json`` in the session's temporary directory as they come, and
to the terminal as one table when the session ends.
"""

from __future__ import annotations

import json

import attrs
import pytest

from tests.faults.bed import Bed, Figures
from tests.support.cluster import cluster  # noqa: F401 - a fixture

ROWS = pytest.StashKey[list]()
PATH = pytest.StashKey[object]()
COLUMNS = [
    ("fault", "fault"), ("requests", "requests"), ("cut", "cut mid-answer"), ("before_bytes", "failed before a byte"),
    ("elsewhere", "failed elsewhere"), ("outage", "failed in outage"), ("orphaned", "orphaned"),
    ("started_twice", "started twice"), ("recover_s", "recover s"),
]


@pytest.fixture
def bed(cluster):  # noqa: F811 - the fixture imported above
    """A Bed on the test's cluster; its load is stopped before the cluster is."""
    b = Bed(cluster)
    yield b
    b.stop_load()


@pytest.fixture
def record_figures(request, tmp_path_factory):
    """record_figures(Figures): one row of the session's table, written to fault-figures.json at once."""
    config = request.config

    def record(figures: Figures) -> Figures:
        rows = config.stash.setdefault(ROWS, [])
        rows.append(figures)
        path = config.stash.setdefault(PATH, tmp_path_factory.getbasetemp() / "fault-figures.json")
        path.write_text(json.dumps([attrs.asdict(r) for r in rows], indent=1) + "\n")
        return figures

    return record


def table(rows: list[Figures]) -> list[str]:
    cells = [[title for _, title in COLUMNS]]
    for row in rows:
        cells.append(["-" if getattr(row, name) is None else str(getattr(row, name)) for name, _ in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{row.fault}: {row.note}" for row in rows if row.note]
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(ROWS, [])
    if not rows:
        return
    terminalreporter.section("what llmgw survived")
    for line in table(rows):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"(also in {config.stash[PATH]})")

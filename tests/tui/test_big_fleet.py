"""What keeps a snapshot of ten thousand nodes quick must not change what a person sees.

A snapshot into an empty table is built in order rather than sorted after,
and the table measures its new rows' widths itself; the rows and the
widths must be what Textual's DataTable would have made of the same cells.
The start-up check reads one node, not the whole list.
"""

from __future__ import annotations

import random

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from llmgw.link import uris
from llmgw.tui import cli
from llmgw.tui.table import REBUILD_AFTER, FleetTable, shown_row

from .tui_helpers import until

pytestmark = pytest.mark.asyncio(loop_scope="session")

COLUMNS = (("node", "NODE"), ("state", "STATE"), ("note", "NOTE"))


def many_rows() -> dict[str, tuple]:
    """More rows than REBUILD_AFTER, in no order, with cells of every kind a width is measured for."""
    keys = [f"gpu{i}" for i in range(REBUILD_AFTER * 3)]
    random.Random(4).shuffle(keys)
    rows = {key: (key, Text("ready", style="green"), "-") for key in keys}
    rows["gpu7"] = ("gpu7", Text("unreachable,cordoned", style="yellow"), "GPU 节点 (wide characters)")
    rows["gpu8"] = ("gpu8", Text("ready !"), "[bold]markup[/bold] shown as it is")  # not read as markup
    rows["gpu9"] = ("gpu9", Text("lost"), Text("two\nlines"))  # one line, the newline escaped
    rows["gpu10"] = ("gpu10", "ready", 3.14159)  # a float, as DataTable formats it
    return rows


class Both(App):
    def compose(self) -> ComposeResult:
        yield FleetTable(COLUMNS, ("node",), id="fleet")
        yield DataTable(id="stock")

    def on_mount(self) -> None:
        stock = self.query_one("#stock", DataTable)
        for key, label in COLUMNS:
            stock.add_column(label, key=key)


async def test_a_snapshot_into_an_empty_table_is_in_natural_order_with_the_widths_datatable_measures():
    app = Both()
    rows = many_rows()
    async with app.run_test(size=(120, 40)) as pilot:
        fleet = app.query_one("#fleet", FleetTable)
        stock = app.query_one("#stock", DataTable)
        fleet.replace(rows)
        for key, cells in rows.items():
            stock.add_row(*shown_row(cells), key=key)  # what the table shows, as DataTable measures it
        await pilot.pause()
        await until(pilot, lambda: not fleet._new_rows and not stock._new_rows, "both tables to measure their rows")
        shown = [fleet.coordinate_to_cell_key((i, 0)).row_key.value for i in range(fleet.row_count)]
        assert shown[:12] == [f"gpu{i}" for i in range(12)]
        assert sorted(shown) == sorted(rows) and len(shown) == len(rows)
        widths = [c.content_width for c in fleet.ordered_columns]
        assert widths == [c.content_width for c in stock.ordered_columns]

        # Rows added to a table that has some are measured the same way.
        more = {"gpu999": ("gpu999", Text("ready " + "x" * 40), "-")}
        fleet.replace({**rows, **more})
        stock.add_row(*more["gpu999"], key="gpu999")
        await until(pilot, lambda: not fleet._new_rows and not stock._new_rows, "the new row measured")
        assert [c.content_width for c in fleet.ordered_columns] == [c.content_width for c in stock.ordered_columns]
        assert fleet.coordinate_to_cell_key((fleet.row_count - 1, 0)).row_key.value == "gpu999"


async def test_the_start_check_reads_one_node_not_the_whole_fleet(monkeypatch):
    calls = []

    class Session:
        async def call(self, uri, *args, **kwargs):
            calls.append((uri, args, kwargs))
            return []

        def leave(self):
            calls.append("leave")

    async def connect_once(reactor, hub, tls, timeout):
        return Session()

    monkeypatch.setattr("llmgw.link.client.connect_once", connect_once)
    await cli.check_operator(None, None, None, 1.0)
    assert calls == [(uris.CP_NODES, (), {"limit": 1}), "leave"]

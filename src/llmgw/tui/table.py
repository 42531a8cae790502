"""A table whose rows are kept by key and changed in place, with a filter.

An event changes the cells that differ in the one row it is about; rows are
only added, removed or sorted when the set of rows changes, and the whole
table is rebuilt only when the filter changes or many rows go at once.  That
is what keeps a thousand nodes' heartbeats cheap.

Every cell goes in through :func:`shown`: DataTable reads a string cell as
Textual markup, and a node's words are not markup (``[@click=app.quit]`` in
a GPU's name would be an action), nor may they reach the terminal as
escape sequences.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, Sequence

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input

from llmgw.text import printable

# Removing a row from a DataTable renumbers every row after it; past this
# many removals at once, building the table again is cheaper.
REBUILD_AFTER = 50


def natural(values) -> tuple:
    """Sort "gpu2" before "gpu10" and "echo/2" before "echo/10"."""
    if not isinstance(values, tuple):
        values = (values,)
    return tuple(
        tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(v)))
        for v in values
    )


def shown(cell):
    """*cell* as the table may show it: its control characters escaped, and never read as markup.

    A string without a ``[`` stays a string (DataTable shows it as it is,
    and :func:`width` measures it cheaply); one with a ``[`` becomes a
    ``Text``.  A ``Text`` whose words hold a control character is shown as
    its escaped words, unstyled.
    """
    if isinstance(cell, Text):
        return cell if cell.plain.isprintable() else Text(printable(cell.plain))
    text = printable(str(cell))
    return Text(text) if "[" in text else text


def shown_row(cells: tuple) -> tuple:
    return tuple(shown(c) for c in cells)


def plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def width(cell) -> int | None:
    """The columns a one-line cell takes, as DataTable would measure it; None for one it must measure itself.

    A string is read as markup by DataTable, so one with a ``[`` is left to it.
    """
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str) and "[" not in cell:
        text = cell
    else:
        return None
    return None if "\n" in text or "\t" in text else cell_len(text)


class FleetTable(DataTable):
    """Keyed rows: ``apply`` changes some, ``replace`` reconciles all, ``set_filter`` narrows."""

    BINDINGS = [Binding("enter", "select_cursor", "Details")]

    def __init__(self, columns: Sequence[tuple[str, str]], sort_by: Sequence[str], **kwargs):
        # The first column (the node or the model) stays put while ← → scroll the rest.
        super().__init__(cursor_type="row", zebra_stripes=False, fixed_columns=1, **kwargs)
        self._columns = columns
        self._sort_by = tuple(sort_by)
        self._cells: dict[str, tuple] = {}
        self._haystack: dict[str, str] = {}
        self._shown: set[str] = set()
        self.filter_text = ""

    def on_mount(self) -> None:
        for key, label in self._columns:
            self.add_column(label, key=key)

    # -- reading --

    @property
    def total(self) -> int:
        return len(self._cells)

    @property
    def shown(self) -> int:
        return len(self._shown)

    def cells(self, key: str) -> tuple | None:
        return self._cells.get(key)

    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        except Exception:
            return None
        return row_key.value

    def needs_horizontal_scrollbar(self) -> bool:
        """Whether its columns are wider than it is: its rows measured now, not when the app is next idle."""
        self._measure()
        return self.show_horizontal_scrollbar or self.virtual_size.width > self.container_size.width

    class ScrollbarsChanged(Message):
        """A scrollbar came or went: the screen gives the table the room it takes (``FleetScreen._size_tables``)."""

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        self.post_message(self.ScrollbarsChanged())

    # -- changing --

    def _measure(self) -> None:
        """Measure the rows added since the last time, as DataTable does when the app is idle.

        A screen that sizes the table by its rows must know its width before
        the first draw, not after: the scrollbar that comes with the measure
        took the one row's line until the next event.
        """
        if self._require_update_dimensions:
            self._require_update_dimensions = False
            new_rows = self._new_rows.copy()
            self._new_rows.clear()
            self._update_dimensions(new_rows)

    def apply(self, changes: Mapping[str, tuple | None]) -> None:
        """Change, add (with a tuple) or remove (with None) these rows."""
        added = False
        for key, cells in changes.items():
            if cells is None:
                self._forget(key)
                continue
            cells = shown_row(cells)
            old = self._cells.get(key)
            self._cells[key] = cells
            self._haystack[key] = " ".join(plain(c) for c in cells).lower()
            wanted = self._matches(key)
            if key in self._shown:
                if not wanted:
                    self._shown.discard(key)
                    self.remove_row(key)
                elif old != cells:
                    for (column, _), before, after in zip(self._columns, old, cells):
                        if before != after:
                            self.update_cell(key, column, after, update_width=True)
            elif wanted:
                self.add_row(*cells, key=key)
                self._shown.add(key)
                added = True
        if added:
            self._sort()

    def replace(self, rows: Mapping[str, tuple]) -> None:
        """Make the table hold exactly *rows*, changing as little as it can."""
        rows = {key: shown_row(cells) for key, cells in rows.items()}
        gone = [key for key in self._cells if key not in rows]
        if len(gone) > REBUILD_AFTER or (not self._cells and len(rows) > REBUILD_AFTER):
            self._cells = rows
            self._haystack = {k: " ".join(plain(c) for c in v).lower() for k, v in rows.items()}
            self._rebuild()
            return
        changes: dict[str, tuple | None] = {key: None for key in gone}
        changes.update((key, cells) for key, cells in rows.items() if self._cells.get(key) != cells)
        self.apply(changes)

    def set_filter(self, text: str) -> None:
        text = text.strip().lower()
        if text != self.filter_text:
            self.filter_text = text
            self._rebuild()

    def _forget(self, key: str) -> None:
        self._cells.pop(key, None)
        self._haystack.pop(key, None)
        if key in self._shown:
            self._shown.discard(key)
            self.remove_row(key)

    def _matches(self, key: str) -> bool:
        return not self.filter_text or all(word in self._haystack[key] for word in self.filter_text.split())

    def _update_dimensions(self, new_rows) -> None:
        """DataTable's measure of new rows, for one-line cells without rich: the length of their text.

        DataTable measures every cell of every new row through rich, which
        for a snapshot of 10,000 nodes is 90,000 measurements and over a
        second; the widths are the same.  A row with a cell this cannot
        measure is left to DataTable.
        """
        columns = self.ordered_columns
        widths = [column.content_width for column in columns]
        rest = []
        for row_key in new_rows:
            cells = self._cells.get(row_key.value)
            measured = None if cells is None or len(cells) != len(columns) else [width(c) for c in cells]
            if measured is None or None in measured:
                rest.append(row_key)
                continue
            widths = [max(w, m) for w, m in zip(widths, measured)]
        for column, w in zip(columns, widths):
            column.content_width = w
        super()._update_dimensions(rest)

    def _sort(self) -> None:
        self.sort(*self._sort_by, key=natural)

    def _rebuild(self) -> None:
        selected = self.selected_key()
        self.clear()
        keys = [k for k in self._cells if self._matches(k)]
        index = {name: i for i, (name, _) in enumerate(self._columns)}
        keys.sort(key=lambda k: natural(tuple(plain(self._cells[k][index[c]]) for c in self._sort_by)))
        for key in keys:
            self.add_row(*self._cells[key], key=key)
        self._shown = set(keys)
        if selected is not None and selected in self._shown:
            self.move_cursor(row=self.get_row_index(selected), animate=False)


class FilterInput(Input):
    """The `/` line under a table: Enter keeps the filter, Escape clears it."""

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    class Done(Message):
        """The person is done typing; the table takes the focus back."""

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Done())


class TablePane(Vertical):
    """A table and its filter line; subclasses name the columns and make the cells."""

    # Esc clears the filter from the table too, once Enter has kept it.
    BINDINGS = [Binding("escape", "clear_filter", "Clear filter", show=False)]

    COLUMNS: Sequence[tuple[str, str]] = ()
    SORT_BY: Sequence[str] = ()
    #: What the person calls a row, for the filter's placeholder.
    NOUN = "rows"
    #: What a row is: "node" or "replica".
    KIND = ""

    class Opened(Message):
        """Enter on a row: open its details."""

        def __init__(self, kind: str, key: str) -> None:
            super().__init__()
            self.kind = kind
            self.key = key

    def compose(self) -> ComposeResult:
        yield FleetTable(self.COLUMNS, self.SORT_BY)
        yield FilterInput(placeholder=f"filter {self.NOUN}: words that must all appear (Esc clears)")

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    @property
    def filter_input(self) -> FilterInput:
        return self.query_one(FilterInput)

    def focus_table(self) -> None:
        self.table.focus()

    def action_clear_filter(self) -> None:
        if self.filter_input.value:
            self.filter_input.action_clear()

    def start_filter(self) -> None:
        field = self.filter_input
        field.display = True
        field.focus()

    @on(Input.Changed)
    def _filter_changed(self, event: Input.Changed) -> None:
        # Not stopped: the screen shows how many rows the filter left.
        self.table.set_filter(event.value)

    @on(Input.Submitted)
    @on(FilterInput.Done)
    def _filter_done(self, event: Message) -> None:
        event.stop()
        field = self.filter_input
        field.display = bool(field.value)
        self.table.focus()

    @on(DataTable.RowSelected)
    def _opened(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.Opened(self.KIND, event.row_key.value))

    def tick_column(self, column: int, text: Callable[[str], str], keys: Iterable[str]) -> None:
        """Give *column* of the rows *keys* its text as of now; only rows whose text changes are touched."""
        table = self.table
        changes = {}
        for key in keys:
            cells = table.cells(key)
            if cells is None:
                continue
            now = shown(text(key))
            if cells[column] != now:
                changes[key] = cells[:column] + (now,) + cells[column + 1:]
        if changes:
            self.update_rows(changes)

    def update_rows(self, changes: Mapping[str, tuple | None]) -> None:
        self.table.apply(changes)

    def replace_rows(self, rows: Mapping[str, tuple]) -> None:
        self.table.replace(rows)

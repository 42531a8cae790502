"""docs/configuration.rst's tables of keys hold to the keys the code declares, and to their defaults.

Each key is declared once, on its field (``llmgw.setting``); the reference
is written by hand, for people, so this reads its tables back: every key a
file accepts has a row under its section (or, for the few documented in a
sentence, is named in that paragraph), and a default the row gives is the
field's.  A failure names the file and the key path, and says what the
code has.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from llmgw.config.agent import SCHEMA as AGENT_SCHEMA
from llmgw.config.ctl import SCHEMA as CTL_SCHEMA
from llmgw.config.router import SCHEMA as ROUTER_SCHEMA
from llmgw.config.schema import ListOf, MapOf, Nullable, Section
from llmgw.config.server import SCHEMA as SERVER_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.rst"
SCHEMAS = {"server.yaml": SERVER_SCHEMA, "agent.yaml": AGENT_SCHEMA, "ctl.yaml": CTL_SCHEMA,
           "router.yaml": ROUTER_SCHEMA}

# Where the reference gives a default in words rather than the field's, and why.
DEFAULT_IN_WORDS = {
    # Each engine's keys are tabled per engine: llama.cpp's version is the
    # release llmgw ships, its base_url GitHub's; vLLM's are "any" and "pip's".
    ("server.yaml", "engines"): "per engine",
    # Required unless the profile's engine is sim: "required (but see right)".
    ("server.yaml", "models.source"): "required but for sim",
}
# router.yaml's router: is server.yaml's ("as in server.yaml").
SAME_AS = {("router.yaml", "router"): "server.yaml"}

_BORDER = re.compile(r"^(=+)( +=+)+ *$")


@attrs.frozen
class Table:
    file: str
    anchor: str  # the key path the table documents: "" is the file's top level
    header: tuple[str, ...]
    rows: dict[str, tuple[str, ...]]  # key (relative to anchor) -> its cells, each cell's lines joined
    line: int


def read_tables(text: str) -> list[Table]:
    """Every simple table of *text* that has a Key column, with the file and section it documents."""
    lines = text.split("\n")
    spans = []
    i = 0
    while i < len(lines):
        if _BORDER.match(lines[i]) and i + 2 < len(lines) and _BORDER.match(lines[i + 2]):
            end = i + 3
            while end < len(lines) and not _BORDER.match(lines[end]):
                end += 1
            spans.append((i, end))
            i = end + 1
        else:
            i += 1
    found = []
    for start, end in spans:
        columns = [m.start() for m in re.finditer(r"=+", lines[start])]

        def cells(line: str) -> list[str]:
            return [line[a:b].strip() for a, b in zip(columns, columns[1:] + [None])]

        header = tuple(cells(lines[start + 1]))
        if header[0] != "Key":
            continue
        rows: list[list[list[str]]] = []
        for line in lines[start + 3:end]:
            parts = cells(line)
            if parts[0]:
                rows.append([[p] if p else [] for p in parts])
            elif rows:
                for k, part in enumerate(parts):
                    if part:
                        rows[-1][k].append(part)
        file, anchor = where(lines, start, [s for s in spans if s[1] < start])
        found.append(Table(file, anchor, header,
                           {r[0][0].strip("`"): tuple(" ".join(c) for c in r) for r in rows}, start + 1))
    return found


def where(lines: list[str], start: int, earlier: list[tuple[int, int]]) -> tuple[str, str]:
    """The file (its ``----`` heading) and the key path (a ``~~~`` heading or a paragraph's first ``key``) above *start*."""
    anchor = None
    for k in range(start - 1, -1, -1):
        if any(a <= k <= b for a, b in earlier):
            continue
        line, below = lines[k], lines[k + 1]
        if line.strip() and re.fullmatch(r"-{4,}", below):
            return line.split()[0], anchor or ""
        if anchor is None and line.startswith("``") and (re.fullmatch(r"~{4,}", below) or not lines[k - 1].strip()):
            match = re.match(r"``([a-z_.]+)``", line)
            anchor = match.group(1) if match else None
    raise AssertionError(f"docs/configuration.rst:{start + 1}: a table of keys under no file's heading")


def paragraphs(text: str) -> dict[tuple[str, str], str]:
    """(file, key path) -> the paragraph that starts with that key, for keys documented in a sentence."""
    found = {}
    file = ""
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").split("\n")
        if len(lines) >= 2 and re.fullmatch(r"-{4,}", lines[1]):
            file = lines[0].split()[0]
        match = re.match(r"``([a-z_.]+)``", lines[0])
        if match and len(lines) > 0:
            found.setdefault((file, match.group(1)), " ".join(lines))
    return found


def keys_of(section: Section, prefix: str = ""):
    """(parent path, key, field, type) for every key of *section*, nested ones included."""
    fields = {f.name: f for f in attrs.fields(section.cls)}
    for key, kind in section.keys.items():
        yield prefix, key, fields[key], kind
        while isinstance(kind, (Nullable, ListOf, MapOf)):
            kind = kind.inner if isinstance(kind, Nullable) else kind.item if isinstance(kind, ListOf) else kind.value
        if isinstance(kind, Section):
            yield from keys_of(kind, f"{prefix}{key}.")


def written(value) -> str | None:
    """A default as the reference writes it, or None for a section's (its keys are tabled below it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"``{str(value).lower()}``"
    if isinstance(value, float):
        return f"``{int(value) if value.is_integer() else value}``"
    if isinstance(value, (int, str)):
        return f"``{value}``"
    if isinstance(value, (tuple, list)):
        return f"``[{', '.join(map(str, value))}]``"
    if isinstance(value, dict) and not value:
        return "``{}``"
    return None


def default_of(field: attrs.Attribute):
    if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
        return field.default.factory()
    return field.default


def documented_as(default_cell: str, value) -> bool:
    if value is attrs.NOTHING:
        return default_cell.startswith("required")
    if value is None and default_cell.startswith("absent"):
        return True  # hosts: absent is localhost and the host name, unlike []
    form = written(value)
    return form is None or default_cell.startswith(form)


def problems(text: str) -> list[str]:
    tables = read_tables(text)
    prose = paragraphs(text)
    headings = {(t.file, t.anchor) for t in tables}
    out = []
    for file, schema in SCHEMAS.items():
        for parent, key, field, _ in keys_of(schema):
            path = f"{parent}{key}"
            top = parent.split(".")[0].rstrip(".")
            if (file, top) in SAME_AS and parent:
                doc_file = SAME_AS[(file, top)]
            else:
                doc_file = file
            anchor = parent.rstrip(".")
            rows = [(t, t.rows[key]) for t in tables if (t.file, t.anchor) == (doc_file, anchor) and key in t.rows]
            rows += [(t, t.rows[path]) for t in tables if (t.file, t.anchor) == (doc_file, "") and path in t.rows]
            if not rows:
                paragraph = prose.get((doc_file, anchor), "")
                section_heading = (doc_file, path) in headings or (doc_file, path) in prose or any(
                    k.startswith(path + ".") for t in tables if t.file == doc_file for k in t.rows)
                parent_row = [cells for t in tables if t.file == doc_file for k, cells in t.rows.items()
                              if k == anchor or k == anchor.rsplit(".", 1)[-1] and t.anchor == anchor.rpartition(".")[0]]
                in_parent_row = any(f"``{key}``" in " ".join(c) or re.search(rf"\{{[^}}]*\b{key}\b", " ".join(c))
                                    for c in parent_row)
                if f"``{key}``" in paragraph:
                    value = default_of(field)
                    form = written(value) if value is not attrs.NOTHING else None
                    if form and form != "null" and f"``{key}`` {form}" not in paragraph:
                        out.append(f"{file}: {path}: the paragraph on {anchor} does not give its default {form}")
                elif not (section_heading or in_parent_row):
                    out.append(f"{file}: {path}: not in docs/configuration.rst; add a row for it under {anchor or file}")
                continue
            for table, cells in rows:
                if "Default" not in table.header:
                    continue
                if (file, path) in DEFAULT_IN_WORDS or (file, anchor) in DEFAULT_IN_WORDS:
                    continue
                cell = cells[table.header.index("Default")]
                value = default_of(field)
                if not documented_as(cell, value):
                    has = "required" if value is attrs.NOTHING else written(value)
                    out.append(f"{file}: {path}: docs/configuration.rst:{table.line} gives the default {cell!r}, "
                               f"the code has {has}")
    return out


def test_every_key_is_in_the_reference_with_the_default_it_has() -> None:
    assert problems(REFERENCE.read_text()) == []


def test_the_tables_are_read_under_the_sections_they_document() -> None:
    """Else the check above could pass by reading no table at all."""
    tables = {(t.file, t.anchor): t for t in read_tables(REFERENCE.read_text())}
    assert tables["server.yaml", "fleet"].rows["lost_after_s"][2] == "``120``"
    assert "max_inflight_per_endpoint" in tables["server.yaml", "router.admission"].rows
    assert "min_rate_bytes_per_s" in tables["agent.yaml", "installs"].rows
    assert "listen.api" in tables["router.yaml", ""].rows
    assert {file for file, _ in tables} == set(SCHEMAS)


@pytest.mark.parametrize(("old", "new", "named"), [
    # A default that differs, in a table and in a sentence.
    ("``lost_after_s``            number > 0   ``120``", "``lost_after_s``            number > 0   ``121``",
     "server.yaml: fleet.lost_after_s: docs/configuration.rst:"),
    ("``rate_window_s`` ``300``, ``download_deadline_s``", "``rate_window_s`` ``30``, ``download_deadline_s``",
     "agent.yaml: weights.rate_window_s: the paragraph on weights does not give its default ``300``"),
    # A key the code has and the reference does not.
    ("``max_message_depth``", "``max_nesting``", "server.yaml: link.max_message_depth: not in docs/configuration.rst"),
    ("``queue_timeout_s``             number > 0", "``queue_wait_s``                number > 0",
     "server.yaml: router.admission.queue_timeout_s: not in"),
])
def test_a_key_missing_or_a_default_that_differs_is_named(old: str, new: str, named: str) -> None:
    text = REFERENCE.read_text()
    assert old in text, "the reference changed; pick another line for this test"
    found = problems(text.replace(old, new, 1))
    assert any(p.startswith(named) for p in found), found

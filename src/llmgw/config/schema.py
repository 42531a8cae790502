"""A small declarative schema: YAML nodes in, frozen attrs values out.

A ``Section`` names an attrs class and the type of each key; which keys are
required and what the defaults are is read from the class itself, so a
default is written once.  ``section(cls)`` reads the types too, from the
fields ``llmgw.setting.setting()`` made: a key is declared once, its type,
bounds and default on the one field.  Every type raises ``ConfigError`` through the
document's ``Source``, which puts ``FILE:LINE: key.path:`` in front.  The line
of every value converted is kept in ``Loader.lines`` so checks that span
sections (a model naming a profile) can point at the right line afterwards.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import types
import typing
from typing import Any, Callable, Mapping

import attrs
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmgw.config.yamlpos import Document, KeyPath, describe, is_null, line_of
from llmgw.errors import ConfigError
from llmgw.setting import bounds_of_setting
from llmgw.wiretext import Text, refusal


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """``"did you mean 'scoring'? "`` when *word* looks like a typo of a choice, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


class Loader:
    """Walks one document against a schema; keeps each value's line."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.origin = document.origin
        self.lines: dict[KeyPath, int] = {}

    def fail(self, node: Node | int, path: KeyPath, message: str) -> ConfigError:
        line = node if isinstance(node, int) else line_of(node)
        return self.origin.error(line, path, message)

    def line(self, path: KeyPath) -> int:
        """The line of the value at *path*, or of its nearest parent that was written."""
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)

    def convert(self, kind: Type, node: Node, path: KeyPath) -> Any:
        self.lines[path] = line_of(node)
        return kind.convert(self, node, path)


class Type:
    """One kind of value.  ``what`` completes "expected ..." and "add it with ..."."""

    what = "a value"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        raise NotImplementedError

    def expected(self, loader: Loader, node: Node, path: KeyPath) -> ConfigError:
        hint = ""
        if isinstance(node, ScalarNode) and not is_null(node) and self.what.startswith("a string"):
            # ``version: 6000`` reads as an integer; the fix is quotes.
            hint = f'; quote it: "{node.value}"'
        elif isinstance(self, (Int, Number)) and isinstance(node, ScalarNode):
            # YAML 1.1 reads ``1e6`` as a string: its floats need a point.
            try:
                float(node.value)
                hint = "; YAML reads this as text: write the number in full, or as 1.0e+6"
            except ValueError:
                pass
        return loader.fail(node, path, f"expected {self.what}, got {describe(node)}{hint}")

    def scalar(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        if not isinstance(node, ScalarNode):
            raise self.expected(loader, node, path)
        return loader.document.scalar(node, path)


@attrs.frozen
class Str(Type):
    """A string; *check* raises ``ValueError(why)``, or returns a normalised string."""

    what: str = "a string"
    check: Callable[[str], Any] | None = None

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = self.scalar(loader, node, path)
        if not isinstance(value, str):
            raise self.expected(loader, node, path)
        if self.check is not None:
            try:
                result = self.check(value)
            except ValueError as e:
                raise loader.fail(node, path, f"{value!r}: {e}") from None
            if isinstance(result, str):
                return result
        return value


@attrs.frozen
class Int(Type):
    """An integer (``true`` is not one) no smaller than *min*."""

    min: int | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        return "an integer" if self.min is None else f"an integer >= {self.min}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = self.scalar(loader, node, path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.expected(loader, node, path)
        if self.min is not None and value < self.min:
            raise loader.fail(node, path, f"must be {self.what}, got {value}")
        return value


@attrs.frozen
class Number(Type):
    """A finite number, integer or not, returned as ``float``; above (or at least) *min*."""

    min: float | None = None
    exclusive: bool = False

    @property
    def what(self) -> str:  # type: ignore[override]
        if self.min is None:
            return "a number"
        return f"a number {'>' if self.exclusive else '>='} {self.min:g}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = self.scalar(loader, node, path)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.expected(loader, node, path)
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise loader.fail(node, path, f"must be a finite number, got {node.value}")
        too_small = self.min is not None and (
            value <= self.min if self.exclusive else value < self.min
        )
        if too_small:
            raise loader.fail(node, path, f"must be {self.what}, got {value:g}")
        return value


@attrs.frozen
class Bool(Type):
    what = "true or false"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = self.scalar(loader, node, path)
        if not isinstance(value, bool):
            raise self.expected(loader, node, path)
        return value


@attrs.frozen
class Enum(Type):
    """One of a fixed set of strings; a near miss gets a suggestion."""

    choices: tuple[str, ...]
    noun: str = "value"

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"one of {', '.join(self.choices)}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = self.scalar(loader, node, path)
        if not isinstance(value, str):
            raise self.expected(loader, node, path)
        if value not in self.choices:
            raise loader.fail(
                node,
                path,
                f"unknown {self.noun} {value!r}; {suggest(value, self.choices)}"
                f"use {self.what}",
            )
        return value


@attrs.frozen
class Nullable(Type):
    """*inner*, or ``None`` when the value is written as ``null`` / ``~``."""

    inner: Type

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"{self.inner.what} or null"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        if is_null(node):
            return None
        return self.inner.convert(loader, node, path)


def from_config_directory(loader: Loader, value: str) -> tuple[str, str]:
    """*value* (``~`` expanded) as an absolute path, a relative one read from the config file's directory.

    Returns the path and, for a relative one, the words an error adds to say where it was looked for.
    """
    expanded = os.path.expanduser(value)
    full = os.path.abspath(os.path.join(loader.origin.directory, expanded))
    where = "" if os.path.isabs(expanded) else (
        f" (relative paths are read from the config file's directory, {loader.origin.directory})"
    )
    return full, where


@attrs.frozen
class File(Type):
    """A file that must exist now; relative names are read from the config file's directory.

    The value is the absolute path, so a later chdir (twistd does one) cannot
    change which file is meant.
    """

    what = "the path of an existing file"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = Str(what="a string (a file path)").convert(loader, node, path)
        if not value:
            raise loader.fail(node, path, "empty file path; give the path of the file")
        full, where = from_config_directory(loader, value)
        if not os.path.exists(full):
            raise loader.fail(node, path, f"file does not exist: {full}{where}; fix the path")
        if not os.path.isfile(full):
            raise loader.fail(node, path, f"not a regular file: {full}; name the file itself")
        if not os.access(full, os.R_OK):
            raise loader.fail(
                node, path, f"cannot read {full} as this user; fix its owner or permissions"
            )
        return full


@attrs.frozen
class AbsPath(Type):
    """An absolute path that need not exist yet (a directory made or mounted later)."""

    what = "an absolute path"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = Str(what="a string (an absolute path)").convert(loader, node, path)
        if not os.path.isabs(value):
            raise loader.fail(node, path, f"{value!r} is not an absolute path; start it with /")
        # The link's rule for a path (llmgw.wiretext): an agent whose weights
        # directory has a space at its end would have its every heartbeat refused.
        if (why := refusal(value, Text.PATH, None)) is not None:
            raise loader.fail(node, path, why)
        return os.path.normpath(value)


@attrs.frozen
class LocalPath(Type):
    """A path on this machine that need not exist yet, read as ``File`` reads one (``tls.*``'s rule).

    Relative names are read from the config file's directory; the value is
    the absolute path, so twistd's chdir cannot change which one is meant.
    """

    what = "a path (absolute, or relative to the config file's directory)"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        value = Str(what="a string (a path)").convert(loader, node, path)
        if not value:
            raise loader.fail(node, path, "empty path; give the directory's path, or remove the key")
        return os.path.normpath(from_config_directory(loader, value)[0])


@attrs.frozen
class ListOf(Type):
    """A YAML list, returned as a tuple; ``null`` reads as an empty list."""

    item: Type

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a list, each {self.item.what}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        if is_null(node):
            return ()
        if not isinstance(node, SequenceNode):
            raise self.expected(loader, node, path)
        loader.document.check_untagged(node, path)
        return tuple(
            loader.convert(self.item, item, path + (i,)) for i, item in enumerate(node.value)
        )


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(text: str) -> None:
    """Names end up in URLs, WAMP URIs and metric labels, so they keep to a safe alphabet."""
    if not NAME.fullmatch(text):
        raise ValueError(
            "not a valid name; use letters, digits, '.', '_' and '-', starting with a "
            "letter or digit (names appear in URLs and metric labels)"
        )


NAME_STR = Str(what="a name", check=check_name)


@attrs.frozen
class MapOf(Type):
    """A mapping from names to *value*; a ``Section`` value gets its name as ``name=``."""

    value: Type
    key: Type = NAME_STR

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a mapping of names to {self.value.what}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        if is_null(node):
            return {}
        if not isinstance(node, MappingNode):
            raise self.expected(loader, node, path)
        result = {}
        for key, key_node, value_node in loader.document.items(node, path):
            self.key.convert(loader, key_node, path + (key,))
            if isinstance(self.value, Section):
                value = self.value.build(loader, value_node, path + (key,), name=key)
            else:
                value = loader.convert(self.value, value_node, path + (key,))
            result[key] = value
        return result


@attrs.frozen
class Section(Type):
    """A mapping with fixed keys, built into the attrs class *cls*.

    *keys* maps each YAML key to its type, in the order documentation lists
    them.  Fields of *cls* that are not keys (a map entry's ``name``, the
    file's ``path``) are passed to ``build`` by whoever knows them.
    """

    cls: type
    keys: Mapping[str, Type]

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a mapping with keys {', '.join(self.keys)}"

    def convert(self, loader: Loader, node: Node, path: KeyPath) -> Any:
        return self.build(loader, node, path)

    def build(self, loader: Loader, node: Node, path: KeyPath, /, **extra: Any) -> Any:
        loader.lines[path] = line_of(node)
        if is_null(node):
            # ``router:`` with everything below commented out: take the defaults.
            pairs = []
        elif isinstance(node, MappingNode):
            pairs = loader.document.items(node, path)
        else:
            raise self.expected(loader, node, path)
        allowed = list(self.keys)
        values: dict[str, Any] = {}
        for key, key_node, value_node in pairs:
            if key not in self.keys:
                raise loader.fail(
                    key_node,
                    path + (key,),
                    f"unknown key; {suggest(key, allowed)}allowed here: {', '.join(allowed)}",
                )
            values[key] = loader.convert(self.keys[key], value_node, path + (key,))
        for field in attrs.fields(self.cls):
            if field.name in self.keys and field.name not in values:
                if field.default is attrs.NOTHING:
                    raise loader.fail(
                        node,
                        path + (field.name,),
                        f"required key is missing; add '{field.name}:' with "
                        f"{self.keys[field.name].what}",
                    )
        return self.cls(**values, **extra)


def all_keys(section: Section) -> list[str]:
    """Every key *section* and the sections inside it accept (for documentation checks)."""
    found = []
    for key, kind in section.keys.items():
        found.append(key)
        while isinstance(kind, (Nullable, ListOf, MapOf)):
            kind = kind.inner if isinstance(kind, Nullable) else (
                kind.item if isinstance(kind, ListOf) else kind.value
            )
        if isinstance(kind, Section):
            found += all_keys(kind)
    return found


def section(cls: type) -> Section:
    """The ``Section`` of *cls*: each field made with ``setting()`` is a key, in the order it is declared."""
    attrs.resolve_types(cls)
    return Section(cls, {f.name: kind_of(cls, f) for f in attrs.fields(cls) if bounds_of_setting(f) is not None})


def kind_of(cls: type, field: attrs.Attribute) -> Type:
    """A key's type: the one ``setting(kind=)`` gives, else read from the annotation and the bounds."""
    bounds = bounds_of_setting(field)
    assert bounds is not None
    if bounds.kind is not None:
        return bounds.kind
    annotation, nullable = field.type, False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(others) < len(typing.get_args(annotation))
        annotation = others[0] if len(others) == 1 else annotation
    kind: Type
    if annotation is bool:
        kind = Bool()
    elif annotation is int and bounds.above is None:
        kind = Int(min=bounds.least)  # type: ignore[arg-type]
    elif annotation is float:
        exclusive = bounds.above is not None
        kind = Number(min=bounds.above if exclusive else bounds.least, exclusive=exclusive)
    elif isinstance(annotation, type) and attrs.has(annotation):
        kind = section(annotation)
    else:
        raise TypeError(f"{cls.__name__}.{field.name}: say how to read it with setting(kind=...)")
    return Nullable(kind) if nullable else kind

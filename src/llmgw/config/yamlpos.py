"""YAML that remembers where every value came from.

``yaml.safe_load`` hands back plain dicts: it forgets lines, keeps the last of
two equal keys without a word, and accepts ``1:`` or ``on:`` as keys (an
integer and ``True``).  Composing instead keeps each node with its position, so
every error further on can say ``FILE:LINE: key.path: ...``.  Only scalars are
ever turned into Python values here; the schema walks the mappings and
sequences itself, which is also why a recursive anchor cannot loop forever:
the walk is only as deep as the schema.

Reading is bounded before parsing starts: the path must be a regular file
(a FIFO would block the reader, and a reload the reactor, for ever) no
larger than :data:`MAX_CONFIG_BYTES`, because parsing runs on the reactor
when the server reloads.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Iterator, Sequence, Union

import attrs
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from llmgw.errors import ConfigError

# A key path: mapping keys and list indices, outermost first.
KeyPath = tuple[Union[str, int], ...]

MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"
MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"
_YAML_TAG_PREFIX = "tag:yaml.org,2002:"

KiB = 1024
# The largest configuration file llmgw reads.  A reload parses server.yaml on
# the reactor, at some 3 s per MiB of the worst YAML (one-character list
# items), so the limit is what keeps that stall under a second; it is three
# times the file of a fleet of 500 models and 500 API keys (85 KiB).
MAX_CONFIG_BYTES = 256 * KiB
#: The limit's override, in the environment of the process that reads the
#: file: it cannot be a key of the file it limits.
MAX_CONFIG_ENV = "LLMGW_MAX_CONFIG_BYTES"

_KIND_BY_TAG = {
    "tag:yaml.org,2002:null": "null",
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number",
    STR_TAG: "a string",
    "tag:yaml.org,2002:timestamp": "a date",
    "tag:yaml.org,2002:binary": "binary data",
}


_PLAIN_KEY = re.compile(r"[^\s'\"\[\]]+")


def format_path(path: KeyPath) -> str:
    """``("router", "keys", 0, "sha256")`` as ``router.keys[0].sha256``.

    A key with spaces, quotes or nothing in it is quoted, so that the path
    stays one readable line: ``models.'gemma 3'``.
    """
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            shown = part if _PLAIN_KEY.fullmatch(part) else repr(part)
            text += f".{shown}" if text else shown
    # The document itself has no key; say so rather than print nothing.
    return text or "(document)"


def line_of(node: Node) -> int:
    """The 1-based line *node* starts on."""
    return node.start_mark.line + 1


@attrs.frozen
class Origin:
    """A document's origin: the name errors print and the directory paths are relative to."""

    name: str
    directory: str

    def error(self, line: int, path: KeyPath, message: str) -> ConfigError:
        return ConfigError(f"{self.name}:{line}: {format_path(path)}: {message}")


def describe(node: Node) -> str:
    """What *node* is, in words, for "expected X, got Y" messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    kind = _KIND_BY_TAG.get(node.tag, f"a value tagged {node.tag}")
    if kind == "null":
        return kind
    shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
    # Quotes only around text: "got an integer (6000)", "got a string ('two')".
    if node.tag != STR_TAG and _PLAIN_KEY.fullmatch(shown):
        return f"{kind} ({shown})"
    return f"{kind} ({shown!r})"


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"


class Document:
    """One parsed file: its root node, and the means to read its scalars."""

    def __init__(self, origin: Origin, root: Node | None) -> None:
        self.origin = origin
        self.root = root
        self._constructor = yaml.constructor.SafeConstructor()
        # A mapping merged in many places is read once: nested ``<<: [*a, *a]``
        # would otherwise cost twice as much at every level.
        self._merged: dict[int, dict[str, tuple[str, Node, Node]]] = {}

    def scalar(self, node: ScalarNode, path: KeyPath) -> Any:
        """The Python value of a scalar (``"1"`` -> 1, ``yes`` -> True, ``~`` -> None)."""
        try:
            return self._constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as e:
            # An unknown tag (``!foo x``), a malformed ``!!binary``, or a date
            # that only looks like one (``2024-13-45``).
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise self.origin.error(
                line_of(node),
                path,
                f"cannot read this value: {problem}; quote it, or fix or remove its tag",
            ) from None

    def items(self, node: MappingNode, path: KeyPath) -> list[tuple[str, Node, Node]]:
        """The ``(key, key node, value node)`` of a mapping, merge keys applied.

        Refuses keys that are not strings and keys given twice.  A ``<<: *x``
        merge supplies only keys the mapping does not set itself, as YAML says.
        """
        return list(self._items(node, path, frozenset()).values())

    def _items(
        self, node: MappingNode, path: KeyPath, merging: frozenset[int]
    ) -> dict[str, tuple[str, Node, Node]]:
        self.check_untagged(node, path)
        explicit: dict[str, tuple[str, Node, Node]] = {}
        merged: dict[str, tuple[str, Node, Node]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                for source_node in self._merge_sources(value_node, path, merging | {id(node)}):
                    inner = self._merged.get(id(source_node))
                    if inner is None:
                        inner = self._items(source_node, path, merging | {id(node)})
                        self._merged[id(source_node)] = inner
                    for key, item in inner.items():
                        merged.setdefault(key, item)
                continue
            key = self._key(key_node, path)
            if key in explicit:
                first = line_of(explicit[key][1])
                raise self.origin.error(
                    line_of(key_node),
                    path + (key,),
                    f"key given twice (first on line {first}); keep one",
                )
            explicit[key] = (key, key_node, value_node)
        return {**merged, **explicit}

    def check_untagged(self, node: Node, path: KeyPath) -> None:
        """Refuse a mapping or list with a tag: llmgw gives none a meaning, so one would be ignored."""
        default = MAP_TAG if isinstance(node, MappingNode) else SEQ_TAG
        if isinstance(node, ScalarNode) or node.tag == default:
            return
        tag = "!!" + node.tag[len(_YAML_TAG_PREFIX):] if node.tag.startswith(_YAML_TAG_PREFIX) else node.tag
        raise self.origin.error(
            line_of(node), path, f"{describe(node)} tagged {tag}; llmgw reads no tags: remove it"
        )

    def _merge_sources(
        self, node: Node, path: KeyPath, merging: frozenset[int]
    ) -> Iterator[MappingNode]:
        self.check_untagged(node, path)
        sources: Sequence[Node] = node.value if isinstance(node, SequenceNode) else [node]
        for source in sources:
            if not isinstance(source, MappingNode):
                raise self.origin.error(
                    line_of(source),
                    path,
                    f"a '<<' merge needs a mapping or a list of mappings, got {describe(source)}",
                )
            if id(source) in merging:
                raise self.origin.error(
                    line_of(source), path, "a '<<' merge includes itself; remove the loop"
                )
            yield source

    def _key(self, node: Node, path: KeyPath) -> str:
        if isinstance(node, ScalarNode) and node.tag == STR_TAG:
            return str(node.value)
        if isinstance(node, ScalarNode):
            # ``on:`` is True and ``8080:`` an integer in YAML 1.1; quoting fixes both.
            hint = f'; quote it: "{node.value}"'
        else:
            hint = "; use a plain name"
        raise self.origin.error(
            line_of(node), path, f"keys must be strings, got {describe(node)}{hint}"
        )


def read_document(path: str | os.PathLike[str]) -> Document:
    """Read and compose the YAML file at *path*, or raise ``ConfigError``.

    Errors name *path* as the caller gave it; relative paths inside the file
    are later resolved against the file's own directory.
    """
    name = os.fspath(path)
    data = read_config_bytes(name, max_config_bytes())
    origin = Origin(name=name, directory=os.path.dirname(os.path.abspath(name)))
    return parse_document(data, origin)


def max_config_bytes(environ: os._Environ[str] | dict[str, str] = os.environ) -> int:
    """The size limit of a configuration file: ``LLMGW_MAX_CONFIG_BYTES``, or :data:`MAX_CONFIG_BYTES`."""
    text = environ.get(MAX_CONFIG_ENV)
    if text is None:
        return MAX_CONFIG_BYTES
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(
            f"{MAX_CONFIG_ENV}={text!r} is not a whole number of bytes above 0; "
            f"unset it for the default of {MAX_CONFIG_BYTES} ({MAX_CONFIG_BYTES // KiB} KiB)"
        )
    return limit


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(name: str, mode: int) -> ConfigError | None:
    if stat.S_ISREG(mode):
        return None
    kind = next((kind for test, kind in _KINDS if test(mode)), "not a file")
    return ConfigError(f"{name}: is {kind}, not a regular file; name the configuration file itself")


def _too_big(name: str, size: int, limit: int) -> ConfigError:
    shown = f" ({limit // KiB} KiB)" if limit % KiB == 0 else ""
    return ConfigError(
        f"{name}: the file is {size} bytes, more than the {limit} bytes{shown} a configuration file may be: "
        f"check that it is the right file, or raise {MAX_CONFIG_ENV} in the environment of the process "
        "that reads it"
    )


def read_config_bytes(name: str, limit: int) -> bytes:
    """The bytes of the regular file *name*, at most *limit* of them, or ``ConfigError`` saying why not.

    The path is looked at before it is opened, so a FIFO or a device is never
    opened at all; it is opened without blocking and looked at again, so a
    path swapped in between cannot block either.
    """
    try:
        if (refused := _not_regular(name, os.stat(name).st_mode)) is not None:
            raise refused
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        opened = os.fstat(fd)
        if (refused := _not_regular(name, opened.st_mode)) is not None:
            raise refused
        if opened.st_size > limit:
            raise _too_big(name, opened.st_size, limit)
        with os.fdopen(fd, "rb", closefd=False) as f:
            # One byte more than allowed tells a file that grew since the stat.
            data = f.read(limit + 1)
        if len(data) > limit:
            raise _too_big(name, max(len(data), os.fstat(fd).st_size), limit)
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return data


# libyaml composes four times faster than PyYAML, which matters because a
# reload parses on the reactor.  Its error messages differ, so a file it
# refuses is read again by PyYAML for the messages the docs show, unless the
# file is so big that reading it twice would stall the reactor (PyYAML takes
# some 0.5 s for 64 KiB of the worst YAML): that one keeps libyaml's message.
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)
_REREAD_LIMIT = 64 * KiB


def _compose(text: str) -> Node | None:
    if _FAST_LOADER is not None:
        try:
            return yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            if len(text) > _REREAD_LIMIT:
                raise
    return yaml.compose(text, Loader=yaml.SafeLoader)


def parse_document(data: bytes, origin: Origin) -> Document:
    """Compose *data* (UTF-8, optionally with a byte order mark) into a ``Document``."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{origin.name}:{line}: (document): not UTF-8 text (byte {e.start}); "
            "save the file as UTF-8"
        ) from None
    try:
        root = _compose(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(p for p in (e.context, e.problem) if p) or "invalid YAML"
        # PyYAML shows the end of the text as the character it pads it with.
        what = what.replace("found '\\x00'", "found the end of the file")
        if "'\\t'" in what:
            what += "; indent with spaces, not tabs"
        raise ConfigError(f"{origin.name}:{line}: (document): YAML syntax: {what}") from None
    except yaml.reader.ReaderError as e:
        line = text[: e.position].count("\n") + 1
        raise ConfigError(
            f"{origin.name}:{line}: (document): character U+{e.character:04X} is not allowed "
            "in YAML; remove it"
        ) from None
    except yaml.YAMLError as e:  # pragma: no cover - PyYAML raises only the above
        raise ConfigError(f"{origin.name}:1: (document): YAML syntax: {e}") from None
    except RecursionError:
        raise ConfigError(
            f"{origin.name}:1: (document): nested too deeply to read; flatten it"
        ) from None
    return Document(origin, root)

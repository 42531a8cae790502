"""Turning attrs records into link payloads and back, refusing what does not fit.

What arrives over the link comes from another process that may be older,
newer or simply wrong.  ``from_wire`` checks every field against the record's
annotations and raises ``WireError`` naming the path of the first field that
does not fit ("gpus[2].memory_total_mb: expected int, got str").  A state
travels as its enum's value, a plain string, and comes back as the member;
one this side does not know is refused with the ones it does.  Keys the
record does not know are ignored, so a newer peer can add fields; keys it does
not send keep their default, which for reported figures is ``None`` —
absent is not zero.

A field made with ``field()`` carries its ``Bounds`` beside it, and
``from_wire`` holds the value to them ("Heartbeat.memory_total_bytes: about
10**400 is above 2**60, the most it may be").  Whatever the field, no number
is NaN or infinite, no integer is beyond what a signed 64-bit integer holds
(Prometheus, JSON readers and SQLite all stop there), and no string holds a
lone surrogate, which UTF-8 cannot carry onwards.  What a string may hold
besides is its kind's (``llmgw.wiretext``: a name, a path, an argument).
Words for a person (``Text.PROSE``: reasons, warnings, an engine's last
lines) are cut to their bound, never refused, so a long error still lands;
everything else that does not fit refuses the whole payload, and the sender
is told which field.
"""

from __future__ import annotations

import enum
import json
import math
import types
import typing
from typing import Any, Callable, TypeVar

import attrs

from llmgw import wiretext
from llmgw.wiretext import TRIMMED, Text

T = TypeVar("T")

#: The most any integer may be, whatever its field: a signed 64-bit integer's.
INT64 = 2**63 - 1
BOUNDS = "llmgw.wire.bounds"


class WireError(ValueError):
    """A link payload does not have the shape its record requires."""


@attrs.frozen
class Bounds:
    """What a field may hold beyond its type, read by ``from_wire``.

    ``least``/``most`` bound a number (or each number of a list); ``chars`` a
    string (or each string of a list, each key and value of a mapping);
    ``items`` a list or mapping.
    """

    least: int | float | None = None
    most: int | float | None = None
    chars: int | None = None
    items: int | None = None
    text: Text = Text.NAME


def field(
    default: Any = attrs.NOTHING, *, factory: Any = None, converter: Any = None,
    least: int | float | None = None, most: int | float | None = None,
    chars: int | None = None, items: int | None = None, text: Text = Text.NAME,
) -> Any:
    """An attrs field whose wire form ``from_wire`` holds to these bounds."""
    metadata = {BOUNDS: Bounds(least=least, most=most, chars=chars, items=items, text=text)}
    if factory is not None:
        return attrs.field(factory=factory, converter=converter, metadata=metadata)
    return attrs.field(default=default, converter=converter, metadata=metadata)


def bounds_of(f: attrs.Attribute) -> Bounds | None:
    return f.metadata.get(BOUNDS)


class JsonText:
    """A wire form already written as the link writes JSON (compact, UTF-8): sent as it is.

    For an answer made of parts that seldom change, kept as text: a listing
    of 10,000 nodes joins each node's text instead of writing 15 MB of JSON
    again (``Fleet.json_listing``).  The link's serializer puts the text in
    its message unchanged (``llmgw.link.session``); in this process
    ``value()`` (and ``to_wire``) reads it back.
    """

    __slots__ = ("text",)

    def __init__(self, text: bytes):
        self.text = text

    def value(self) -> Any:
        return json.loads(self.text)

    def __repr__(self) -> str:
        return f"<JsonText of {len(self.text)} bytes>"


#: JSON as the link writes it (autobahn's ``wamp.2.json``): no spaces, not ASCII-escaped.
encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_text(record: Any) -> str:
    """``to_wire(record)`` as the link's JSON text (a str: encode once, when the whole is joined)."""
    return encode_json(to_wire(record))


# What to_wire passes through as it is, by exact type (a str enum is not a str here).
_SCALARS = frozenset({str, int, float, bool, type(None)})
# Per type met: its attrs field names, or False for a type that is not an attrs class.
_FIELD_NAMES: dict[type, tuple[str, ...] | bool] = {}


def to_wire(record: Any) -> Any:
    """A JSON-ready copy of *record* (attrs instances become dicts, enum members their values)."""
    kind = type(record)
    if kind in _SCALARS:
        return record
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in attrs.fields(kind)) if attrs.has(kind) else False
    if names is not False:
        out = {}
        for name in names:
            value = getattr(record, name)
            out[name] = value if type(value) in _SCALARS else to_wire(value)
        return out
    if isinstance(record, enum.Enum):
        return record.value
    if kind is JsonText:
        return record.value()
    if isinstance(record, (list, tuple)):
        return [item if type(item) in _SCALARS else to_wire(item) for item in record]
    if isinstance(record, dict):
        return {key: value if type(value) in _SCALARS else to_wire(value) for key, value in record.items()}
    return record


# Per attrs class met by to_sparse_wire: each field's name and default (a
# factory's value made once), or _REQUIRED for a field without one.
_REQUIRED = object()
_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def field_defaults(kind: type) -> tuple[tuple[str, Any], ...]:
    """Each field of the attrs class *kind* with its default: a factory's value, ``_REQUIRED`` for none."""
    found = _DEFAULTS.get(kind)
    if found is None:
        out = []
        for f in attrs.fields(kind):
            default = f.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory() if not default.takes_self else _REQUIRED
            elif default is attrs.NOTHING:
                default = _REQUIRED
            out.append((f.name, default))
        found = _DEFAULTS[kind] = tuple(out)
    return found


def at_default(value: Any, default: Any) -> bool:
    """Whether a field holding *value* may be left out: ``from_wire`` would give *default* back, equal and of its type."""
    return value is default or (type(value) is type(default) and value == default)


def to_sparse_wire(record: Any) -> Any:
    """``to_wire``, leaving out every field at its default, at every depth.

    ``from_wire`` gives a left-out field its default again, so the reader
    gets the same record: None stays None (absent is not zero), an empty
    list its empty list.  For answers whose size is their cost (a listing
    of 10,000 nodes), not for what an older reader may read.
    """
    kind = type(record)
    if kind in _SCALARS:
        return record
    if attrs.has(kind):
        out = {}
        for name, default in field_defaults(kind):
            value = getattr(record, name)
            if not at_default(value, default):
                out[name] = to_sparse_wire(value)
        return out
    if isinstance(record, enum.Enum):
        return record.value
    if isinstance(record, (list, tuple)):
        return [to_sparse_wire(item) for item in record]
    if isinstance(record, dict):
        return {key: to_sparse_wire(value) for key, value in record.items()}
    return to_wire(record)


def sparse_json_text(record: Any) -> str:
    """``to_sparse_wire(record)`` as the link's JSON text."""
    return encode_json(to_sparse_wire(record))


def from_wire(cls: type[T], payload: Any, path: str = "") -> T:
    """Build a *cls* from a link payload, or raise ``WireError`` naming the field."""
    return _converter(cls, None)(payload, path or cls.__name__)


# A heartbeat is decoded every few seconds from every node: what a type
# hint asks for is worked out once per (hint, bounds), not on every value.
_CONVERTERS: dict[tuple[Any, Bounds | None], Callable[[Any, str], Any]] = {}


def _where(path: Any) -> str:
    """A field's path as the error names it.

    Converters hand their children ``(parent, ".name")`` or ``(parent, index)``
    rather than a string, which only an error needs: made here, not per value.
    """
    parts = []
    while isinstance(path, tuple):
        path, part = path
        parts.append(f"[{part}]" if isinstance(part, int) else part)
    parts.append(path)
    return "".join(reversed(parts))


def _converter(hint: Any, bounds: Bounds | None) -> Callable[[Any, str], Any]:
    """The function that checks and converts a value for *hint* under *bounds*: ``f(value, path)``."""
    key = (hint, bounds)
    try:
        found = _CONVERTERS.get(key)
    except TypeError:  # a hint that cannot be a key: made each time
        return _compile(hint, bounds)
    if found is None:
        found = _CONVERTERS[key] = _compile(hint, bounds)
    return found


def _compile(hint: Any, bounds: Bounds | None, nullable: bool = False) -> Callable[[Any, str], Any]:
    """*hint*'s converter; *nullable*: a plain type that may also be None (``str | None``), in one call, not two."""
    if hint is Any:
        return lambda value, path: value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(hint, args, bounds)
    if origin in (list, tuple):
        return _sequence(args, bounds, origin is tuple)
    if origin is dict:
        return _mapping(args, bounds)
    if attrs.has(hint):
        return _record(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    # Each plain type first takes what fits at once (nearly everything a
    # heartbeat or a listing holds); the rest goes the long way, whose
    # checks say what does not fit.
    if hint is float:
        f_least = -INT64 if bounds is None or bounds.least is None else bounds.least
        f_most = INT64 if bounds is None or bounds.most is None else bounds.most

        def to_float(value, path):
            if value.__class__ is float and f_least <= value <= f_most:  # NaN and infinities fail this
                return value
            if value is None and nullable:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise WireError(f"{_where(path)}: expected a number, got {_kind(value)}")
            if isinstance(value, int):
                _limit(value, path, -INT64, INT64)  # before float(), which overflows past 1e308
            if not math.isfinite(value):
                raise WireError(f"{_where(path)}: {value} is not a finite number")
            return _within(float(value), path, bounds)
        return to_float
    if hint is int:
        least = -INT64 if bounds is None or bounds.least is None else bounds.least
        most = INT64 if bounds is None or bounds.most is None else bounds.most

        def to_int(value, path):
            if value.__class__ is int and least <= value <= most:
                return value
            if value is None and nullable:
                return None
            if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
                raise WireError(f"{_where(path)}: expected an integer, got {_kind(value)}")
            if not least <= value <= most:
                _limit(value, path, least, most)
            return value
        return to_int
    if hint is str:
        # A name or a path within its bound, printable ASCII, no space around it: nothing _text would refuse.
        quick = bounds is None or bounds.text is not Text.PROSE
        trim = bounds is not None and bounds.text in TRIMMED
        chars = INT64 if bounds is None or bounds.chars is None else bounds.chars

        def to_str(value, path):
            if (quick and value.__class__ is str and len(value) <= chars and value.isascii() and value.isprintable()
                    and not (trim and (value[:1] == " " or value[-1:] == " "))):
                return value
            if value is None and nullable:
                return None
            if not isinstance(value, str):
                raise WireError(f"{_where(path)}: expected str, got {_kind(value)}")
            return _text(value, path, bounds)
        return to_str
    if hint is bool:
        def to_bool(value, path):
            if value is None and nullable:
                return None
            if not isinstance(value, bool):
                raise WireError(f"{_where(path)}: expected bool, got {_kind(value)}")
            return value
        return to_bool

    def unknown(value, path):
        raise TypeError(f"{_where(path)}: no wire conversion for {hint!r}")
    return unknown


def _union(hint: Any, args: tuple, bounds: Bounds | None) -> Callable[[Any, str], Any]:
    optional = type(None) in args
    rest = [arg for arg in args if arg is not type(None)]
    if optional and len(rest) == 1 and rest[0] in (str, int, float, bool):
        return _compile(rest[0], bounds, nullable=True)
    choices = [_converter(arg, bounds) for arg in rest]
    if optional and len(choices) == 1:
        (only,) = choices

        def to_optional(value, path):  # X | None, the most common hint: its one error is the error
            return None if value is None else only(value, path)
        return to_optional

    def to_union(value, path):
        if value is None and optional:
            return None
        errors = []
        for choice in choices:
            try:
                return choice(value, path)
            except WireError as e:
                errors.append(str(e))
        raise WireError(errors[0] if len(errors) == 1 else f"{_where(path)}: {value!r} fits none of {hint}")
    return to_union


def _sequence(args: tuple, bounds: Bounds | None, as_tuple: bool) -> Callable[[Any, str], Any]:
    (item,) = args[:1] or (Any,)
    each = _converter(item, bounds)

    most = None if bounds is None else bounds.items

    def to_sequence(value, path):
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{_where(path)}: expected a list, got {_kind(value)}")
        if most is not None and len(value) > most:
            value = _count(value, path, bounds)
        items = [each(v, (path, i)) for i, v in enumerate(value)]
        return tuple(items) if as_tuple else items
    return to_sequence


def _mapping(args: tuple, bounds: Bounds | None) -> Callable[[Any, str], Any]:
    key_hint, value_hint = args or (Any, Any)
    to_key, to_value = _converter(key_hint, bounds), _converter(value_hint, bounds)

    def to_mapping(value, path):
        if not isinstance(value, dict):
            raise WireError(f"{_where(path)}: expected a mapping, got {_kind(value)}")
        if bounds is not None and bounds.items is not None and len(value) > bounds.items:
            raise WireError(f"{_where(path)}: {len(value)} entries, more than the {bounds.items} it may have")
        return {to_key(k, (path, " key")): to_value(v, (path, f".{k!s:.40}")) for k, v in value.items()}
    return to_mapping


def _record(hint: type) -> Callable[[Any, str], Any]:
    plan: list = []  # (name, ".name", required, converter), made on first use: a record may name itself

    def to_record(value, path):
        if not isinstance(value, dict):
            raise WireError(f"{_where(path)}: expected a mapping, got {_kind(value)}")
        if not plan:
            attrs.resolve_types(hint)
            plan.extend((f.name, "." + f.name, f.default is attrs.NOTHING, _converter(f.type, f.metadata.get(BOUNDS)))
                        for f in attrs.fields(hint))
        kwargs = {}
        for name, dotted, required, convert in plan:
            if name in value:
                kwargs[name] = convert(value[name], (path, dotted))
            elif required:
                raise WireError(f"{_where(path)}.{name}: missing")
        try:
            return hint(**kwargs)
        except (TypeError, ValueError) as e:
            raise WireError(f"{_where(path)}: {e}") from None
    return to_record


def _enum(hint: type[enum.Enum]) -> Callable[[Any, str], Any]:
    known = ", ".join(str(member.value) for member in hint)
    by_value = {member.value: member for member in hint if isinstance(member.value, str)}

    def to_enum(value, path):
        if value.__class__ is str and value in by_value:
            return by_value[value]
        if isinstance(value, hint):
            return value
        if not isinstance(value, str):
            raise WireError(f"{_where(path)}: expected one of {known}, got {_kind(value)}")
        try:
            return hint(value)
        except ValueError:
            raise WireError(f"{_where(path)}: {value!r} is not one of {known}") from None
    return to_enum


def _count(value: list | tuple, path: str, bounds: Bounds | None) -> list | tuple:
    """*value*, or its last entries when it is prose; refused when it has more than it may."""
    if bounds is None or bounds.items is None or len(value) <= bounds.items:
        return value
    if bounds.text is Text.PROSE:
        return value[len(value) - bounds.items:]
    raise WireError(f"{_where(path)}: {len(value)} entries, more than the {bounds.items} it may have")


def _within(value: int | float, path: str, bounds: Bounds | None) -> int | float:
    least = -INT64 if bounds is None or bounds.least is None else bounds.least
    most = INT64 if bounds is None or bounds.most is None else bounds.most
    _limit(value, path, least, most)
    return value


def _limit(value: int | float, path: str, least: int | float, most: int | float) -> None:
    if value > most:
        raise WireError(f"{_where(path)}: {_figure(value)} is above {_figure(most)}, the most it may be")
    if value < least:
        raise WireError(f"{_where(path)}: {_figure(value)} is below {_figure(least)}, the least it may be")


def _text(value: str, path: str, bounds: Bounds | None) -> str:
    if bounds is not None and bounds.text is Text.PROSE:
        return wiretext.prose(value, bounds.chars)
    why = wiretext.refusal(value, None if bounds is None else bounds.text, None if bounds is None else bounds.chars)
    if why is not None:
        raise WireError(f"{_where(path)}: {why}")
    return value


def _figure(value: int | float) -> str:
    """*value* as a person reads it: 2**60 for a bound, and never all 400 digits of 10**400."""
    if isinstance(value, float):
        return repr(value)
    magnitude = abs(value)
    for k in range(32, 128):
        if magnitude == 2**k:
            return f"{'-' if value < 0 else ''}2**{k}"
        if magnitude == 2**k - 1:
            return f"{'-' if value < 0 else ''}2**{k}-1"
    if magnitude.bit_length() <= 64:
        return str(value)
    digits = int(magnitude.bit_length() * math.log10(2))
    if 10**digits > magnitude:
        digits -= 1
    exact = "" if 10**digits == magnitude else "about "
    return f"{exact}{'-' if value < 0 else ''}10**{digits}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"int {_figure(value)}"  # repr() of a huge int is slow, or refused past 4300 digits
    return f"{type(value).__name__} {value!r:.40}"

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
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, TypeVar

import attrs

T = TypeVar("T")


class WireError(ValueError):
    """A link payload does not have the shape its record requires."""


def to_wire(record: Any) -> Any:
    """A JSON-ready copy of *record* (attrs instances become dicts, enum members their values)."""
    if isinstance(record, enum.Enum):
        return record.value
    if attrs.has(type(record)):
        return {
            f.name: to_wire(getattr(record, f.name)) for f in attrs.fields(type(record))
        }
    if isinstance(record, (list, tuple)):
        return [to_wire(item) for item in record]
    if isinstance(record, dict):
        return {key: to_wire(value) for key, value in record.items()}
    return record


def from_wire(cls: type[T], payload: Any, path: str = "") -> T:
    """Build a *cls* from a link payload, or raise ``WireError`` naming the field."""
    return _convert(cls, payload, path or cls.__name__)


def _convert(hint: Any, value: Any, path: str) -> Any:
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except WireError as e:
                errors.append(str(e))
        raise WireError(errors[0] if len(errors) == 1 else f"{path}: {value!r} fits none of {hint}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise WireError(f"{path}: expected a list, got {_kind(value)}")
        (item,) = args[:1] or (Any,)
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(f"{path}: expected a mapping, got {_kind(value)}")
        key_hint, value_hint = args or (Any, Any)
        return {
            _convert(key_hint, k, f"{path} key"): _convert(value_hint, v, f"{path}.{k}")
            for k, v in value.items()
        }
    if attrs.has(hint):
        if not isinstance(value, dict):
            raise WireError(f"{path}: expected a mapping, got {_kind(value)}")
        attrs.resolve_types(hint)
        kwargs = {}
        for field in attrs.fields(hint):
            if field.name in value:
                kwargs[field.name] = _convert(field.type, value[field.name], f"{path}.{field.name}")
            elif field.default is attrs.NOTHING:
                raise WireError(f"{path}.{field.name}: missing")
        try:
            return hint(**kwargs)
        except (TypeError, ValueError) as e:
            raise WireError(f"{path}: {e}") from None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, hint):
            return value
        known = ", ".join(str(member.value) for member in hint)
        if not isinstance(value, str):
            raise WireError(f"{path}: expected one of {known}, got {_kind(value)}")
        try:
            return hint(value)
        except ValueError:
            raise WireError(f"{path}: {value!r} is not one of {known}") from None
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"{path}: expected a number, got {_kind(value)}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"{path}: expected an integer, got {_kind(value)}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise WireError(f"{path}: expected {hint.__name__}, got {_kind(value)}")
        return value
    raise TypeError(f"{path}: no wire conversion for {hint!r}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r:.40}"

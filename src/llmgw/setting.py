"""A key of a configuration file, declared once: on the attrs field that holds it.

``setting()`` is ``attrs.field`` with what the file's reader needs beside the
field's annotation and default: a number's lower bound (``least``, or
``above`` for one that must be more than it), or the reader's own ``kind``
for what an annotation cannot say (a path that must exist, one of a few
words, a string with a check).  ``llmgw.config.schema.section(cls)`` builds a
file's section from these, in the order the fields are declared, so the
type, the bounds and the default of a key are written in one place.  A field
made without ``setting()`` (a map entry's name, the file's own path) is not
a key.

The module is neutral so that a part that owns its settings (the hub's
``llmgw.link.settings``) declares them without importing the configuration
reader: ``kind`` is whatever object that reader takes, and nothing here reads it.
"""

from __future__ import annotations

from typing import Any

import attrs

SETTING = "llmgw.setting"


@attrs.frozen
class SettingBounds:
    """What a key may hold beyond its annotation's type."""

    least: int | float | None = None
    above: int | float | None = None
    kind: Any = None


def setting(
    default: Any = attrs.NOTHING, *, factory: Any = None, converter: Any = None, kw_only: bool = False,
    least: int | float | None = None, above: int | float | None = None, kind: Any = None,
) -> Any:
    """An attrs field that is a key of a configuration file, with its bounds or its reader's *kind*."""
    if least is not None and above is not None:
        raise TypeError("give least or above, not both")
    metadata = {SETTING: SettingBounds(least=least, above=above, kind=kind)}
    if factory is not None:
        return attrs.field(factory=factory, converter=converter, metadata=metadata, kw_only=kw_only)
    return attrs.field(default=default, converter=converter, metadata=metadata, kw_only=kw_only)


def bounds_of_setting(field: attrs.Attribute) -> SettingBounds | None:
    """The field's ``SettingBounds``, or None when it is not a key."""
    return field.metadata.get(SETTING)

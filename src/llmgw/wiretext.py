"""What a string on the link may hold, by what it is: a name, a path, an argument, or words for a person.

A string another process sends is stored, compared and written to logs and
screens, so each field says which of these it is (``llmgw.wire.field``'s
``text=``), and ``refusal`` says what in it is refused:

* a name (an id, a model, an engine and its version, a label, an address)
  holds printable characters only — no control, format (bidi override,
  zero-width) or separator character — and no whitespace around it, which
  would make ``" node05"`` another node than ``"node05"`` and an endpoint
  the router cannot reach;
* a path (a file, a URL, an endpoint, a source) holds no control character
  and no whitespace around it; a space or any other character inside is a
  path's own;
* an argument (a profile's arguments, an inline chat template) holds
  anything but NUL, whitespace and all;
* words for a person are cut to their bound, never refused (``prose``).

Whatever the kind, no string is longer than its bound or holds half a
UTF-16 pair, which UTF-8 cannot carry onwards.
"""

from __future__ import annotations

import enum
import re


class Text(enum.Enum):
    """What a string field holds, which says what in it is refused."""

    #: An identifier, a version, a model name, a label: printable, nothing around it.
    NAME = "name"
    #: A path, a URL, an endpoint: no control characters, nothing around it.
    PATH = "path"
    #: A command-line argument, a template: anything but NUL.
    FREE = "free"
    #: Words for a person: cut to its bound (a list to its last entries), never refused.
    PROSE = "prose"


#: The kinds whose value may have no whitespace around it.
TRIMMED = frozenset({Text.NAME, Text.PATH})

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_NUL = re.compile("\x00")


def refusal(value: str, text: Text | None, chars: int | None) -> str | None:
    """Why *value* may not be sent as a string of kind *text* within *chars*; None when it may.

    *text* None is a string with no bounds: only half a UTF-16 pair is refused.
    """
    if chars is not None and len(value) > chars:
        return f"{len(value)} characters, more than the {chars} it may have"
    if value.isascii() and value.isprintable():
        # No surrogate, control character or NUL: only a space at either end is left to refuse.
        if text in TRIMMED and (value[:1] == " " or value[-1:] == " "):
            return _untrimmed(value)
        return None
    if found := _SURROGATE.search(value):
        return f"U+{ord(found.group()):04X} at {found.start()} is half a UTF-16 pair, not a character"
    if text is None:
        return None
    found = (_NUL if text is Text.FREE else _CONTROL).search(value)
    if found:
        return (f"control character U+{ord(found.group()):04X} at {found.start()}, "
                f"which {'a name' if text is Text.NAME else 'it'} may not hold")
    if text is Text.NAME:
        odd = next((i for i, c in enumerate(value) if not c.isprintable()), None)
        if odd is not None:
            return f"unprintable character U+{ord(value[odd]):04X} at {odd}, which a name may not hold"
    if text in TRIMMED and value != value.strip():
        return _untrimmed(value)
    return None


def _untrimmed(value: str) -> str:
    return f"{value[:60]!r} has whitespace around it, which it may not have: send it without"


def prose(value: str, chars: int | None) -> str:
    """Words for a person as they may travel: a lone surrogate made "?", a long text cut where it says so."""
    value = value.encode("utf-8", "replace").decode("utf-8")
    if chars is not None and len(value) > chars:
        value = value[: chars - 1] + "…"
    return value

"""A node's words made safe to show: one escaping for every screen llmgw writes to.

Whatever another machine wrote (a certificate's subject, a node's log line,
an engine's reason, a node's hostname) reaches a person through
:func:`printable`: a character a terminal, a log file or a browser would act
on rather than show (ESC and every other control character, the bidi
overrides, zero-width and line-separator characters) is written as its
Python escape (``\\x1b``, ``\\u202e``), so the operator sees what was sent
and nothing sent can clear a screen, set a title, write the clipboard
(OSC 52) or turn a line around.  Markup (Textual's ``[b]``, HTML's ``<``) is
each display's own to escape; this is the one thing they all share.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, keep: str = "") -> str:
    """*text* with every character that is not printable escaped (``\\n``, ``\\x1b``, ``\\u202e``).

    *keep* names the few the caller lays out itself (``"\\n"`` for a block of
    lines, ``"\\n\\t"`` for a command's output): those stay as they are.
    Escaping twice changes nothing more, since the first pass leaves only
    printable characters.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)

"""``llmgw.text.printable``: the one escaping every screen llmgw writes a node's words to goes through."""

from __future__ import annotations

import pytest

from llmgw.text import printable

HOSTILE = [
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),                      # clear the screen, cursor home
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),                 # set the terminal's title
    ("\x1b]52;c;cm0gLXJmIH4=\x07", "\\x1b]52;c;cm0gLXJmIH4=\\x07"),  # OSC 52: write the clipboard
    ("\x9b31m", "\\x9b31m"),                                    # an 8-bit CSI
    ("evil\u202egnp.exe", "evil\\u202egnp.exe"),                # a right-to-left override
    ("a\u2066b\u2069", "a\\u2066b\\u2069"),                     # bidi isolates
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("line\u2028break", "line\\u2028break"),
    ("two\nlines\r", "two\\nlines\\r"),
    ("\x00", "\\x00"),
]


@pytest.mark.parametrize("sent, shown", HOSTILE)
def test_every_character_a_terminal_would_act_on_is_shown_escaped(sent, shown):
    assert printable(sent) == shown
    assert printable(shown) == shown  # escaping twice changes nothing more


def test_words_stay_as_they_are_and_kept_layout_characters_too():
    assert printable("NVIDIA H100 80GB HBM3 · 68 % ✓ [b]x[/b] <script>") == "NVIDIA H100 80GB HBM3 · 68 % ✓ [b]x[/b] <script>"
    assert printable("a\tb\nc\x1b", keep="\n\t") == "a\tb\nc\\x1b"


def test_the_pki_and_onboarding_use_this_one_function():
    from llmgw.pki import subject

    assert subject.printable is printable

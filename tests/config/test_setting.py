"""A key declared once, on its field: what ``section(cls)`` reads from ``setting()``."""

from __future__ import annotations

import attrs
import pytest

from llmgw.config.schema import Int, Nullable, Number, Str, section
from llmgw.link.settings import LinkSettings
from llmgw.setting import setting


@attrs.frozen
class Sample:
    name: str
    timeout_s: float = setting(5.0, above=0)
    pause_s: float | None = setting(None, least=0)
    count: int = setting(1, least=1)
    word: str = setting("a", kind=Str(what="a word"))


def test_the_section_is_read_from_the_fields_in_their_order_with_their_bounds():
    keys = section(Sample).keys
    assert list(keys) == ["timeout_s", "pause_s", "count", "word"]  # name is no key: whoever builds it knows it
    assert keys["timeout_s"] == Number(min=0, exclusive=True) and keys["timeout_s"].what == "a number > 0"
    assert keys["pause_s"] == Nullable(Number(min=0)) and keys["pause_s"].what == "a number >= 0 or null"
    assert keys["count"] == Int(min=1)
    assert keys["word"] == Str(what="a word")


def test_the_link_declares_its_own_settings_and_the_reader_takes_them_as_they_are():
    keys = section(LinkSettings).keys
    assert keys["max_message_depth"] == Int(min=4)
    assert keys["hello_timeout_s"].what == "a number > 0"


def test_a_field_whose_type_the_annotation_cannot_say_names_itself():
    @attrs.frozen
    class Unsaid:
        when: tuple[str, ...] = setting(())

    with pytest.raises(TypeError, match=r"Unsaid\.when: say how to read it with setting\(kind=\.\.\.\)"):
        section(Unsaid)

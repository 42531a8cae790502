"""LLMGW_VERBOSE: which values turn Twisted's chatter on."""

from __future__ import annotations

import pytest

from llmgw.verbose import VERBOSE_ENV, verbose_logs


@pytest.mark.parametrize("value", ["1", "yes", "true", "TRUE", " on "])
def test_a_value_that_says_yes_turns_it_on(value):
    assert verbose_logs({VERBOSE_ENV: value})


@pytest.mark.parametrize("value", ["", "0", "no", "false", " False ", None])
def test_unset_empty_or_a_value_that_says_no_leaves_it_off(value):
    assert not verbose_logs({} if value is None else {VERBOSE_ENV: value})

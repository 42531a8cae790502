"""One rounding rule for every size a person reads, and a refusal's size never reads as enough."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.sizes import GB, bytes_words, downloaded, figure, gb, gb_short_of, size_words


@pytest.mark.parametrize("value, said", [
    (8.202149888, "8"),  # MemTotal of an "8 GB" machine
    (7.5, "7.5"),
    (7.76, "8"),
    (0.3, "0.3"),
    (0, "0"),
    (12.3, "12"),
    (73.04, "73"),
    (2000.4, "2,000"),
])
def test_a_figure_is_whole_near_a_whole_number_and_from_ten_up_else_to_a_tenth(value, said):
    assert figure(value) == said


@pytest.mark.parametrize("n_bytes, said", [
    (2_000_000_000_000, "2,000 GB"),
    (7_500_000_000, "7.5 GB"),
    (8_202_149_888, "8 GB"),
    (120_400_000, "120 MB"),
    (1_500_000, "1.5 MB"),
    (900, "900 bytes"),
    (999_999, "999,999 bytes"),
])
def test_a_size_has_the_unit_that_suits_it(n_bytes, said):
    assert size_words(n_bytes) == said


def test_the_placement_figure_and_the_download_refusal_say_the_same_size_alike():
    # Both say how much room a node has for weights; they rounded 8.2 GB and 12.3 GB differently.
    for n_bytes in (8_202_149_888, 12_300_000_000, 7_500_000_000, 2_000_400_000_000):
        assert size_words(n_bytes) == f"{gb(n_bytes)} GB"


@pytest.mark.parametrize("has, need, said", [
    (23_900_000_000, 24, "23.9"),
    (23_999_000_000, 24, "23.9"),
    (8_202_149_888, 8.25, "8"),
    (1_999_990_000_000, 2000, "1,999.9"),
])
def test_short_of_a_need_never_reads_as_enough(has, need, said):
    assert gb_short_of(has, need) == said


@given(st.integers(0, 4096 * 10**9), st.floats(0.01, 4096))
def test_a_size_below_its_need_is_never_written_as_at_least_the_need(has, need):
    if has < need * GB:
        assert float(gb_short_of(has, need).replace(",", "")) < need


def test_a_download_says_its_length_or_that_nobody_did():
    assert downloaded(120_400_000, 253_000_000) == "120/253 MB"
    assert downloaded(5_300_000, 16_000_000) == "5.3/16 MB"
    assert downloaded(120_400_000, None) == "120 MB so far"
    assert downloaded(None, 0) == "0 MB so far"


def test_every_byte_when_rounding_would_mislead():
    assert bytes_words(73_040_000_000) == "73,040,000,000 bytes"

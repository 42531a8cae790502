"""A scaling policy is elastic only when its count can move."""

from llmgw.config.scale import Scale


def test_min_below_max_is_elastic_and_equal_is_not():
    assert Scale(min=0, max=2).elastic
    assert not Scale(min=2, max=2).elastic

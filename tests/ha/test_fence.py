"""The epoch's contract: what counts as one, when a command carries it, and the words of a server that does not lead."""

from __future__ import annotations

import pytest
from autobahn.wamp.exception import ApplicationError

from llmgw.ha.fence import MOST, NotLeading, epoch_from, epoch_keyword, no_ha
from llmgw.link import uris


def test_an_epoch_is_a_whole_number_from_one_to_etcd_s_largest_revision():
    assert epoch_from(None, "x") is None
    assert epoch_from(1, "x") == 1 and epoch_from(MOST, "x") == MOST
    for wrong, shown in ((0, "0"), (-3, "-3"), (MOST + 1, str(MOST + 1)), (True, "True"), ("5", "'5'"), (5.0, "5.0"),
                         ("x" * 100, "'" + "x" * 38 + "…")):
        with pytest.raises(ValueError) as refused:
            epoch_from(wrong, "start_shard's epoch")
        assert str(refused.value) == (f"start_shard's epoch: an epoch is a whole number from 1 to {MOST} (the "
                                      f"leader's election revision in etcd), not {shown}")


def test_a_command_carries_the_epoch_only_with_ha_and_only_to_an_agent_that_said_it_checks_one():
    assert epoch_keyword(7, True) == {"epoch": 7} == {uris.EPOCH: 7}
    assert epoch_keyword(None, True) == {}
    assert epoch_keyword(7, None) == {} and epoch_keyword(7, False) == {}
    assert no_ha() is None


def test_not_leading_is_heard_as_a_refusal_in_its_own_words():
    words = "serverA no longer leads: serverB at wss://b:7443/ does (epoch 12); run the command there"
    refusal = NotLeading(words)
    assert isinstance(refusal, ApplicationError)
    assert (refusal.error, refusal.args, refusal.words) == (uris.ERROR_REFUSED, (words,), words)

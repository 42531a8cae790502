"""The hub's global-scope ids come from the generators it is given; by default a session's cannot be guessed."""

from __future__ import annotations

import random

import pytest_twisted
from autobahn.wamp.types import ComponentConfig, PublishOptions
from twisted.internet import reactor

from llmgw.link import ids, uris
from llmgw.link.hub import Hub
from tests.link.conftest import Joined


async def _attach(hub: Hub, authid: str) -> Joined:
    session = Joined(ComponentConfig(realm=uris.REALM))
    hub.attach_local(session, authid=authid)
    return await session.ready.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_a_hub_given_seeded_generators_hands_out_exactly_the_ids_they_draw():
    hub = Hub(reactor, session_ids=random.Random(25), publication_ids=random.Random(52))
    sessions, publications = random.Random(25), random.Random(52)
    first, second = await _attach(hub, "control"), await _attach(hub, "control-2")
    assert [first._session_id, second._session_id] == [sessions.randint(1, 2**53) for _ in range(2)]
    published = await first.publish(uris.EVENT_NODE, "node01", options=PublishOptions(acknowledge=True))
    # Each join published its session meta event first, drawing one id apiece.
    assert published.id == [publications.randint(1, 2**53) for _ in range(3)][-1]
    first.leave()
    second.leave()


def test_session_ids_come_from_the_system_unless_a_hub_is_given_a_generator():
    assert isinstance(ids.session_ids(), random.SystemRandom)
    assert not isinstance(ids.publication_ids(), random.SystemRandom)


def test_a_global_id_lies_in_the_basic_profile_s_range():
    class Edges:
        def __init__(self):
            self.asked = []

        def randint(self, a, b):
            self.asked.append((a, b))
            return b

    edges = Edges()
    assert ids.global_id(edges) == 2**53
    assert edges.asked == [(1, 2**53)]

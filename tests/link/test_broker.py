"""The broker on its own hub, with in-process sessions: publisher exclusion, and subscriptions that go with their session."""

from __future__ import annotations

import pytest_twisted
from autobahn.wamp.types import ComponentConfig, PublishOptions, SubscribeOptions
from twisted.internet import reactor

from llmgw.link import uris
from llmgw.link.hub import Hub
from tests.link.conftest import Joined
from tests.support.wait import until


async def _attach(hub: Hub, authid: str) -> Joined:
    session = Joined(ComponentConfig(realm=uris.REALM))
    hub.attach_local(session, authid=authid)
    return await session.ready.addTimeout(5, reactor)


@pytest_twisted.ensureDeferred
async def test_a_publisher_hears_its_own_event_only_when_it_asks_not_to_be_excluded():
    hub = Hub(reactor)
    publisher, listener = await _attach(hub, "control"), await _attach(hub, "control-2")
    heard: dict[str, list] = {"control": [], "control-2": []}
    for session, name in ((publisher, "control"), (listener, "control-2")):
        await session.subscribe(lambda change, name=name: heard[name].append(change), uris.EVENT_NODE)
    await publisher.publish(uris.EVENT_NODE, "first", options=PublishOptions(acknowledge=True))
    await publisher.publish(uris.EVENT_NODE, "second", options=PublishOptions(acknowledge=True, exclude_me=False))
    await until(lambda: heard["control-2"] == ["first", "second"], "both events at the listener")
    # The publisher's own EVENT came before the acknowledgement that was awaited above.
    assert heard["control"] == ["second"]
    publisher.leave()
    listener.leave()


@pytest_twisted.ensureDeferred
async def test_a_prefix_subscription_goes_with_the_last_session_that_held_it():
    hub = Hub(reactor)
    watcher, publisher = await _attach(hub, "control"), await _attach(hub, "control-2")
    subscription = await watcher.subscribe(lambda *args: None, uris.EVENT_PREFIX, SubscribeOptions(match="prefix"))
    assert subscription.id in hub.sessions[watcher._session_id].subscriptions
    watcher.leave()
    await until(lambda: watcher._session_id is None, "the watcher to leave")
    again = await publisher.subscribe(lambda *args: None, uris.EVENT_PREFIX, SubscribeOptions(match="prefix"))
    # A new subscription, not the old one kept alive by nobody.
    assert again.id != subscription.id
    publisher.leave()

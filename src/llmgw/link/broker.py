"""The hub's broker: subscriptions, and each publication delivered to them.

The Basic Profile's SUBSCRIBE/PUBLISH/EVENT with the Advanced Profile's
prefix subscriptions and publisher exclusion.  A session other than the
control plane holds at most ``link.max_subscriptions_per_session``; the
events it wants are one prefix subscription away.

The hub (``llmgw.link.hub``) owns the sessions and hands the broker each
message of an open one; it decides who may do what (*refused*), and
publishes its own session meta events through ``publish_event``.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Callable

import attrs
from autobahn.wamp import message
from twisted.logger import Logger

from llmgw.link import authz, uris
from llmgw.link.ids import global_id
from llmgw.roles import ROLE_CONTROL

if TYPE_CHECKING:
    from llmgw.link.settings import LinkSettings
    from llmgw.link.dealer import Refuser
    from llmgw.link.peer import HubSession

log = Logger()


@attrs.define(eq=False)
class _Subscription:
    id: int
    topic: str
    match: str
    subscribers: set = attrs.Factory(set)


class Broker:
    """The subscriptions of every session of one hub, exact and by prefix."""

    def __init__(self, settings: LinkSettings, refusals: Counter[str], refused: Refuser, new_id: Callable[[], int],
                 publication_ids: random.Random):
        self._settings = settings
        self._refusals = refusals  # the hub's count by limit
        self._refused = refused
        self._new_id = new_id  # router-scope ids, shared with the dealer's registrations
        self._publication_ids = publication_ids
        self._exact: dict[str, _Subscription] = {}
        self._prefix: dict[str, _Subscription] = {}
        self._subscriptions_by_id: dict[int, _Subscription] = {}

    def session_left(self, session: HubSession) -> None:
        """*session* left: it leaves every subscription, and one nobody holds any more goes."""
        for sub_id in list(session.subscriptions):
            sub = self._subscriptions_by_id.get(sub_id)
            if sub is not None:
                sub.subscribers.discard(session)
                if not sub.subscribers:
                    self._drop_subscription(sub)
        session.subscriptions.clear()

    def on_subscribe(self, session: HubSession, msg) -> None:
        if self._refused(session, authz.SUBSCRIBE, msg.topic, message.Subscribe.MESSAGE_TYPE, msg.request):
            return
        match = msg.match or "exact"
        if match not in ("exact", "prefix"):
            session.send(message.Error(message.Subscribe.MESSAGE_TYPE, msg.request, "wamp.error.invalid_argument",
                                       args=["this hub matches topics exactly or by prefix"]))
            return
        table = self._exact if match == "exact" else self._prefix
        sub = table.get(msg.topic)
        if (sub is None or session not in sub.subscribers) and self._too_many_subscriptions(session, msg):
            return
        if sub is None:
            sub = _Subscription(self._new_id(), msg.topic, match)
            table[msg.topic] = sub
            self._subscriptions_by_id[sub.id] = sub
        sub.subscribers.add(session)
        session.subscriptions.add(sub.id)
        session.send(message.Subscribed(msg.request, sub.id))

    def _too_many_subscriptions(self, session: HubSession, msg) -> bool:
        most = self._settings.max_subscriptions_per_session
        if session.role == ROLE_CONTROL or len(session.subscriptions) < most:
            return False
        self._refusals["subscriptions"] += 1
        why = (f"{session.role} {session.authid} holds {most} subscriptions, the most one session may "
               f"(link.max_subscriptions_per_session); subscribe to {uris.EVENT_PREFIX} with match=prefix instead")
        log.warn("refused a subscription to {topic} from {s}: {why}", topic=msg.topic, s=session, why=why)
        session.send(message.Error(message.Subscribe.MESSAGE_TYPE, msg.request, uris.ERROR_LIMIT, args=[why]))
        return True

    def on_unsubscribe(self, session: HubSession, msg) -> None:
        sub = self._subscriptions_by_id.get(msg.subscription)
        if sub is None or session not in sub.subscribers:
            session.send(message.Error(message.Unsubscribe.MESSAGE_TYPE, msg.request, "wamp.error.no_such_subscription",
                                       args=[f"this session holds no subscription {msg.subscription}"]))
            return
        sub.subscribers.discard(session)
        session.subscriptions.discard(sub.id)
        if not sub.subscribers:
            self._drop_subscription(sub)
        session.send(message.Unsubscribed(msg.request))

    def _drop_subscription(self, sub: _Subscription) -> None:
        table = self._exact if sub.match == "exact" else self._prefix
        if table.get(sub.topic) is sub:
            del table[sub.topic]
        self._subscriptions_by_id.pop(sub.id, None)

    def on_publish(self, session: HubSession, msg) -> None:
        # Basic Profile, "Publishing and Events": an unacknowledged publication
        # hears nothing back, refused or not.
        if self._refused(session, authz.PUBLISH, msg.topic, message.Publish.MESSAGE_TYPE, msg.request,
                         answer=bool(msg.acknowledge)):
            return
        publication = self.publish_event(msg.topic, msg.args, msg.kwargs, publisher=None if msg.exclude_me is False else session)
        if msg.acknowledge:
            session.send(message.Published(msg.request, publication))

    def publish_event(self, topic: str, args, kwargs, publisher: HubSession | None) -> int:
        """An EVENT to every subscriber of *topic* but *publisher*; the publication's id."""
        publication = global_id(self._publication_ids)
        matching = [self._exact[topic]] if topic in self._exact else []
        matching += [sub for prefix, sub in list(self._prefix.items()) if topic.startswith(prefix)]
        for sub in matching:
            for subscriber in list(sub.subscribers):
                if subscriber is not publisher:
                    subscriber.send(message.Event(sub.id, publication, args=args, kwargs=kwargs, topic=topic))
        return publication

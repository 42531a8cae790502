"""Several hubs to dial, in order: the next one after a failure, and the leader a standby names.

With server.yaml's ``ha:`` several servers share one cluster and one leads.
An agent.yaml may list each server's hub; the agent dials them in that
order.  A server that stands by refuses the agent's registration with
``llmgw.error.standby``, naming the leader's hub URL; the agent goes there
at once, but only if that URL is one of its own list (same host and port):
a payload never makes a node dial somewhere its operator did not write.
A leader it does not know, or none named, sends it to the next hub of its
list, after the usual backoff; so does a second standby in a row, so two
servers naming each other during an election cannot spin it.

A session lost on one of several hubs tries the next hub first: the lost
hub's server may be gone or hung, and a standby that still has a live
leader sends the client straight back to it.  And with several hubs, an
opening handshake (TLS and the WebSocket upgrade) that has not finished in
``handshake_timeout_s`` (agent.yaml's ``hub_handshake_timeout_s``, 10 s) is
given up for the next hub: a hung server accepts TCP connections (the
kernel does) and answers nothing.  A client of one hub waits
``SINGLE_HANDSHAKE_TIMEOUT_S`` (30 s): it has nowhere else to go, and a
hub taking back a whole fleet can be that slow.

``llmgw.link.client.reconnecting`` asks this which hub to dial and how long
to wait; the session tells it what the hub said (``standby``) and when it
settled (``settled``).
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from llmgw.huburl import HubAddress, parse_hub_url
from llmgw.text import printable

#: How much of a standby's words and of a leader's URL a log line shows.
WORDS_CHARS = 300
#: How long a client of one hub gives its opening handshake; of several, ``HubList.handshake_timeout_s``.
SINGLE_HANDSHAKE_TIMEOUT_S = 30.0
#: agent.yaml's ``hub_handshake_timeout_s`` when not given: the hub's own limit on a handshake (link.hello_timeout_s).
HANDSHAKE_TIMEOUT_S = 10.0


@attrs.frozen
class StandbyRefusal:
    """What a hub said when it refused this client as a standby: its words, and the leader if this client knows it."""

    hub: HubAddress
    words: str
    leader: HubAddress | None
    named: str | None  # the leader URL as the hub sent it, for the log


class HubList:
    """The hubs a client may dial, in its configuration's order, and which it dials next."""

    def __init__(self, hubs: Sequence[HubAddress], handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S):
        if not hubs:
            raise ValueError("a client needs at least one hub to dial")
        self.hubs: tuple[HubAddress, ...] = tuple(hubs)
        self._handshake_timeout_s = handshake_timeout_s
        self._at = 0
        self._refusal: StandbyRefusal | None = None
        # Standby refusals since a session last settled: what the backoff counts, and whether the next may jump at once.
        self.refusals = 0
        self._jumped = False

    @classmethod
    def of(cls, urls: Sequence[str], handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> HubList:
        return cls([parse_hub_url(url) for url in urls], handshake_timeout_s)

    @property
    def current(self) -> HubAddress:
        return self.hubs[self._at]

    @property
    def several(self) -> bool:
        return len(self.hubs) > 1

    @property
    def handshake_timeout_s(self) -> float:
        """How long an opening handshake may take before the client gives it up (and, of several, moves on)."""
        return self._handshake_timeout_s if self.several else SINGLE_HANDSHAKE_TIMEOUT_S

    @property
    def refused(self) -> bool:
        """Whether the last session's hub refused this client as a standby (``after_refusal`` not yet asked)."""
        return self._refusal is not None

    def find(self, url: Any) -> HubAddress | None:
        """The hub of this list that *url* names (same host, any case, and port), or None."""
        if not isinstance(url, str) or len(url) > 2048:
            return None
        try:
            named = parse_hub_url(url)
        except ValueError:
            return None
        return next((hub for hub in self.hubs
                     if hub.host.lower() == named.host.lower() and hub.port == named.port), None)

    def standby(self, words: Any, leader_url: Any = None) -> None:
        """The hub dialled refused this client as a standby, in *words*, naming *leader_url* (or not)."""
        said = printable(words if isinstance(words, str) else "it stands by")[:WORDS_CHARS]
        named = printable(leader_url)[:WORDS_CHARS] if isinstance(leader_url, str) else None
        self._refusal = StandbyRefusal(self.current, said, self.find(leader_url), named)

    def settled(self) -> None:
        """A session on the current hub did what it came for (an agent registered): standbys are behind it."""
        self.refusals = 0
        self._jumped = False
        self._refusal = None

    def advance(self) -> HubAddress:
        """The next hub of the list, after the last (the first again after the last)."""
        self._at = (self._at + 1) % len(self.hubs)
        return self.current

    def after_refusal(self) -> tuple[str, bool] | None:
        """Where to go after a standby's refusal, if the last session had one: (what to log, whether at once).

        At once to the leader it named when this list holds it and the last
        move was not itself such a jump; otherwise the next hub, after backoff.
        """
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            return None
        self.refusals += 1
        said = f"the hub at {refusal.hub.url} stands by ({refusal.words})"
        if refusal.leader is not None and refusal.leader != refusal.hub and not self._jumped:
            self._jumped = True
            self._at = self.hubs.index(refusal.leader)
            return f"{said}; going to the leader's hub, {refusal.leader.url}, now", True
        self._jumped = False
        if refusal.named is not None and refusal.leader is None:
            said += (f"; it names {refusal.named} as the leader's hub, which is not in this node's list of hubs "
                     "(add it to agent.yaml's hub: to go straight there)")
        return f"{said}; trying {self.advance().url}", False

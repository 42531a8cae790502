"""A node that says hostile things to a real server over real TLS: in its report, its answers and its refusals.

``WORDS`` holds what a terminal, Textual or a browser would act on rather
than show: an OSC 52 clipboard write, a clear screen, a new window title, a
right-to-left override, Textual markup with an action, and HTML.  What a
node's answer to ``llmgw.node.<id>.*`` is, the test sets in ``answers``.
"""

from __future__ import annotations

from typing import Any

from autobahn.wamp.exception import ApplicationError

from llmgw.huburl import parse_hub_url
from llmgw.link import uris
from llmgw.link.client import connect_once
from llmgw.tlsfiles import TLSFiles

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4vKg==\x07"
WORDS = (CLIPBOARD + "\x1b[2J\x1b]0;owned\x07\x9b31m evil\u202egnp.exe [b]bold[/b] [@click=app.quit]quit[/] "
         "<script>alert(1)</script>\rforged")
#: What the node may put in a name (no control character passes the control plane): markup, HTML.
NAME_WORDS = "x [b]b[/b] [@click=app.quit]q[/] <i>"
#: Each sent character a display must not pass on as it is.
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\r")

INVENTORY = {
    "node_id": "node01", "hostname": NAME_WORDS, "os": NAME_WORDS, "address": "127.0.0.1",
    "cpu": {"model": NAME_WORDS, "logical_cores": 8},
    "memory_total_bytes": 8 * 2**30,
    "gpus": [{"index": 0, "name": NAME_WORDS}],
    "labels": {"gpu": NAME_WORDS},
    "warnings": [WORDS],
    "engines": [{"name": "llama.cpp", "version": "b1", "state": "broken", "reason": WORDS}],
}

LOGS = {"node": "node01", "source": "agent", "sources": ["agent", NAME_WORDS], "lines": [WORDS, "after\nforged line"]}


def raw_in(text: str) -> list[str]:
    """The characters of ``RAW`` that *text* holds as they were sent."""
    return [c for c in RAW if c in text]


class HostileNode:
    """node01's certificate, its own session on the hub, registered with ``INVENTORY``; it answers from ``answers``."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.session = None
        # verb -> what the node answers (an ApplicationError is raised instead).
        self.answers: dict[str, Any] = {
            uris.NODE_LOGS: LOGS,
            uris.NODE_CORDON: ApplicationError(uris.ERROR_REFUSED, WORDS),
        }

    async def join(self, inventory: dict | None = None) -> HostileNode:
        from twisted.internet import reactor  # the one installed: the dashboard's tests install asyncio's first

        pki = self.cluster.pki
        tls = TLSFiles(str(pki / "ca.crt"), str(pki / "node01.crt"), str(pki / "node01.key"))
        self.session = await connect_once(reactor, parse_hub_url(self.cluster.hub), tls, timeout=10)
        for verb in (uris.NODE_LOGS, uris.NODE_CORDON, uris.NODE_COLLECT_WEIGHTS, uris.NODE_DRAIN_SHARD):
            await self.session.register(self._answer(verb), uris.node_uri("node01", verb))
        await self.session.call(uris.AGENT_REGISTER, inventory or INVENTORY)
        return self

    def _answer(self, verb: str):
        def answer(*args, **kwargs):
            said = self.answers.get(verb)
            if isinstance(said, Exception):
                raise said
            return said
        return answer

    def leave(self) -> None:
        if self.session is not None:
            self.session.leave()

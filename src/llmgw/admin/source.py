"""The server's control plane as the admin page's ``FleetSource``: its own session, in process.

The views are the ones ``llmgw.cp.nodes`` and ``llmgw.cp.replicas`` send
ctl and the TUI; logs are the relayed ``llmgw.cp.logs`` (so a node that does
not answer in 10 s says so); the verbs are ``llmgw.cp.drain``/``cordon``/
``uncordon`` with the control plane's own refusals.  Each answer is read
back as its record (``llmgw.answers``: ``LogsAnswer``, ``CordonAnswer``, ``DrainAnswer``), as
ctl and the dashboard read it.  A log's lines come out escaped
(``render.log_lines``), so the page and ``logs.json`` show the same.
The journal and the figures are ``llmgw.cp.events`` and ``llmgw.cp.figures``
called through the hub, as ctl calls them (``llmgw.history.JournalPage``,
``Figures``): the page never reads the control plane's stores itself.
"""

from __future__ import annotations

import attrs
from autobahn.wamp.exception import ApplicationError

from llmgw.admin.site import SourceError
from llmgw.answers import CordonAnswer, DrainAnswer, LogsAnswer
from llmgw.history import Figures, JournalPage, Scope
from llmgw.link import uris
from llmgw.render import log_lines
from llmgw.views import FleetStatus, NodeView, ReplicaView, ServerView
from llmgw.wire import WireError, from_wire

#: What each node verb answers: a drain says which shards it asked to stop.
VERB_ANSWERS = {"drain": DrainAnswer, "cordon": CordonAnswer, "uncordon": CordonAnswer}


class ControlSource:
    """Reads *control*'s session (``llmgw.process.server.ControlPlane``) when a request comes, not before."""

    def __init__(self, control):
        self._control = control

    def _session(self):
        session = self._control.session
        if session is None or not session.is_attached():
            raise SourceError("the control plane has not joined the hub yet: reload in a moment")
        return session

    def nodes(self) -> list[NodeView]:
        return sorted(self._session().fleet.views(), key=lambda n: n.id)

    def replicas(self) -> list[ReplicaView]:
        return list(self._session().reconciler.views())

    async def logs(self, node_id: str, source: str | None, n: int) -> LogsAnswer:
        answer = _decode(LogsAnswer, await self._call(self._session().logs, node_id, source, n))
        return attrs.evolve(answer, lines=log_lines(answer.lines))

    async def events(self, node: str | None = None, model: str | None = None) -> JournalPage:
        """The journal, only *node*'s or *model*'s entries when named (the page picks a replica's from its model's)."""
        which = {k: v for k, v in (("node", node), ("model", model)) if v is not None}
        return _decode(JournalPage, await self._call(self._session().call, uris.CP_EVENTS, **which))

    async def figures(self, scope: Scope | None = None, subject: str | None = None,
                      limit: int | None = None) -> Figures:
        """The last hour's series: every one, or *scope*'s, or one *subject*'s; at most *limit* series."""
        which = {k: v for k, v in (("scope", scope and str(scope)), ("subject", subject), ("limit", limit))
                 if v is not None}
        return _decode(Figures, await self._call(self._session().call, uris.CP_FIGURES, **which))

    async def act(self, verb: str, node_id: str) -> CordonAnswer | DrainAnswer:
        # Through the hub, as ctl asks: a standby's control plane refuses there, naming the leader.
        uri = {"drain": uris.CP_DRAIN, "cordon": uris.CP_CORDON, "uncordon": uris.CP_UNCORDON}[verb]
        return _decode(VERB_ANSWERS[verb], await self._call(self._session().call, uri, node_id))

    async def servers(self) -> tuple[str | None, list[ServerView]]:
        """With ``ha:``, this server's name and every server (``llmgw.cp.status``); (None, []) without."""
        roles = getattr(self._control, "ha", None)  # llmgw.process.ha.Roles, when server.yaml has ha:
        if roles is None:
            return None, []
        status = _decode(FleetStatus, await self._call(self._session().call, uris.CP_STATUS))
        return roles.name, status.servers

    @staticmethod
    async def _call(method, *args, **kwargs):
        try:
            return await method(*args, **kwargs)
        except ApplicationError as e:
            raise SourceError(e.args[0] if e.args else e.error) from None
        except Exception as e:  # the link went while asking: say so on the page, not a 500
            raise SourceError(f"the control plane could not ask ({type(e).__name__}: {e})"[:500]) from None


def _decode(kind: type, answer):
    """The control plane's answer as its view record; one that does not fit is said on the page, not a 500."""
    try:
        return from_wire(kind, answer)
    except WireError as e:
        raise SourceError(f"the control plane answered something this page cannot read ({e})"[:500]) from None

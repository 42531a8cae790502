"""The admin page as a resource: what each address answers, who may ask, and how much.

One ``AdminPage`` serves ``/`` on ``listen.admin`` and another ``/admin``
on the API listener (``base`` is the prefix its links carry; there
``trust_local`` is False: a reverse proxy may face that listener, and every
visitor would come from its address, so everyone signs in).  It reads the
fleet through a ``FleetSource`` — in the server, the control plane's own
session: the same views ``llmgw.cp.nodes``/``llmgw.cp.replicas`` answer ctl
and the TUI, the same relayed ``llmgw.cp.logs`` as ``llmgw ctl logs``, the
same ``drain``/``cordon``/``uncordon``.

A request names one host, for a path (``llmgw.hostnames``); on
``listen.admin`` a peer on ``admin.local`` that asks for a name which is not
this server's is answered 421, whatever else it asks: that is how a page
whose DNS name was re-pointed here (DNS rebinding) looks.  ``/metrics``
beside the page asks ``misdirected`` the same.

Every answer carries the same strict headers (``SECURITY_HEADERS``): no
inline script, no framing, no sniffing, no caching.  A request asks for at
most ``admin.log_lines`` lines and is shown at most ``admin.log_bytes`` of
them; tables stop at ``admin.max_rows`` and say how many they left out.
The cluster page ends with the journal's newest events and the last hour's
charts (``llmgw.admin.history``, ``llmgw.admin.charts``); a node's and a
replica's page show their own.  A journal or figures the control plane
cannot give is said in its section; the rest of the page still shows.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Protocol
from urllib.parse import parse_qs

import attrs
from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.template import flattenString

from llmgw import hostnames as hosts
from llmgw.admin import charts, history, pages, servers
from llmgw.admin.auth import CSRF_FIELD, Guard, Operator, Throttled
from llmgw.answers import CordonAnswer, DrainAnswer, LogsAnswer
from llmgw.config.server import AdminSettings
from llmgw.history import PAGE_MOST, Figures, JournalPage, Scope
from llmgw.views import NodeView, ReplicaView, ServerView
from llmgw.wire import to_wire

log = Logger()

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    b"content-security-policy": CSP.encode(),
    b"x-content-type-options": b"nosniff",
    b"x-frame-options": b"DENY",
    # Not no-referrer: with it a browser sends "Origin: null" on the page's own forms.
    b"referrer-policy": b"same-origin",
    b"cache-control": b"no-store",
}
#: A form the page sends is a few hundred bytes; nothing larger is read.
MAX_FORM_BYTES = 8 * 1024
#: The newest events the cluster page shows (a node's or a replica's page: admin.max_rows).
CLUSTER_EVENTS = 25
#: What the cluster page asks of each scope's figures: this many series a charted subject, at most.
SERIES_PER_SUBJECT = 8
#: A node id, a replica id or a log source longer than this is nobody's.
MAX_NAME_CHARS = 256
STATIC = {b"admin.js": "application/javascript; charset=utf-8", b"admin.css": "text/css; charset=utf-8",
          b"favicon.svg": "image/svg+xml"}


class FleetSource(Protocol):
    """What the page reads and does; raises ``SourceError`` with the control plane's words."""

    def nodes(self) -> list[NodeView]: ...

    def replicas(self) -> list[ReplicaView]: ...

    async def logs(self, node_id: str, source: str | None, n: int) -> LogsAnswer: ...

    async def act(self, verb: str, node_id: str) -> CordonAnswer | DrainAnswer: ...

    async def events(self, node: str | None = None, model: str | None = None) -> JournalPage: ...

    async def figures(self, scope: Scope | None = None, subject: str | None = None,
                      limit: int | None = None) -> Figures: ...

    async def servers(self) -> tuple[str | None, list[ServerView]]:
        """(this server's name, every server) with ``ha:``; (None, []) without."""


class SourceError(Exception):
    """The control plane refused or could not answer; the message is for the page."""


class BadQuery(Exception):
    """A request asked for something malformed or too large; the message says what."""


class AdminPage(Resource):
    isLeaf = True

    def __init__(self, source: FleetSource, settings: AdminSettings, clock, base: str = "", guard: Guard | None = None,
                 trust_local: bool = True):
        super().__init__()
        self.source = source
        self.settings = settings
        self.base = base
        self.trust_local = trust_local
        self.guard = guard if guard is not None else Guard(settings, clock)

    def reconfigure(self, settings: AdminSettings) -> None:
        """A reloaded ``admin:`` section (the guard may be shared with the page on the other listener)."""
        self.settings = settings
        self.guard.reconfigure(settings)

    # -- dispatch --

    def render(self, request: server.Request):
        for name, value in SECURITY_HEADERS.items():
            request.setHeader(name, value)
        try:
            host = hosts.asked(request)
        except hosts.BadHost as e:
            return self._plain(request, http.BAD_REQUEST, str(e))
        refusal = self._misdirected_local(request)
        if refusal is not None:
            return self._plain(request, refusal.code, refusal.words)
        path = [p for p in request.postpath if p]
        first = path[0] if path else b""
        method = request.method
        if first == b"static" and len(path) == 2 and path[1] in STATIC and method in (b"GET", b"HEAD"):
            return self._static(request, path[1])
        if len(path) > 1:
            return self._plain(request, http.NOT_FOUND, "no such page")
        operator = self.guard.operator(request, self.trust_local)
        if method == b"POST":
            return self._post(request, first, operator, host)
        if method not in (b"GET", b"HEAD"):
            request.setHeader(b"allow", b"GET, HEAD, POST")
            return self._plain(request, http.NOT_ALLOWED, "the admin page answers GET and POST")
        if operator is None:
            request.setResponseCode(http.UNAUTHORIZED if first != b"login" else http.OK)
            return self._html(request, self._login_page(request, None))
        operator = attrs.evolve(operator, csrf=self.guard.csrf_token(request))
        self._async(request, self._get(request, first.decode("ascii", "replace"), operator))
        return server.NOT_DONE_YET

    async def _get(self, request, name: str, operator: Operator):
        base, rows = self.base, self.settings.max_rows
        if name in ("", "login"):
            journal, figures = await self._asked(self.source.events()), await self._asked(self._cluster_figures(rows))
            page_, error = journal
            answer, servers_error = await self._asked(self.source.servers())
            here, listed = answer if answer is not None else (None, None)
            return pages.cluster(base, operator, self.source.nodes(), self.source.replicas(), rows, servers=[
                servers.standby_notice(listed or [], here), servers.servers_section(listed, servers_error, here)],
                history=[
                history.events_section(base, page_, error, page_.entries if page_ else [],
                                       min(CLUSTER_EVENTS, rows), pages.link),
                charts.figures_section(*figures, rows, self._chart_heading)])
        if name == "node":
            node = self._node(request)
            source, n, follow = _arg(request, b"source"), self._lines(request), _arg(request, b"follow") == "1"
            logs = await self._logs(node.id, source, n, follow)
            notice = pages.DONE.get(_arg(request, b"done") or "")  # never the query's own words
            (page_, error), (figures, figures_error) = (await self._asked(self.source.events(node=node.id)),
                                                        await self._asked(self.source.figures(Scope.NODE, node.id)))
            own = history.mine(page_, node=node.id) if page_ else []
            return pages.node_page(base, operator, node, self.source.replicas(), logs, notice, rows, history=[
                history.events_section(base, page_, error, own, rows, pages.link, empty="nothing recorded of this node"),
                charts.subject_section(figures, figures_error, Scope.NODE, node.id, "Last hour")])
        if name == "replica":
            replica = self._replica(request)
            leader = next((s for s in sorted(replica.shards, key=lambda s: s.rank or 0) if s.node), None)
            n, follow = self._lines(request), _arg(request, b"follow") == "1"
            source = _arg(request, b"source") or (leader.shard if leader else None)
            logs = "" if leader is None else await self._logs(leader.node, source, n, follow, "replica", replica.replica)
            (page_, error), (figures, figures_error) = (
                await self._asked(self.source.events(model=replica.model)),
                await self._asked(self.source.figures(Scope.MODEL, replica.model)))
            own = history.mine(page_, replica=replica.replica) if page_ else []
            return pages.replica_page(base, operator, replica, logs, rows, history=[
                history.events_section(base, page_, error, own, rows, pages.link,
                                       empty="nothing recorded of this replica"),
                charts.subject_section(figures, figures_error, Scope.MODEL, replica.model,
                                       f"Last hour of model {replica.model}")])
        if name == "confirm":
            node, verb = self._node(request, b"node"), _arg(request, b"action")
            if verb not in pages.VERBS:
                raise BadQuery(f"action is one of {', '.join(pages.VERBS)}")
            return pages.confirm_page(base, operator, node, verb, self.source.replicas(), self.guard.csrf_token(request))
        if name == "logs.json":
            node = self._node(request, b"node")
            shown, clipped = await self._fetch_logs(node.id, _arg(request, b"source"), self._lines(request))
            return _json(request, {**to_wire(shown), "clipped": clipped})
        if name == "progress.json":
            return _json(request, self._progress())
        raise LookupError("no such page")

    def _post(self, request, name: bytes, operator: Operator | None, host: hosts.Asked):
        form = _form(request)
        if form is None:
            return self._plain(request, http.REQUEST_ENTITY_TOO_LARGE, f"a form is at most {MAX_FORM_BYTES} bytes")
        if not hosts.same_origin(request, host) or not self.guard.csrf_ok(request, form.get(CSRF_FIELD.decode())):
            return self._plain(request, http.FORBIDDEN,
                               "this form's CSRF token is missing or not this browser's: reload the page and send it again")
        if name == b"login":
            try:
                who = self.guard.login(request, form.get("key") or "")
            except Throttled as e:
                request.setResponseCode(429)
                request.setHeader(b"retry-after", str(max(1, math.ceil(e.wait_s))).encode())
                return self._html(request, self._login_page(request, str(e)))
            if who is None:
                request.setResponseCode(http.UNAUTHORIZED)
                log.info("admin page: a sign-in from {peer} with a key admin.keys does not have",
                         peer=getattr(request.getClientAddress(), "host", "?"))
                return self._html(request, self._login_page(request, "that key is not one of admin.keys"))
            log.info("admin page: {who} signed in from {peer}", who=who, peer=getattr(request.getClientAddress(), "host", "?"))
            return self._redirect(request, pages.url(self.base, ""))
        if operator is None:
            return self._plain(request, http.UNAUTHORIZED, "sign in first: " + self._why_sign_in())
        if name == b"logout":
            self.guard.logout(request)
            return self._redirect(request, pages.url(self.base, ""))
        if name != b"action":
            return self._plain(request, http.NOT_FOUND, "no such form")
        self._async(request, self._act(request, form, operator))
        return server.NOT_DONE_YET

    async def _act(self, request, form: dict[str, str], operator: Operator):
        verb, node_id = form.get("action"), form.get("node") or ""
        if verb not in pages.VERBS:
            raise BadQuery(f"action is one of {', '.join(pages.VERBS)}")
        node = self._find_node(node_id)
        log.info("admin page: {who} asked to {verb} {node}", who=operator.name, verb=verb, node=node.id)
        try:
            answer = await self.source.act(verb, node.id)
        except SourceError as e:
            request.setResponseCode(http.BAD_GATEWAY)
            return pages.message_page(self.base, operator, f"{verb} {node.id} failed", str(e),
                                      pages.url(self.base, "node", id=node.id))
        stopped = answer.stopped if isinstance(answer, DrainAnswer) else None
        if stopped:
            log.info("admin page: {verb} {node} stopped {shards}", verb=verb, node=node.id,
                     shards=", ".join(map(str, stopped))[:500])
        # The page it lands on says a fixed message for this verb; the URL carries no words of ours or anyone's.
        return self._redirect(request, pages.url(self.base, "node", id=node.id, done=verb))

    @staticmethod
    async def _asked(coroutine) -> tuple:
        """(the answer, None), or (None, the control plane's words): a section says so, the page still shows."""
        try:
            return await coroutine, None
        except SourceError as e:
            return None, str(e)

    async def _cluster_figures(self, rows: int) -> Figures:
        """Each scope's series, at most ``admin.max_rows`` subjects' worth of each: a fleet of a thousand nodes
        is not a thousand nodes' hour of figures on every load of the page."""
        series, answer = [], None
        for scope in (Scope.MODEL, Scope.NODE, Scope.KEY):
            answer = await self.source.figures(scope, limit=min(rows * SERIES_PER_SUBJECT, PAGE_MOST))
            series += answer.series
        return attrs.evolve(answer, series=series)

    def _chart_heading(self, scope: Scope, subject: str):
        return pages.link(self.base, "node", subject, id=subject) if scope == Scope.NODE else subject

    def _why_sign_in(self) -> str:
        if self.trust_local:
            return "this address is not on admin.local"
        return "under /admin on the API listener everyone signs in (admin.local counts on listen.admin only)"

    def _login_page(self, request, error: str | None):
        return pages.login_page(self.base, self.guard.csrf_token(request), error, self._why_sign_in())

    # -- what a request asks for --

    def _node(self, request, key: bytes = b"id") -> NodeView:
        return self._find_node(_arg(request, key) or "")

    def _find_node(self, node_id: str) -> NodeView:
        if not node_id or len(node_id) > MAX_NAME_CHARS:
            raise BadQuery("name a node: ?id=NODE")
        for node in self.source.nodes():
            if node.id == node_id:
                return node
        raise LookupError(f"no node {node_id!r}: the cluster page lists those that have registered")

    def _replica(self, request) -> ReplicaView:
        wanted = _arg(request, b"id") or ""
        if not wanted or len(wanted) > MAX_NAME_CHARS:
            raise BadQuery("name a replica: ?id=MODEL/N")
        for replica in self.source.replicas():
            if replica.replica == wanted:
                return replica
        raise LookupError(f"no replica {wanted!r}: the cluster page lists the catalog's")

    def _lines(self, request) -> int:
        text = _arg(request, b"n")
        limit = self.settings.log_lines
        if text is None:
            return min(200, limit)
        if not text.isdigit() or not 0 < int(text) <= limit:
            raise BadQuery(f"n is a number of lines from 1 to {limit} (admin.log_lines)")
        return int(text)

    async def _fetch_logs(self, node_id: str, source: str | None, n: int) -> tuple[LogsAnswer, int]:
        """The log as the page shows it, and how many lines it cut: ``admin.log_bytes`` of its last lines at most."""
        if source is not None and len(source) > MAX_NAME_CHARS:
            raise BadQuery("source is a name from the node's list of log sources")
        answer = await self.source.logs(node_id, source, n)
        lines = answer.lines[-n:]
        kept, size = [], 0
        for line in reversed(lines):
            size += len(line.encode("utf-8", "replace")) + 1
            if size > self.settings.log_bytes:
                break
            kept.append(line)
        kept.reverse()
        sources = [s for s in answer.sources[:self.settings.max_rows] if len(s) <= MAX_NAME_CHARS]
        return LogsAnswer(node_id, answer.source or source or "", sources, kept), len(lines) - len(kept)

    async def _logs(self, node_id: str, source: str | None, n: int, follow: bool, page_name: str = "node",
                    page_id: str | None = None):
        answer, error = None, None
        try:
            answer, _ = await self._fetch_logs(node_id, source, n)
        except SourceError as e:
            error = str(e)
        return pages.logs_section(self.base, node_id, source, answer, error, follow, n, page_name, page_id)

    def _progress(self) -> dict:
        bars = {}
        for r in self.source.replicas():
            if pages.in_progress(r):
                p = r.progress
                bars[f"replica:{r.replica}"] = {
                    "done": p.bytes_done if p else None, "total": p.bytes_total if p else None,
                    "words": pages.download_words(p) or r.reason or "-"}
        for node in self.source.nodes():
            for e in pages.installing(node):
                bars[pages.engine_key(node, e)] = {"done": None, "total": None, "words": "installing"}
        return {"bars": bars}

    def misdirected(self, request) -> hosts.Misdirected | None:
        """None for a request that names this server (``admin.hosts`` or an address); else what to answer.

        For what answers everyone who reaches the listener (``/metrics``): a
        page that rebinds its name here must not read it through a browser.
        """
        return self.guard.names.refusal(request)

    def _misdirected_local(self, request) -> hosts.Misdirected | None:
        """A peer the page would trust without a key, asking for a name that is not this server's: 421."""
        peer = getattr(request.getClientAddress(), "host", None)
        if not (self.trust_local and self.guard.is_local(peer)):
            return None  # it signs in: a browser sends a session cookie only to the name that set it
        return self.misdirected(request)

    # -- answers --

    def _async(self, request, coroutine) -> None:
        finished = []
        request.notifyFinish().addBoth(finished.append)

        def write(result):
            if finished:
                return
            if isinstance(result, bytes):
                request.write(result)
                request.finish()
                return
            return self._flatten(request, result)

        def failed(failure):
            if finished:
                return
            e = failure.value
            if failure.check(BadQuery):
                code, words = http.BAD_REQUEST, str(e)
            elif failure.check(LookupError):
                code, words = http.NOT_FOUND, e.args[0] if e.args else "no such page"
            elif failure.check(SourceError):
                code, words = http.BAD_GATEWAY, str(e)
            else:
                log.failure("admin page: {path} failed", failure, path=request.uri[:200])
                code, words = http.INTERNAL_SERVER_ERROR, "the admin page failed; the server's log says why"
            request.setResponseCode(code)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            request.write(words.encode("utf-8", "replace") + b"\n")
            request.finish()

        defer.Deferred.fromCoroutine(coroutine).addCallback(write).addErrback(failed)

    def _flatten(self, request, tag):
        def done(body):
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            request.write(b"<!DOCTYPE html>\n" + body)
            request.finish()

        return flattenString(None, tag).addCallback(done)

    def _html(self, request, tag):
        self._async(request, _value(tag))
        return server.NOT_DONE_YET

    def _plain(self, request, code: int, words: str) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return words.encode() + b"\n"

    def _redirect(self, request, to: str):
        request.setResponseCode(http.SEE_OTHER)
        request.setHeader(b"location", to.encode())
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return f"see {to}\n".encode()

    def _static(self, request, name: bytes) -> bytes:
        request.setHeader(b"content-type", STATIC[name].encode())
        request.setHeader(b"cache-control", b"no-cache")
        return resources.files("llmgw.admin").joinpath("static", name.decode()).read_bytes()


async def _value(value):
    return value


def _arg(request, key: bytes) -> str | None:
    values = (request.args or {}).get(key)
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise BadQuery(f"{key.decode()} is not UTF-8") from None


def _json(request, value) -> bytes:
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(value).encode()


def _form(request) -> dict[str, str] | None:
    """The posted form's fields (first value of each), or None when it is larger than a form of the page's."""
    content = request.content
    content.seek(0, 2)
    if content.tell() > MAX_FORM_BYTES:
        return None
    content.seek(0)
    try:
        fields = parse_qs(content.read().decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=16)
    except ValueError:
        return None
    return {k: v[0] for k, v in fields.items()}

"""What the three processes share: a --config option, the file read once, SIGHUP, listeners that must listen, and descriptors.

Descriptors: a process raises its soft open-files limit to the hard one at
start (``raise_open_files_limit``), and a listener may be given a budget of
connections (``ConnectionBudget``) so that one listener's clients cannot
take the descriptors another's need: API clients never lock agents out of
the hub.
"""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable
from typing import Any

import attrs
from twisted.application import internet, service
from twisted.internet import error
from twisted.logger import Logger
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.protocols import policies
from twisted.python import usage
from zope.interface import implementer

from llmgw.errors import LlmgwError
from llmgw.process.sending import EagerWrites

log = Logger()


def config_options(default: str, what: str) -> type[usage.Options]:
    """twistd's options for a process that reads one configuration file."""

    class Options(usage.Options):
        optParameters = [["config", "c", default, what]]

    return Options


def compose(
    name: str,
    options: usage.Options,
    load: Callable[[str], Any],
    build: Callable[[Any, Any], service.MultiService],
    on_sighup: Callable[[service.MultiService], Callable[[], object]] | None = None,
) -> service.MultiService:
    """Load the configuration and build the process's tree; a file that is wrong ends twistd with its message.

    *on_sighup*, given the tree, names what SIGHUP runs (on the reactor's thread).
    """
    from twisted.internet import reactor

    files = raise_open_files_limit()
    raised = f"raised from {files.before}; " if files.soft > files.before else ""
    log.info("{name}: open-files limit {soft} ({raised}hard {hard})", name=name, soft=files.soft, raised=raised,
             hard=files.hard)
    try:
        config = load(options["config"])
        top = build(reactor, config)
    except LlmgwError as e:
        # twistd prints it and exits non-zero, without a traceback to read past.
        raise SystemExit(f"{name}: {e}") from None
    if isinstance(top, ProcessTree):
        parent = getattr(options, "parent", None)
        top.pidfile = parent.get("pidfile") if parent is not None else None
    if on_sighup is not None:
        hup = on_sighup(top)
        signal.signal(signal.SIGHUP, lambda *_: reactor.callFromThread(hup))
    return top


class CannotListen(LlmgwError):
    """A listener of the process could not listen; the process does not run without it."""


class ProcessTree(service.MultiService):
    """A process's top service: it ends the process if one of its listeners cannot listen.

    Without this, twistd logs the failure and runs on without the port, and
    whatever else holds it answers in the process's place.
    """

    def __init__(self, name: str, config_path: str):
        super().__init__()
        self.name = name
        self.config_path = config_path
        self.pidfile: str | None = None

    def must_listen(self, key: str, holder: service.IService, budget: ConnectionBudget | None = None) -> None:
        """*holder* (a listener, or a service holding one) listens where the configuration's *key* says.

        With *budget* (a ``ConnectionBudget`` not yet wrapping anything), the
        listener holds no more connections than it allows.
        """
        listener = _listener_in(holder)
        listener.endpoint = _Named(listener.endpoint, key, self.config_path)
        if budget is not None:
            budget.wrap(listener.factory)
            listener.factory = budget
            listener.endpoint = _Paced(listener.endpoint, budget)
        # Endpoints listen at once, in privilegedStartService, so the failure
        # comes back before twistd starts the reactor.
        listener._raiseSynchronously = True

    def privilegedStartService(self):
        try:
            super().privilegedStartService()
        except CannotListen as e:
            log.critical("{why}", why=str(e))
            # twistd leaves its pidfile behind when startup raises SystemExit.
            if self.pidfile:
                try:
                    os.unlink(self.pidfile)
                except OSError:
                    pass
            raise SystemExit(f"{self.name}: {e}") from None


def _listener_in(holder: service.IService) -> internet.StreamServerEndpointService:
    if isinstance(holder, internet.StreamServerEndpointService):
        return holder
    found = [s for s in holder if isinstance(s, internet.StreamServerEndpointService)]
    if len(found) != 1:
        raise TypeError(f"{holder!r} holds {len(found)} listeners, expected one")
    return found[0]


@implementer(IStreamServerEndpoint)
class _Named:
    """An endpoint whose listen failure names the address and the configuration key."""

    def __init__(self, inner, key: str, config_path: str):
        self._inner = inner
        self._key = key
        self._config_path = config_path

    def listen(self, factory):
        return self._inner.listen(factory).addErrback(self._refuse)

    def _refuse(self, failure):
        failure.trap(error.CannotListenError)
        raise CannotListen(cannot_listen(failure.value, self._key, self._config_path)) from None


class _Paced:
    """An endpoint that hands the port it listens on to its ``ConnectionBudget`` (which pauses it)."""

    def __init__(self, inner, budget: ConnectionBudget):
        self._inner = inner
        self._budget = budget

    def listen(self, factory):
        return self._inner.listen(factory).addCallback(self._budget.listening)


def cannot_listen(e: error.CannotListenError, key: str, config_path: str) -> str:
    """The sentence: "cannot listen on 127.0.0.1:7443 (listen.link): address already in use; ..."."""
    if e.interface is None:  # a unix socket: the port is its path
        where = str(e.port)
    else:
        where = f"{e.interface or '*'}:{e.port}"
    cause = e.socketError
    why = (getattr(cause, "strerror", None) or str(cause) or "refused").lower()
    return (
        f"cannot listen on {where} ({key}): {why}; stop what holds it "
        f"or change {key} in {config_path}"
    )


# Descriptors a server keeps for what is not a client connection: its log,
# state files, engines' pipes, the admin listener, outgoing engine connections.
RESERVED_FDS = 128


@attrs.frozen
class OpenFiles:
    """The process's open-files limit at start: ``before`` it was raised, ``soft`` now, and ``hard``."""

    before: int
    soft: int
    hard: int


def raise_open_files_limit() -> OpenFiles:
    """Raise the soft RLIMIT_NOFILE to the hard limit (an unlimited hard limit counts as 1048576)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1048576 if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            log.warn("could not raise the open-files limit from {soft} to {target}: {e}", soft=soft, target=target, e=e)
            target = soft
    return OpenFiles(soft, max(soft, target), hard)


@attrs.frozen
class Budgets:
    """How many connections each of the server's listeners may hold."""

    link: int
    api: int


def split_open_files(soft: int, link_max: int) -> Budgets:
    """The link keeps *link_max*; the API gets what is left after ``RESERVED_FDS``.

    When the limit is too low for that (the API would get under a quarter),
    the two share what there is, half each: agents still have their own.
    """
    spare = max(soft - RESERVED_FDS, 2)
    if spare - link_max >= spare // 4:
        return Budgets(link_max, spare - link_max)
    link = max(min(link_max, spare // 2), 1)
    return Budgets(link, max(spare - link, 1))


class ConnectionBudget(policies.WrappingFactory):
    """A listener's factory holding at most *limit* connections; one more is closed as it is accepted.

    The first refusal of a run is logged with the peer and the limit, and
    the run's count when a connection is taken again; ``refused`` counts them all.

    With *max_pending*, it also paces arrivals: a connection is pending from
    its accept until ``admit`` is told its handshakes are done (the hub, at
    WELCOME) or it closes, and while *max_pending* are pending the port stops
    accepting.  A fleet reconnecting all at once (after a server restart) then
    waits in the kernel's queue and is served a few dozen at a time, each
    handshake finishing in well under a second, instead of ten thousand
    handshakes shared out so thinly that most outlast ``hello_timeout_s``, are
    cut off, and come back to do it again.  The port accepts in batches, so
    one batch may overshoot the bound by what the kernel had queued.

    Each connection sends what it is given at once when nothing waits
    before it (``EagerWrites``).
    """

    protocol = EagerWrites

    def __init__(self, limit: int, key: str, max_pending: int | None = None):
        self.limit = limit
        self.key = key
        self.refused = 0
        self._run = 0
        self.protocols = {}
        self.max_pending = max_pending
        self.pending: set = set()
        self.port = None
        self.paused = 0  # how many times arrivals were paused
        self._paused = False

    def wrap(self, factory) -> None:
        policies.WrappingFactory.__init__(self, factory)

    @property
    def held(self) -> int:
        return len(self.protocols)

    def listening(self, port):
        """The port this factory's endpoint listens on (what is paused); returns it, for a Deferred's callback."""
        self.port = port
        self._pace()
        return port

    def buildProtocol(self, addr):
        if len(self.protocols) >= self.limit:
            self.refused += 1
            self._run += 1
            if self._run == 1:
                log.warn(
                    "{key}: refused a connection from {peer}: {n} are open, the most it holds; "
                    "raise the limit (and LimitNOFILE) if this is load, not a flood",
                    key=self.key, peer=f"{getattr(addr, 'host', addr)}:{getattr(addr, 'port', '')}", n=self.limit,
                )
            return None  # the port closes the socket at once
        if self._run:
            log.info("{key}: taking connections again; refused {n} while full", key=self.key, n=self._run)
            self._run = 0
        protocol = policies.WrappingFactory.buildProtocol(self, addr)
        if self.max_pending:
            self.pending.add(protocol)
            self._pace()
        return protocol

    def unregisterProtocol(self, p) -> None:
        policies.WrappingFactory.unregisterProtocol(self, p)
        if p in self.pending:
            self.pending.discard(p)
            self._pace()

    def admit(self, transport) -> None:
        """The connection under *transport* (or under what it wraps) finished its handshakes."""
        seen = 0
        while transport is not None and seen < 8:
            if transport in self.pending:
                self.pending.discard(transport)
                self._pace()
                return
            transport = getattr(transport, "transport", None)
            seen += 1

    def _pace(self) -> None:
        if self.port is None or not self.max_pending:
            return
        full = len(self.pending) >= self.max_pending
        if full and not self._paused:
            self._paused = True
            self.paused += 1
            self.port.stopReading()
        elif not full and self._paused:
            self._paused = False
            self.port.startReading()

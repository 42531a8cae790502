"""What the three processes share: a --config option, the file read once, SIGHUP, and listeners that must listen."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from twisted.application import internet, service
from twisted.internet import error
from twisted.logger import Logger
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.python import usage
from zope.interface import implementer

from llmgw.errors import LlmgwError

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

    def must_listen(self, key: str, holder: service.IService) -> None:
        """*holder* (a listener, or a service holding one) listens where the configuration's *key* says."""
        listener = _listener_in(holder)
        listener.endpoint = _Named(listener.endpoint, key, self.config_path)
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

"""What the three processes share: a --config option, the file read once, and SIGHUP."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.python import usage

from llmgw.errors import LlmgwError


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
    if on_sighup is not None:
        hup = on_sighup(top)
        signal.signal(signal.SIGHUP, lambda *_: reactor.callFromThread(hup))
    return top

"""`llmgw-tui`: the same connection settings as `llmgw ctl`, then the dashboard.

One event loop runs everything: Twisted's asyncio reactor is installed on a
fresh asyncio loop before anything imports a reactor, the link code is
``llmgw ctl``'s (autobahn.twisted), and Textual runs on the same loop.
Before the screen is taken over, one session checks that the hub accepts
this certificate as an operator's, so a wrong file is a sentence on stderr
and an exit code, not a dashboard that never fills.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from llmgw import __version__
from llmgw.errors import HubUnreachable, LlmgwError, Refused


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw-tui",
        description="the fleet's terminal dashboard: nodes, replicas, logs (press ? inside for the keys)",
        epilog="Settings come from the flags, then LLMGW_HUB/LLMGW_CA/LLMGW_CERT/LLMGW_KEY, "
        "then ~/.config/llmgw/ctl.yaml, as for `llmgw ctl`.",
    )
    parser.add_argument("--version", action="version", version=f"llmgw-tui {__version__}")
    parser.add_argument("--hub", help="the hub's URL, wss://HOST:PORT/ (or LLMGW_HUB)")
    parser.add_argument("--ca", help="the cluster CA certificate (or LLMGW_CA)")
    parser.add_argument("--cert", help="an operator certificate (or LLMGW_CERT)")
    parser.add_argument("--key", help="the operator certificate's key (or LLMGW_KEY)")
    parser.add_argument("--config", help="settings file (default ~/.config/llmgw/ctl.yaml)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the hub at start (default 10)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except LlmgwError as e:
        print(f"llmgw-tui: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def run(args: argparse.Namespace) -> int:
    from llmgw.ctl.main import fewer_collections, settings
    from llmgw.huburl import parse_hub_url
    from llmgw.tui.backend import install_reactor

    fewer_collections()
    given = settings(args, "llmgw-tui")
    hub = parse_hub_url(given.hub)
    tls = given.tls
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    reactor = install_reactor(loop)

    async def dashboard(reactor) -> int:
        from twisted.internet.defer import Deferred

        from llmgw.tui.app import DashboardApp
        from llmgw.tui.backend import WampBackend

        await check_operator(reactor, hub, tls, args.timeout)
        app = DashboardApp(WampBackend(reactor, hub, tls))
        await Deferred.fromFuture(asyncio.ensure_future(app.run_async(), loop=loop))
        return app.return_code or 0

    return _react(reactor, dashboard)


async def check_operator(reactor, hub, tls, timeout: float) -> None:
    """Open one session and read a page of one node, as the dashboard will read them all; say why not in words.

    One node is enough to know the hub lets this certificate read the
    fleet; the whole list, at 10,000 nodes, is near the link's 16 MiB.
    """
    from autobahn.wamp.exception import ApplicationError

    from llmgw.link import uris
    from llmgw.link.client import connect_once

    session = await connect_once(reactor, hub, tls, timeout=timeout)
    try:
        await session.call(uris.CP_NODES, limit=1)
    except ApplicationError as e:
        message = e.args[0] if e.args else e.error
        if e.error == uris.ERROR_NOT_AUTHORIZED:
            raise Refused(
                f"the hub does not let {tls.cert} read the fleet ({message}); "
                "llmgw-tui needs an operator certificate (llmgw pki issue DIR --role operator NAME)"
            ) from None
        raise Refused(message) from None
    except Exception as e:
        raise HubUnreachable(f"the hub at {hub.url} did not answer: {e or type(e).__name__}") from None
    finally:
        session.leave()


def _react(reactor, main) -> int:
    """Run *main(reactor)* on the reactor (and so on its asyncio loop); return its exit code."""
    from llmgw.ctl.main import react

    return react(main, reactor)

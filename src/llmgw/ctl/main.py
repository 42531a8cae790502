"""`llmgw ctl`: the fleet's facts for scripts and terminals.

Connection settings come before the subcommand (``llmgw ctl --hub … nodes``),
from ``LLMGW_HUB``/``LLMGW_CA``/``LLMGW_CERT``/``LLMGW_KEY``, or from
``~/.config/llmgw/ctl.yaml``, in that order.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

import attrs

from llmgw import render
from llmgw.answers import CordonAnswer, DrainAnswer, LogsAnswer, ReloadAnswer, WeightsAnswer
from llmgw.ctl import tables
from llmgw.errors import LlmgwError, Refused
from llmgw.link import uris
from llmgw.text import printable
from llmgw.views import FleetStatus, NodeBrief, NodeView, ReplicaView, node_pages
from llmgw.wire import WireError, from_wire, to_wire


FOLLOW_POLL_S = 2.0
FOLLOW_WINDOW = 500
# The collector's thresholds in ctl's and the dashboard's processes.  Both
# hold every node's view while they read the list; at the default first
# threshold (700 new objects) decoding 10,000 nodes walks that growing heap
# again and again, which was more than half of a snapshot's time.  Garbage
# is still collected, a collection per 10,000 new objects (at 50,000, the
# rarer full collections of that heap landed in keystrokes, 200 ms each).
GC_THRESHOLDS = (10_000, 10, 10)


#: Where `make run` writes the settings of the cluster it starts, from the checkout it runs in.
DEV_SETTINGS = "run/ctl.yaml"


def settings(args: argparse.Namespace, program: str, rest: str = ""):
    """The connection settings from *args* (``--hub``... ``--config``), the environment and ctl.yaml.

    Where none of them gives them but this directory holds what `make run`
    wrote, the error says to give that file: ``PROGRAM --config run/ctl.yaml REST``.
    """
    import os

    from llmgw.config.ctl import default_ctl_config_path, resolve_ctl_settings
    from llmgw.errors import ConfigError

    try:
        return resolve_ctl_settings(hub=args.hub, ca=args.ca, cert=args.cert, key=args.key, config_path=args.config)
    except ConfigError as e:
        if args.config is None and not os.path.exists(default_ctl_config_path()) and os.path.isfile(DEV_SETTINGS):
            again = " ".join(filter(None, (program, "--config", DEV_SETTINGS, rest)))
            raise ConfigError(f"{e}; `make run` wrote {DEV_SETTINGS} here: {again}") from None
        raise


def fewer_collections() -> None:
    """Set ``GC_THRESHOLDS`` for this process (ctl's, the dashboard's: never the server's)."""
    gc.set_threshold(*GC_THRESHOLDS)


def add_parser(subparsers) -> None:
    ctl = subparsers.add_parser("ctl", help="query and steer the fleet through the hub")
    ctl.add_argument("--hub", help="the hub's URL, wss://HOST:PORT/ (or LLMGW_HUB)")
    ctl.add_argument("--ca", help="the cluster CA certificate (or LLMGW_CA)")
    ctl.add_argument("--cert", help="an operator certificate (or LLMGW_CERT)")
    ctl.add_argument("--key", help="the operator certificate's key (or LLMGW_KEY)")
    ctl.add_argument("--config", help="settings file (default ~/.config/llmgw/ctl.yaml)")
    ctl.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the hub (default 5)")
    sub = ctl.add_subparsers(dest="ctl_command", required=True, metavar="COMMAND")

    nodes = sub.add_parser("nodes", help="list the nodes and what they reported")
    nodes.add_argument("--json", action="store_true", help="print a JSON list of objects")
    nodes.add_argument("--state", help="only nodes in this state: ready, unreachable or lost")
    nodes.add_argument("--label", help="only nodes with this label, KEY=VALUE (gpu=h100)")
    nodes.add_argument("--limit", type=int, help="at most this many nodes (a page, in id order)")
    nodes.add_argument("--after", metavar="NODE", help="start after this node id: the last id of the page before")
    nodes.add_argument("--brief", action="store_true",
                       help="with --json: each node as the table shows it (GPUs and disks summed), not its whole view")
    nodes.set_defaults(func=_run(cmd_nodes))

    replicas = sub.add_parser("replicas", help="list replicas: state, nodes, endpoint, stale flag, reason")
    replicas.add_argument("--json", action="store_true", help="print a JSON list of objects")
    replicas.set_defaults(func=_run(cmd_replicas))

    status = sub.add_parser("status", help="per model: desired against ready")
    status.add_argument("--json", action="store_true", help="print a JSON object")
    status.set_defaults(func=_run(cmd_status))

    for verb, help_text in (
        ("drain", "cordon a node and stop its replicas, which are placed elsewhere"),
        ("cordon", "place nothing new on a node (what runs there stays)"),
        ("uncordon", "let placement use a node again"),
    ):
        command = sub.add_parser(verb, help=help_text)
        command.add_argument("node", metavar="NODE")
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        command.set_defaults(func=_run(_node_verb(verb)))

    logs = sub.add_parser("logs", help="a node's own log, or one of its engines' (--source)")
    logs.add_argument("node", metavar="NODE")
    logs.add_argument("--source", help="a shard id from the node's sources (default: the agent's own log)")
    logs.add_argument("-n", type=int, default=200, help="how many of the last lines (default 200)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    logs.add_argument("--json", action="store_true", help="print the answer as JSON (not with -f)")
    logs.set_defaults(func=_run(cmd_logs))

    weights = sub.add_parser("weights", help="weights llmgw fetched that the catalog no longer wants")
    weights.add_argument("--collect", action="store_true", help="ask the nodes to remove them (each node checks every path)")
    weights.add_argument("--json", action="store_true", help="print the answer as JSON")
    weights.set_defaults(func=_run(cmd_weights))

    reload = sub.add_parser("reload", help="read server.yaml again (as SIGHUP does); a broken file changes nothing")
    reload.add_argument("--json", action="store_true", help="print the result as JSON")
    reload.set_defaults(func=_run(cmd_reload))

    from llmgw.ctl import events, onboard, scale

    events.add_parser(sub, _run)
    scale.add_parser(sub, _run)
    onboard.add_parsers(sub, _run)

    from llmgw.ctl import top

    top.add_parser(sub, _run)


def _run(command):
    """Wrap an async command so it runs once on the reactor with a session to the hub."""

    def run(args: argparse.Namespace) -> int:
        from autobahn.wamp.exception import ApplicationError

        fewer_collections()

        from llmgw.huburl import parse_hub_url
        from llmgw.link.client import connect_once

        given = settings(args, "llmgw ctl", getattr(args, "ctl_command", None) or "")
        hub = parse_hub_url(given.hub)
        tls = given.tls

        async def main(reactor):
            session = await connect_once(reactor, hub, tls, timeout=args.timeout)
            try:
                return await command(session, args)
            except ApplicationError as e:
                # A person reads the sentence; the URI is the link's, not theirs.
                raise Refused(printable(e.args[0] if e.args and e.args[0] else f"the hub refused ({e.error})")) \
                    from None
            finally:
                session.leave()

        return react(main)

    return run


def react(main, reactor=None) -> int:
    """Run *main(reactor)* to completion and return its exit code, re-raising its error.

    The TUI passes the asyncio reactor it installed; ctl uses the default one.
    """
    from twisted.internet import defer

    if reactor is None:
        from twisted.internet import reactor

    outcome: dict = {}

    def start():
        d = defer.ensureDeferred(main(reactor))

        def done(result):
            outcome["result"] = result
            # Let the GOODBYE go out before the reactor stops.
            reactor.callLater(0.05, reactor.stop)

        d.addBoth(done)

    reactor.callWhenRunning(start)
    reactor.run(installSignalHandlers=False)
    result = outcome.get("result")
    if hasattr(result, "raiseException"):
        result.raiseException()
    return result or 0


def _print(args, result, text) -> int:
    """*result* as JSON (every character outside ASCII written as ``\\u…``) or as *text* made it.

    *text* escapes each word a node sent where it places it (``render.said``);
    what it lays out itself is lines, so nothing else that reaches the
    terminal is a control character.
    """
    if args.json:
        json.dump(to_wire(result), sys.stdout, indent=2)
        print()
    else:
        print(printable(text(result), keep="\n"))
    return 0


def decode(kind, answer, uri: str):
    """The control plane's answer as its record (``llmgw.views``, ``llmgw.answers``); see docs/link.rst.

    Keys this ctl does not know (a newer server's) are dropped and keys an
    older server did not send are None, so ``--json`` prints the same keys
    whichever server answered.
    """
    try:
        return from_wire(kind, answer)
    except WireError as e:
        raise LlmgwError(f"{uri} answered something this ctl cannot read ({printable(str(e))}); is the server a "
                         "much older or newer llmgw?") from None


async def cmd_nodes(session, args) -> int:
    """The table reads each node's brief (``NodeBrief``), a third of the bytes; ``--json`` the whole view unless ``--brief``."""
    from autobahn.wamp.exception import ApplicationError

    query = {k: v for k, v in (("state", args.state), ("label", args.label)) if v is not None}
    brief = args.brief or not args.json

    async def fetch(after, limit):
        return await session.call(uris.CP_NODES, **query, **({"after": after} if after is not None else {}),
                                  limit=limit, **({"brief": True} if brief else {}))

    async def listing():
        if args.limit is not None:
            return await fetch(args.after, args.limit)
        if args.after is not None:
            return await node_pages(lambda after, limit: fetch(after or args.after, limit))
        return await node_pages(fetch)

    try:
        answer = await listing()
    except ApplicationError as e:
        # An older server's hub answered an unknown keyword as a runtime error; a newer one as invalid_argument.
        if not brief or e.error not in (uris.ERROR_RUNTIME, uris.ERROR_INVALID_ARGUMENT):
            raise
        # A server older than briefs takes no ``brief``: its whole views, made brief here.
        brief = False
        views = [NodeBrief.of(v) for v in decode(list[NodeView], await listing(), uris.CP_NODES)]
    else:
        views = decode(list[NodeBrief] if brief else list[NodeView], answer, uris.CP_NODES)
    if args.limit is not None and len(views) == args.limit and views:
        print(f"(at most {args.limit}; the next page: --after {printable(views[-1].id)})", file=sys.stderr)
    return _print(args, views, tables.nodes_table)


async def cmd_replicas(session, args) -> int:
    views = decode(list[ReplicaView], await session.call(uris.CP_REPLICAS), uris.CP_REPLICAS)
    return _print(args, views, tables.replicas_table)


async def cmd_status(session, args) -> int:
    return _print(args, decode(FleetStatus, await session.call(uris.CP_STATUS), uris.CP_STATUS), tables.status_text)


#: What each node verb answers: a drain says which shards it asked to stop.
NODE_VERBS = {"cordon": (uris.CP_CORDON, CordonAnswer), "uncordon": (uris.CP_UNCORDON, CordonAnswer),
              "drain": (uris.CP_DRAIN, DrainAnswer)}


def _node_verb(verb: str):
    uri, kind = NODE_VERBS[verb]

    async def command(session, args) -> int:
        return _print(args, decode(kind, await session.call(uri, args.node), uri), render.node_verb_text)

    return command


async def cmd_logs(session, args) -> int:
    async def read(n: int) -> LogsAnswer:
        return decode(LogsAnswer, await session.call(uris.CP_LOGS, args.node, args.source, n), uris.CP_LOGS)

    if not args.follow:
        return _print(args, await read(args.n), tables.logs_text)
    from twisted.internet import reactor, task

    # Every poll reads the same window, wider than -n, so the seam between
    # two reads is found even when more was written than -n lines.
    window = max(args.n, FOLLOW_WINDOW)
    answer = await read(window)
    seen = answer.lines
    print(tables.logs_text(attrs.evolve(answer, lines=seen[len(seen) - min(args.n, len(seen)):])), flush=True)
    while True:
        await task.deferLater(reactor, FOLLOW_POLL_S, lambda: None)
        answer = await read(window)
        fresh = render.new_lines(seen, answer.lines)
        if fresh:
            print("\n".join(render.log_lines(fresh)), flush=True)
        seen = answer.lines


async def cmd_weights(session, args) -> int:
    answer = decode(WeightsAnswer, await session.call(uris.CP_WEIGHTS, args.collect), uris.CP_WEIGHTS)
    return _print(args, answer, tables.weights_text)


async def cmd_reload(session, args) -> int:
    answer = decode(ReloadAnswer, await session.call(uris.CP_RELOAD), uris.CP_RELOAD)
    return _print(args, answer, tables.reload_text)

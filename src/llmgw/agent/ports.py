"""The ports this agent gives the engines it starts: from agent.yaml's ``engine_ports``, never from bind(0).

bind(0) hands out a port of the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``: the first and last port, both
included), the range the kernel also takes the local end of every outgoing
connection from.  Between the agent choosing such a port and its engine
binding it, any connection on the node (a probe, the agent dialling the hub)
can take it, and the engine fails "address already in use".  So the ports
come from a range of their own, outside the ephemeral one unless the node
reserves them (``ip_local_reserved_ports``, which the kernel never hands out
itself); one is drawn at random, passing over those this agent's engines
hold and those found bound.  Another process can still bind the port first
(a second agent on the node, a service that starts): the supervisor then
starts the engine again on another port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from llmgw.config.agent import DEFAULT_ENGINE_PORTS, parse_port_range

DEFAULT_RANGE = parse_port_range(DEFAULT_ENGINE_PORTS)
# Linux's own default, where /proc cannot be read.
_EPHEMERAL_DEFAULT = range(32768, 61000)
_PROC = Path("/proc/sys/net/ipv4")
# Draws before the range is called full; far more than the ports a node's engines hold.
DRAWS = 1000

_draw = random.Random()


def ephemeral_ports(proc: Path = _PROC) -> range:
    """The ports the kernel picks for bind(0) and outgoing connections."""
    try:
        first, last = (int(n) for n in (proc / "ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return range(first, last + 1)


def reserved_ports(proc: Path = _PROC) -> set[int]:
    """The ports ``ip_local_reserved_ports`` keeps the kernel from handing out (``8000-8999,20000``)."""
    try:
        text = (proc / "ip_local_reserved_ports").read_text().strip()
    except OSError:
        return set()
    reserved: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        try:
            reserved.update(range(int(first), int(last or first) + 1))
        except ValueError:
            return set()
    return reserved


def overlap(ports: range, proc: Path = _PROC) -> str | None:
    """What an operator is told when some of *ports* are ephemeral and not reserved; None when none are."""
    ephemeral = ephemeral_ports(proc)
    shared = set(range(max(ports.start, ephemeral.start), min(ports.stop, ephemeral.stop))) - reserved_ports(proc)
    if not shared:
        return None
    return (f"{len(shared)} of engine_ports {_span(ports)} (agent.yaml) are in the kernel's ephemeral range "
            f"{_span(ephemeral)} (net.ipv4.ip_local_port_range), where an outgoing connection can take an engine's "
            f"port before the engine binds it; move engine_ports below {ephemeral.start}, or reserve them with "
            "net.ipv4.ip_local_reserved_ports")


def port_in_use(host: str, port: int) -> bool:
    """Some socket holds *port* on *host* now: a listener, or a connection's local end bound without SO_REUSEADDR.

    A port left in TIME_WAIT counts as free (SO_REUSEADDR, as the engines'
    own servers bind it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def unbound_port(host: str, ports: range = DEFAULT_RANGE, skip: frozenset[int] | set[int] = frozenset(),
                 draw: random.Random = _draw) -> int:
    """A port of *ports* that is not in *skip* and that nothing is bound to on *host* now."""
    for _ in range(DRAWS):
        port = draw.choice(ports)
        if port not in skip and not port_in_use(host, port):
            return port
    raise OSError(f"no free port in engine_ports {_span(ports)} (agent.yaml) after {DRAWS:,} draws, "
                  f"{len(skip)} of them held by this node's engines; widen engine_ports")


def rendezvous_port(host: str, default: int | None, ports: range = DEFAULT_RANGE,
                    skip: frozenset[int] | set[int] = frozenset()) -> int:
    """The port rank 0 of a multi-node replica is met at: the engine's own default while it is free, else one of *ports*.

    The default keeps ranks whose leader names no port (an older control
    plane) finding rank 0; a second replica led from this node gets another.
    A port left in TIME_WAIT by the replica's previous rank 0 counts as free:
    a replica started again at once keeps its port.
    """
    if default is not None and default not in skip and not port_in_use(host, default):
        return default
    return unbound_port(host, ports, skip)


def _span(ports: range) -> str:
    return f"{ports.start}-{ports.stop - 1}"

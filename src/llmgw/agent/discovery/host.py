"""Who and where this node is: its id, its address on the route to the hub, its OS."""

from __future__ import annotations

import errno
import platform
import socket

from twisted.logger import Logger

log = Logger()

# The freedesktop locations, in the order os-release(5) says to look.
OS_RELEASE_PATHS = ("/etc/os-release", "/usr/lib/os-release")


def node_id(override: str | None = None) -> str:
    """The node's id: what agent.yaml says, else the hostname the kernel reports.

    The hostname is also the common name on the node's certificate, so it is taken
    as the kernel has it rather than resolved to a fully qualified name.
    """
    return override or hostname()


def hostname() -> str:
    return socket.gethostname()


def route_address(hub_host: str, hub_port: int) -> str | None:
    """The local address the kernel would use to reach the hub, or None.

    connect() on a UDP socket only picks a route and a source address; nothing is
    sent, so this works before the hub is up and through firewalls that drop
    probes.  Every address the name resolves to is tried in the order the resolver
    gives (IPv6 first where the system prefers it).
    """
    try:
        candidates = socket.getaddrinfo(hub_host, hub_port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as e:
        log.info("cannot resolve hub {hub}: {error}; address not reported",
                 hub=hub_host, error=e)
        return None
    for family, socktype, proto, _, sockaddr in candidates:
        try:
            with socket.socket(family, socktype, proto) as s:
                s.connect(sockaddr)
                address = s.getsockname()[0]
        except OSError as e:
            # ENETUNREACH for an IPv6 answer on an IPv4-only host is normal;
            # try the next address rather than give up.
            if e.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
                log.info("no route to hub {hub} via {addr}: {error}",
                         hub=hub_host, addr=sockaddr[0], error=e)
            continue
        if isinstance(address, str) and address not in ("0.0.0.0", "::"):
            return address
    return None


def os_name(paths: tuple[str, ...] = OS_RELEASE_PATHS) -> str | None:
    """PRETTY_NAME from os-release ("Ubuntu 24.04.1 LTS"), else what platform knows."""
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                fields = parse_os_release(f.read())
        except OSError:
            continue
        name = fields.get("PRETTY_NAME") or " ".join(
            filter(None, (fields.get("NAME"), fields.get("VERSION")))
        )
        if name:
            return name
    # Not Linux, or a minimal container without os-release.
    system = platform.system()
    return f"{system} {platform.release()}".strip() if system else None


def parse_os_release(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key] = value.replace('\\"', '"').replace("\\\\", "\\")
    return fields


def kernel() -> str | None:
    return platform.release() or None


def arch() -> str | None:
    return platform.machine() or None

"""agent.yaml: where the hub is and which TLS files prove this node's identity.

The file is meant to be the same on every node.  Everything a node can find
out about itself (its id, address, memory, GPUs) it discovers; the optional
keys here override discovery or say what cannot be discovered, such as which
InfiniBand fabric an adapter is cabled to.
"""

from __future__ import annotations

import os
import re

import attrs

from llmgw.config.common import HUB_URL, KNOWN_ENGINES, TLS
from yaml.nodes import ScalarNode, SequenceNode

from llmgw.config.schema import (NAME_STR, AbsPath, ListOf, Loader, MapOf, Nullable, Str, Type, check_name, section,
                                  suggest)
from llmgw.config.yamlpos import read_document
from llmgw.huburl import parse_hub_url
from llmgw.records import NAME as NAME_CHARS
from llmgw.setting import setting
from llmgw.tlsfiles import TLSFiles
from llmgw.wiretext import Text, refusal

DEFAULT_WEIGHTS_DIRS = ("/var/lib/llmgw-weights",)
DEFAULT_STATE_DIR = "/var/lib/llmgw"
# Below Linux's default ephemeral ports (32768-60999), so an outgoing
# connection never takes one between the agent choosing it and its engine
# binding it; and below the ports tests/support/net.py hands out.
# Below Linux's ephemeral range (32768-60999), where an outgoing connection can
# take a port before its engine binds it, and above Ray's default worker ports
# (10002-19999): a Ray worker node refuses a --node-manager-port among them.
DEFAULT_ENGINE_PORTS = "20000-29999"

# As /sys/class/infiniband names adapters: mlx5_0, hfi1_0, irdma0, efa_0.
_ADAPTER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _default_if_empty(dirs) -> tuple[str, ...]:
    """``weights_dirs: []`` (or null) is the default place, not nowhere.

    The agent fetches into the first entry whatever the list says, so an empty
    list left it fetching into the default while scanning and reporting none:
    fetched files were never listed and their disk never shown.
    """
    return tuple(dirs) or DEFAULT_WEIGHTS_DIRS


def parse_port_range(text: str) -> range:
    """``FIRST-LAST`` (both included) as a range; ValueError saying what is wrong."""
    first, dash, last = text.partition("-")
    if not dash or not first.strip().isdigit() or not last.strip().isdigit():
        raise ValueError("expected FIRST-LAST, such as 20000-29999")
    low, high = int(first), int(last)
    if not 1024 <= low <= high <= 65535:
        raise ValueError("the first port must be at least 1024, the last at most 65535 and not below the first")
    return range(low, high + 1)


def _check_port_range(text: str) -> None:
    parse_port_range(text)


def _check_adapter(text: str) -> None:
    if not _ADAPTER.fullmatch(text):
        raise ValueError(
            "not an InfiniBand adapter name; use the name under /sys/class/infiniband, "
            "such as mlx5_0"
        )


#: The most hubs agent.yaml's hub: may list: the servers of one cluster.
MOST_HUBS = 16


@attrs.frozen
class HubURLs(Type):
    """``hub:``: one hub URL, or a list of them (the servers of one cluster with ``ha:``), as a tuple in order."""

    what: str = "a hub URL like wss://HOST:PORT/, or a list of them"

    def convert(self, loader: Loader, node, path):
        if isinstance(node, ScalarNode):
            return (HUB_URL.convert(loader, node, path),)
        if not isinstance(node, SequenceNode):
            raise self.expected(loader, node, path)
        urls = ListOf(HUB_URL).convert(loader, node, path)
        if not urls:
            raise loader.fail(node, path, "the list of hubs is empty; give at least one, like 'wss://cp.example.org:7443/'")
        if len(urls) > MOST_HUBS:
            raise loader.fail(node, path, f"{len(urls)} hubs; at most {MOST_HUBS} (one per server of the cluster)")
        places = [(parse_hub_url(url).host.lower(), parse_hub_url(url).port) for url in urls]
        for i, place in enumerate(places):
            if place in places[:i]:
                raise loader.fail(node, path + (i,), f"{urls[i]!r} names the same host and port as "
                                  f"{urls[places.index(place)]!r}; list each server once")
        return urls


CONFIGURABLE_ENGINES = tuple(e for e in KNOWN_ENGINES if e != "sim")


def _check_label_value(text: str) -> None:
    """A label's value travels in the node's register as a name: refused here as the server would refuse it."""
    why = refusal(text, Text.NAME, NAME_CHARS)
    if why is not None:
        raise ValueError(f"{why} (the server refuses a node whose label says this)")


def _check_engine(text: str) -> None:
    if text == "sim":
        raise ValueError("sim runs in the agent's own Python; there is no path to configure")
    if text not in CONFIGURABLE_ENGINES:
        raise ValueError(
            f"not an engine llmgw knows; {suggest(text, CONFIGURABLE_ENGINES)}"
            f"use one of {', '.join(CONFIGURABLE_ENGINES)}"
        )


@attrs.frozen
class EngineOverride:
    """``engines.NAME`` in agent.yaml: run this engine from *path* instead of finding it.

    For llama.cpp and vLLM *path* is the binary; for SGLang, the Python that
    can import it.  The agent probes it as it would what it found, and does
    not fall back to PATH when it fails: the operator said which one to run.
    """

    name: str
    path: str = setting(kind=AbsPath())


@attrs.frozen
class InstallLimits:
    """``installs:`` in agent.yaml: how slow an engine's download may be before the node gives it up.

    A mirror that trickles a byte now and then never trips the stall
    timeout; these do.  None: no minimum rate, no deadline.
    """

    # The average over the last rate_window_s, once a download has run that long.
    min_rate_bytes_per_s: float | None = setting(4096.0, above=0)
    rate_window_s: float = setting(300.0, above=0)
    # One archive's download, from its first request to its last byte.
    download_deadline_s: float | None = setting(21600.0, above=0)


@attrs.frozen
class WeightsLimits:
    """``weights:`` in agent.yaml: how slow a fetch of a model's weights may be before the node gives it up.

    The keys are ``installs:``'s; the defaults suit weights, hundreds of
    times larger than an engine: 24 h passes 1 TB over an honest 100 Mbit/s
    link, and 64 kB/s is a trickle on any link a model is fetched over.
    """

    min_rate_bytes_per_s: float | None = setting(65536.0, above=0)
    rate_window_s: float = setting(300.0, above=0)
    # One fetch (a file, or a repository's files together), from its first request to its last byte.
    download_deadline_s: float | None = setting(86400.0, above=0)


@attrs.frozen
class AgentConfig:
    """The whole of agent.yaml; ``path`` is the file it came from, absolute."""

    path: str
    # In order: the agent dials the first, the next when one fails, and the leader a standby names.
    hub: tuple[str, ...] = setting(kind=HubURLs())
    tls: TLSFiles = setting(kind=TLS)
    # With several hubs: how long an opening handshake may take before the next hub is tried (one hub: 30 s).
    hub_handshake_timeout_s: float = setting(10.0, above=0)
    # None: use the hostname, which is also the certificate's CN.
    node_id: str | None = setting(None, kind=Nullable(NAME_STR))
    labels: dict[str, str] = setting(
        factory=dict, kind=MapOf(Str(what="a string (a label value)", check=_check_label_value)))
    fabrics: dict[str, str] = setting(factory=dict, kind=MapOf(
        Str(what="a fabric name", check=check_name),
        key=Str(what="an InfiniBand adapter name such as mlx5_0", check=_check_adapter),
    ))
    # Not required to exist: an unmounted directory is skipped at discovery.
    # Never empty: the first entry is where fetched weights go.
    weights_dirs: tuple[str, ...] = setting(DEFAULT_WEIGHTS_DIRS, converter=_default_if_empty, kind=ListOf(AbsPath()))
    state_dir: str = setting(DEFAULT_STATE_DIR, kind=AbsPath())
    heartbeat_interval_s: float = setting(5.0, above=0)
    # Where the ports of engines the agent starts come from: FIRST-LAST.
    engine_ports: str = setting(DEFAULT_ENGINE_PORTS, kind=Str(what="a port range, FIRST-LAST", check=_check_port_range))
    engines: dict[str, EngineOverride] = setting(
        factory=dict, kind=MapOf(section(EngineOverride), key=Str(what="an engine name", check=_check_engine)))
    installs: InstallLimits = setting(factory=InstallLimits)
    weights: WeightsLimits = setting(factory=WeightsLimits)

    def engine_path(self, engine: str) -> str | None:
        """The path agent.yaml gives for *engine*, or None: find it on this node."""
        override = self.engines.get(engine)
        return override.path if override else None

    @property
    def hub_host(self) -> str:
        return parse_hub_url(self.hub[0]).host

    @property
    def hub_port(self) -> int:
        return parse_hub_url(self.hub[0]).port

    @property
    def engine_port_range(self) -> range:
        return parse_port_range(self.engine_ports)


SCHEMA = section(AgentConfig)


def load_agent_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read agent.yaml at *path*; raise ``ConfigError`` naming file, line and key."""
    document = read_document(path)
    if document.root is None:
        raise document.origin.error(
            1, (), "the file is empty; it needs hub: and tls: (see docs/configuration.rst)"
        )
    return SCHEMA.build(Loader(document), document.root, (), path=os.path.abspath(os.fspath(path)))

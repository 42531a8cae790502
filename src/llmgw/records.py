"""Records that cross the link: what a node says about itself.

Every reported figure defaults to ``None``, which means "not reported" — an
older agent, a probe that could not run, a directory that is not mounted.
Displays show it as ``-``; placement treats it as unknown, never as zero.
A list that is ``None`` was not probed; an empty list was probed and is empty.
"""

from __future__ import annotations

import attrs

from llmgw.states import EngineState, ShardState


@attrs.frozen
class CPU:
    model: str | None = None
    logical_cores: int | None = None
    # The vector extensions llama.cpp's builds care about, as /proc/cpuinfo
    # names them: sse4_2 avx avx2 fma f16c avx512f avx512_vnni amx_tile, or
    # asimd sve on arm.
    vector_flags: list[str] | None = None
    # None when the flags could not be read; False is a CPU known to lack AVX2.
    avx2: bool | None = None


@attrs.frozen
class GPU:
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_pct: int | None = None


@attrs.frozen
class Filesystem:
    """One filesystem holding at least one configured weights directory."""

    mountpoint: str
    fstype: str | None = None
    # Shared (network or cluster) filesystems are summed apart from local ones:
    # their space belongs to every node mounting them.
    shared: bool | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    weights_dirs: list[str] = attrs.Factory(list)


@attrs.frozen
class IBPort:
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ...
    phys_state: str | None = None  # "LinkUp", "Disabled", ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)


@attrs.frozen
class IBAdapter:
    name: str  # mlx5_0
    node_guid: str | None = None
    board_id: str | None = None
    fw_version: str | None = None
    ports: list[IBPort] = attrs.Factory(list)
    # From agent.yaml's `fabrics:`; which fabric an adapter is on cannot be
    # discovered (OpenSM's default subnet prefix is the same everywhere).
    fabric: str | None = None


@attrs.frozen
class WeightsFile:
    """One file of weights a node can see: its path on the node and its size."""

    path: str
    size_bytes: int


@attrs.frozen
class WeightsReport:
    """A node's weights, sent when their fingerprint changes.

    ``listed`` is the flag saying the list is meant: with it, an empty
    ``files`` means "this node holds nothing"; a report without it (an older
    agent, a scan that could not run) says nothing about what the node holds.
    ``cache_dir`` is where the node fetches into, the only directory it will
    collect from.
    """

    files: list[WeightsFile] = attrs.Factory(list)
    fingerprint: str | None = None
    listed: bool = False
    cache_dir: str | None = None


@attrs.frozen
class Progress:
    """How far a download has come, about once a second while it runs.

    ``bytes_total`` is None when the server sent no length: no percentage is
    invented.  ``rate_bps`` is None until there is an interval to measure.
    ``final`` marks the last report of a download; ``error`` says why it
    stopped when it failed.  Keyed by ``source``, because one download serves
    every shard waiting on that source.
    """

    source: str
    file_name: str
    bytes_done: int
    bytes_total: int | None = None
    rate_bps: float | None = None
    final: bool = False
    error: str | None = None


@attrs.frozen
class CollectResult:
    """What a node did with a request to remove weights: it decides, path by path."""

    removed: list[str] = attrs.Factory(list)
    # path as it was sent (repr() of anything that is not a string) -> the sentence
    # saying why, "refused /etc/passwd: outside /var/lib/llmgw-weights".
    refused: dict[str, str] = attrs.Factory(dict)


@attrs.frozen
class Inventory:
    """The whole of what a node says about itself when it registers."""

    node_id: str
    protocol: int | None = None
    agent_version: str | None = None
    address: str | None = None
    hostname: str | None = None
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    cpu: CPU | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    nvidia_driver: str | None = None
    gpus: list[GPU] | None = None
    filesystems: list[Filesystem] | None = None
    infiniband: list[IBAdapter] | None = None
    labels: dict[str, str] = attrs.Factory(dict)
    # None: an agent too old to say; []: it looked and has none.
    engines: list[EngineInfo] | None = None
    weights: WeightsReport | None = None
    # Kept by the agent in its state directory, so a cordon outlives a
    # restart of the control plane, which keeps no database.
    cordoned: bool | None = None
    # Every shard the agent is running or adopted, so a control plane that
    # restarted rebuilds its replicas from the fleet rather than a database.
    shards: list[ShardStatus] | None = None
    # Things the node wants an operator to see, in its own words
    # ("CPU has no AVX2: llama.cpp runs several times slower here").
    warnings: list[str] = attrs.Factory(list)


@attrs.frozen
class Heartbeat:
    """The live figures, sent every few seconds."""

    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    gpus: list[GPU] | None = None
    filesystems: list[Filesystem] | None = None
    # Sent when the agent's periodic probe finds a change; None: unchanged.
    engines: list[EngineInfo] | None = None
    # Sent when the files' fingerprint changes; None: unchanged.
    weights: WeightsReport | None = None


@attrs.frozen
class EngineInfo:
    """One engine build on a node, in the node's own words.

    An agent reports one entry per engine build it knows of: every build the
    control plane's ``EnginePlan`` names (installing, installed or broken),
    every engine agent.yaml names, llmgw's own ``sim``, and an ``absent``
    entry for an engine nobody asked for.  While a new version installs, the
    old one that still serves keeps its own entry: a name may appear more
    than once, a (name, version) pair only once.

    ``state`` None is an agent older than install states, which reported only
    engines it had seen run: read it as installed.
    """

    name: str  # llama.cpp | vllm | sglang | sim
    # For llama.cpp the release tag (b6000); for a Python engine its package
    # version.  None: it ran but did not say.
    version: str | None = None
    # The binary (llama.cpp) or Python interpreter (vllm, sglang) that runs it.
    path: str | None = None
    state: EngineState | None = attrs.field(default=None, converter=attrs.converters.optional(EngineState))
    # The node's own words: "downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)",
    # "needs libgomp.so.1, which this node does not have: apt-get install libgomp1".
    reason: str | None = None
    # Who chose this build: "server.yaml" (the node installed what the
    # catalog names), "agent.yaml" (the operator named a path on this node;
    # placement takes it at whatever version it is), "builtin" (sim).
    origin: str | None = None


@attrs.frozen
class EngineBuild:
    """One engine build the control plane wants on its nodes (server.yaml ``engines.NAME``).

    llama.cpp: ``version`` is a release tag, fetched as assets from
    ``base_url`` and checked against ``sha256`` (asset file name -> digest;
    the package's shipped table merged with server.yaml's).  vLLM and SGLang:
    exactly one of ``python`` (an interpreter the site provides, probed as
    given) or ``pip`` (a requirement the node installs into a venv of its
    own, from ``index_url`` when given); ``version``, when given, is what
    the package must report.
    """

    name: str
    version: str | None = None
    base_url: str | None = None
    sha256: dict[str, str] = attrs.Factory(dict)
    python: str | None = None
    pip: str | None = None
    index_url: str | None = None


@attrs.frozen
class EnginePlan:
    """Every engine build the catalog runs, sent to each node at register and after a reload.

    Only engines some profile uses are named: a fleet that serves no
    llama.cpp model downloads no llama.cpp.  ``install_os_packages`` lets
    the node install the OS packages a build needs from its own package
    sources (apt-get or dnf); otherwise it names them in its refusal.
    """

    builds: list[EngineBuild] = attrs.Factory(list)
    install_os_packages: bool = False


@attrs.frozen
class ShardSpec:
    """What the control plane asks a node to run: one rank of one replica.

    The agent writes it beside the engine's pid, so an agent that restarts can
    describe a running engine back to the control plane exactly.
    """

    shard_id: str  # "<model>/<replica>/<rank>": unique in the fleet
    replica_id: str  # "<model>/<replica>"
    model: str
    engine: str
    # The catalog's fingerprint of (model, profile) when this was started; it
    # comes back in every status so a changed catalog shows as stale.
    fingerprint: str | None = None
    source: str | None = None
    sha256: str | None = None  # of the weights, checked when the node fetches them
    args: list[str] = attrs.Factory(list)
    gpus: list[int] = attrs.Factory(list)  # NVML indices given to this shard
    rank: int = 0
    ranks: int = 1
    leader: str | None = None  # rank 0's address, for multi-node engines
    port: int | None = None  # chosen by the agent when None
    start_timeout_s: float = 600.0
    # The engine build to run it on (llama.cpp's release tag); None: whichever
    # the node has (an older control plane, or a build the catalog gives no version).
    engine_version: str | None = None


@attrs.frozen
class ShardStatus:
    """A shard's state on its node, sent at every transition and in register."""

    spec: ShardSpec
    # A plain string from older code becomes its member; one that names no
    # state is refused here rather than travelling on.
    state: ShardState = attrs.field(converter=ShardState)
    pid: int | None = None
    endpoint: str | None = None  # http://HOST:PORT once known
    reason: str | None = None
    output_tail: list[str] | None = None  # on failure
    adopted: bool | None = None
    since: float | None = None

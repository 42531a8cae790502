"""Records that cross the link: what a node says about itself.

Every reported figure defaults to ``None``, which means "not reported" — an
older agent, a probe that could not run, a directory that is not mounted.
Displays show it as ``-``; placement treats it as unknown, never as zero.
A list that is ``None`` was not probed; an empty list was probed and is empty.

Each field's bounds sit beside it (``llmgw.wire.field``); ``from_wire``
refuses a report that goes past one, naming the field.  They are what no
real machine reports, not what llmgw can use: a node's own words are
trusted as far as they are plausible, and checked by the control plane's
rules beyond that.
"""

from __future__ import annotations

import attrs

from llmgw.states import EngineState, ShardState
from llmgw.wire import Text, field

#: Bytes of memory, disk, a file or a download: an exbibyte.
EIB = 2**60
#: A hardware or software name, a version, a label (hostname: 253).
NAME = 256
#: The catalog's names and the ids made of them.
IDENT = 1024
#: A path (Linux's PATH_MAX), a URL.
PATH = 4096
#: A reason, a warning, a line of an engine's output: cut past this.
PROSE = 4096
#: GPUs, filesystems, adapters, engine builds, warnings of one node.
MANY = 64
#: Seconds since the epoch, or on a test's clock: finite, and not past the year 36000.
TIME = 2**40


@attrs.frozen
class CPU:
    model: str | None = field(None, chars=NAME)
    logical_cores: int | None = field(None, least=1, most=65536)
    # The vector extensions llama.cpp's builds care about, as /proc/cpuinfo
    # names them: sse4_2 avx avx2 fma f16c avx512f avx512_vnni amx_tile, or
    # asimd sve on arm.
    vector_flags: list[str] | None = field(None, chars=32, items=256)
    # None when the flags could not be read; False is a CPU known to lack AVX2.
    avx2: bool | None = None


@attrs.frozen
class GPU:
    index: int = field(least=0, most=MANY - 1)
    uuid: str | None = field(None, chars=NAME)
    name: str | None = field(None, chars=NAME)
    memory_total_bytes: int | None = field(None, least=0, most=EIB)
    memory_used_bytes: int | None = field(None, least=0, most=EIB)
    utilization_pct: int | None = field(None, least=0, most=100)


@attrs.frozen
class Filesystem:
    """One filesystem holding at least one configured weights directory."""

    mountpoint: str = field(chars=PATH, text=Text.PATH)
    fstype: str | None = field(None, chars=NAME)
    # Shared (network or cluster) filesystems are summed apart from local ones:
    # their space belongs to every node mounting them.
    shared: bool | None = None
    total_bytes: int | None = field(None, least=0, most=EIB)
    free_bytes: int | None = field(None, least=0, most=EIB)
    weights_dirs: list[str] = field(factory=list, chars=PATH, items=MANY, text=Text.PATH)


@attrs.frozen
class IBPort:
    port: int = field(least=0, most=255)
    state: str | None = field(None, chars=NAME)  # "ACTIVE", "DOWN", ...
    phys_state: str | None = field(None, chars=NAME)  # "LinkUp", "Disabled", ...
    rate_gbps: float | None = field(None, least=0, most=100_000)
    link_layer: str | None = field(None, chars=NAME)  # "InfiniBand" or "Ethernet" (RoCE)


@attrs.frozen
class IBAdapter:
    name: str = field(chars=NAME)  # mlx5_0
    node_guid: str | None = field(None, chars=NAME)
    board_id: str | None = field(None, chars=NAME)
    fw_version: str | None = field(None, chars=NAME)
    ports: list[IBPort] = field(factory=list, items=MANY)
    # From agent.yaml's `fabrics:`; which fabric an adapter is on cannot be
    # discovered (OpenSM's default subnet prefix is the same everywhere).
    fabric: str | None = field(None, chars=NAME)


@attrs.frozen
class WeightsFile:
    """One file of weights a node can see: its path on the node and its size."""

    path: str = field(chars=PATH, text=Text.PATH)
    size_bytes: int = field(least=0, most=EIB)


@attrs.frozen
class WeightsReport:
    """A node's weights, sent when their fingerprint changes.

    ``listed`` is the flag saying the list is meant: with it, an empty
    ``files`` means "this node holds nothing"; a report without it (an older
    agent, a scan that could not run) says nothing about what the node holds.
    ``cache_dir`` is where the node fetches into, the only directory it will
    collect from.
    """

    # A Hugging Face cache holds a few dozen files a model: room for thousands of models.
    files: list[WeightsFile] = field(factory=list, items=100_000)
    fingerprint: str | None = field(None, chars=NAME)
    listed: bool = False
    cache_dir: str | None = field(None, chars=PATH, text=Text.PATH)
    # Model directories among the files (a fetched repository, a folder with a
    # config.json or a split GGUF's first part), each with the bytes under it:
    # what a vLLM or SGLang source names.  Empty from an older agent.
    directories: list[WeightsFile] = field(factory=list, items=100_000)


@attrs.frozen
class Progress:
    """How far a download has come, about once a second while it runs.

    ``bytes_total`` is None when the server sent no length: no percentage is
    invented.  ``rate_bps`` is None until there is an interval to measure.
    ``final`` marks the last report of a download; ``error`` says why it
    stopped when it failed.  Keyed by ``source``, because one download serves
    every shard waiting on that source.
    """

    source: str = field(chars=PATH, text=Text.PATH)
    file_name: str = field(chars=PATH, text=Text.PATH)
    bytes_done: int = field(least=0, most=EIB)
    bytes_total: int | None = field(None, least=0, most=EIB)
    rate_bps: float | None = field(None, least=0, most=EIB)
    final: bool = False
    error: str | None = field(None, chars=PROSE, text=Text.PROSE)


@attrs.frozen
class CollectResult:
    """What a node did with a request to remove weights: it decides, path by path."""

    removed: list[str] = field(factory=list, chars=PATH, items=100_000, text=Text.PATH)
    # path as it was sent (repr() of anything that is not a string) -> the sentence
    # saying why, "refused /etc/passwd: outside /var/lib/llmgw-weights".
    refused: dict[str, str] = field(factory=dict, chars=PROSE, items=100_000, text=Text.FREE)


@attrs.frozen
class Inventory:
    """The whole of what a node says about itself when it registers."""

    node_id: str = field(chars=NAME)
    protocol: int | None = field(None, least=0, most=1_000_000)
    agent_version: str | None = field(None, chars=NAME)
    address: str | None = field(None, chars=NAME)
    hostname: str | None = field(None, chars=NAME)
    os: str | None = field(None, chars=NAME)
    kernel: str | None = field(None, chars=NAME)
    arch: str | None = field(None, chars=NAME)
    cpu: CPU | None = None
    memory_total_bytes: int | None = field(None, least=0, most=EIB)
    memory_available_bytes: int | None = field(None, least=0, most=EIB)
    nvidia_driver: str | None = field(None, chars=NAME)
    gpus: list[GPU] | None = field(None, items=MANY)
    filesystems: list[Filesystem] | None = field(None, items=MANY)
    infiniband: list[IBAdapter] | None = field(None, items=MANY)
    labels: dict[str, str] = field(factory=dict, chars=NAME, items=MANY)
    # None: an agent too old to say; []: it looked and has none.
    engines: list[EngineInfo] | None = field(None, items=MANY)
    weights: WeightsReport | None = None
    # Kept by the agent in its state directory, so a cordon outlives a
    # restart of the control plane, which keeps no database.
    cordoned: bool | None = None
    # True: the agent checks the leader's epoch on its commands (llmgw.agent.fence), so a server with
    # ha: sends it one; None: an agent older than fencing, which would refuse the keyword.
    fencing: bool | None = None
    # Every shard the agent is running or adopted, so a control plane that
    # restarted rebuilds its replicas from the fleet rather than a database.
    shards: list[ShardStatus] | None = field(None, items=1024)
    # Things the node wants an operator to see, in its own words
    # ("CPU has no AVX2: llama.cpp runs several times slower here").
    warnings: list[str] = field(factory=list, chars=PROSE, items=MANY, text=Text.PROSE)


@attrs.frozen
class Heartbeat:
    """The live figures, sent every few seconds."""

    memory_total_bytes: int | None = field(None, least=0, most=EIB)
    memory_available_bytes: int | None = field(None, least=0, most=EIB)
    gpus: list[GPU] | None = field(None, items=MANY)
    filesystems: list[Filesystem] | None = field(None, items=MANY)
    # Sent when the agent's periodic probe finds a change; None: unchanged.
    engines: list[EngineInfo] | None = field(None, items=MANY)
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

    name: str = field(chars=NAME)  # llama.cpp | vllm | sglang | sim
    # For llama.cpp the release tag (b6000); for a Python engine its package
    # version.  None: it ran but did not say.
    version: str | None = field(None, chars=NAME)
    # The binary (llama.cpp) or Python interpreter (vllm, sglang) that runs it.
    path: str | None = field(None, chars=PATH, text=Text.PATH)
    state: EngineState | None = attrs.field(default=None, converter=attrs.converters.optional(EngineState))
    # The node's own words: "downloading llama-b6000-bin-ubuntu-x64.tar.gz (16 MB)",
    # "needs libgomp.so.1, which this node does not have: apt-get install libgomp1".
    reason: str | None = field(None, chars=PROSE, text=Text.PROSE)
    # Who chose this build: "server.yaml" (the node installed what the
    # catalog names), "agent.yaml" (the operator named a path on this node;
    # placement takes it at whatever version it is), "builtin" (sim).
    origin: str | None = field(None, chars=NAME)


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

    name: str = field(chars=NAME)
    version: str | None = field(None, chars=NAME)
    base_url: str | None = field(None, chars=PATH, text=Text.FREE)
    # asset file name -> digest
    sha256: dict[str, str] = field(factory=dict, chars=NAME, items=4096)
    python: str | None = field(None, chars=PATH, text=Text.FREE)
    pip: str | None = field(None, chars=PATH, text=Text.FREE)
    index_url: str | None = field(None, chars=PATH, text=Text.FREE)


@attrs.frozen
class EnginePlan:
    """Every engine build the catalog runs, sent to each node at register and after a reload.

    Only engines some profile uses are named: a fleet that serves no
    llama.cpp model downloads no llama.cpp.  ``install_os_packages`` lets
    the node install the OS packages a build needs from its own package
    sources (apt-get or dnf); otherwise it names them in its refusal.
    """

    builds: list[EngineBuild] = field(factory=list, items=MANY)
    install_os_packages: bool = False


@attrs.frozen
class ShardSpec:
    """What the control plane asks a node to run: one rank of one replica.

    The agent writes it beside the engine's pid, so an agent that restarts can
    describe a running engine back to the control plane exactly.
    """

    shard_id: str = field(chars=IDENT)  # "<model>/<replica>/<rank>": unique in the fleet
    replica_id: str = field(chars=IDENT)  # "<model>/<replica>"
    model: str = field(chars=IDENT)
    engine: str = field(chars=NAME)
    # The catalog's fingerprint of (model, profile) when this was started; it
    # comes back in every status so a changed catalog shows as stale.
    fingerprint: str | None = field(None, chars=NAME)
    source: str | None = field(None, chars=PATH, text=Text.PATH)
    sha256: str | None = field(None, chars=NAME)  # of the weights, checked when the node fetches them
    # The model's files: patterns: which files of a repository source (hf://ORG/REPO) to fetch; []: all.
    files: list[str] = field(factory=list, chars=PATH, items=256, text=Text.PATH)
    # A profile's arguments, an inline chat template among them.
    args: list[str] = field(factory=list, chars=65536, items=1024, text=Text.FREE)
    gpus: list[int] = field(factory=list, least=0, most=MANY - 1, items=MANY)  # NVML indices given to this shard
    rank: int = field(0, least=0, most=1023)
    ranks: int = field(1, least=1, most=1024)
    # Rank 0's rendezvous for the other ranks of a multi-node replica, HOST:PORT
    # as rank 0's node reported it (ShardStatus.rendezvous); None on rank 0.
    leader: str | None = field(None, chars=NAME)
    # How the ranks of a multi-node replica meet: "native" (the engine's own
    # launcher: vLLM --nnodes/--node-rank, SGLang --dist-init-addr) or "ray";
    # None: the engine's default (native), and always None when ranks == 1.
    launcher: str | None = field(None, chars=NAME)
    port: int | None = field(None, least=1, most=65535)  # chosen by the agent when None
    start_timeout_s: float = field(600.0, least=0, most=7 * 86400)
    # The engine build to run it on (llama.cpp's release tag); None: whichever
    # the node has (an older control plane, or a build the catalog gives no version).
    engine_version: str | None = field(None, chars=NAME)


@attrs.frozen
class ShardStatus:
    """A shard's state on its node, sent at every transition and in register."""

    spec: ShardSpec
    # A plain string from older code becomes its member; one that names no
    # state is refused here rather than travelling on.
    state: ShardState = attrs.field(converter=ShardState)
    # Linux's pid_max is at most 2**22.
    pid: int | None = field(None, least=1, most=2**22)
    endpoint: str | None = field(None, chars=PATH, text=Text.PATH)  # http://HOST:PORT once known
    reason: str | None = field(None, chars=PROSE, text=Text.PROSE)
    # On failure: the engine's last lines, each cut, the last 200 kept.
    output_tail: list[str] | None = field(None, chars=PROSE, items=200, text=Text.PROSE)
    adopted: bool | None = None
    since: float | None = field(None, least=0, most=TIME)
    # Rank 0 of a multi-node replica: HOST:PORT where the other ranks join
    # (vLLM's master port, the Ray head's GCS, SGLang's dist-init address),
    # reported once it accepts connections.  The control plane starts the
    # other ranks only then, with it as their ShardSpec.leader.
    rendezvous: str | None = field(None, chars=NAME)

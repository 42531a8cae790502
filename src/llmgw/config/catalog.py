"""server.yaml's catalog: the engine builds, the profiles and the models the fleet serves.

Each key is declared once, on its field (``llmgw.setting``); ``ENGINES``,
``PROFILES`` and ``MODELS`` are the sections read from them.  What no single
value shows (a model naming a profile) is checked in ``llmgw.config.server``;
which keys apply to which engine, here.
"""

from __future__ import annotations

import re

import attrs
from yaml.nodes import MappingNode

from llmgw.config.common import KNOWN_ENGINES, SHA256
from llmgw.config.scale import FIXED_KEYS, REPLICAS, SCALE_SECTION, Replicas, Scale, check_fixed, over, written
from llmgw.config.schema import AbsPath, Bool, Enum, ListOf, Loader, MapOf, Nullable, Str, Type, section
from llmgw.config.yamlpos import is_null
from llmgw.setting import setting

# The llama.cpp build this release was checked against; nodes converge to it
# unless server.yaml names another.
DEFAULT_LLAMA_CPP_VERSION = "b11194"
#: How the ranks of a multi-node replica meet (Profile.launcher).
LAUNCHERS = ("native", "ray")


def _check_base_url(text: str) -> None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
    except ValueError as e:
        raise ValueError(f"not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("write it as http://HOST/PATH/ or https://HOST/PATH/")
    if parts.query or parts.fragment:
        raise ValueError("a base URL has no ?query or #fragment; the asset's name is added after it")


def _check_asset_name(text: str) -> None:
    # The name becomes a path component of a URL and of a file on the node.
    if not text or "/" in text or "\\" in text or text in (".", "..") or text.startswith("."):
        raise ValueError("an asset is a file name such as llama-b6000-bin-ubuntu-x64.tar.gz, without / or a leading dot")


# One requirement, as pip takes it on its command line: a name, extras, and
# version clauses.  No options (a requirement may not smuggle --index-url),
# no URLs or paths: where packages come from is index_url's to say.
_REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
    r"(?:\s*,\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+)*)?"
)


def _check_requirement(text: str) -> None:
    if not _REQUIREMENT.fullmatch(text.strip()):
        raise ValueError(
            "give one requirement: a package name, optional [extras] and version clauses, "
            "such as 'vllm==0.11.0'; no options, URLs or paths (use index_url: for where it comes from)"
        )


_PACKAGE_INDEX = Str(what="an http:// or https:// URL (a package index)", check=_check_base_url)


@attrs.frozen
class Engine:
    """``engines.NAME`` in server.yaml: the build of one engine the fleet runs.

    llama.cpp: a release ``version`` (tag), fetched from ``base_url`` and
    checked against ``sha256`` (asset file name -> digest), which is merged
    over the table llmgw ships for the versions it was checked against.
    vLLM and SGLang: ``python`` (an environment the site provides) or ``pip``
    (a requirement each node installs into a venv of its own, from
    ``index_url`` when given); ``version`` is then what the package must
    report, when given.  ``llmgw.engines.releases`` turns one into the
    ``EngineBuild`` the nodes receive.
    """

    name: str
    version: str | None = setting(None, kind=Str(what="a string (a release tag such as b6000, or a package version)"))
    base_url: str | None = setting(
        None, kind=Str(what="an http:// or https:// URL (where the release assets are)", check=_check_base_url))
    sha256: dict[str, str] = setting(
        factory=dict, kind=MapOf(SHA256, key=Str(what="an asset file name", check=_check_asset_name)))
    python: str | None = setting(None, kind=AbsPath())
    pip: str | None = setting(None, kind=Str(what="one pip requirement such as 'vllm==0.11.0'", check=_check_requirement))
    index_url: str | None = setting(None, kind=_PACKAGE_INDEX)


def _default_engines() -> dict[str, Engine]:
    return {"llama.cpp": Engine("llama.cpp", DEFAULT_LLAMA_CPP_VERSION)}


_ENGINE_SECTION = section(Engine)
_ENGINE_NAME = Enum(KNOWN_ENGINES, noun="engine")


@attrs.frozen
class EnginesType(Type):
    """``engines:``: a build per engine name, and ``install_os_packages``."""

    what = "a mapping of engine names to their builds, and install_os_packages"

    def convert(self, loader: Loader, node, path):
        if is_null(node):
            return Engines()
        if not isinstance(node, MappingNode):
            raise self.expected(loader, node, path)
        builds = _default_engines()
        install = False
        for key, key_node, value_node in loader.document.items(node, path):
            if key == "install_os_packages":
                install = loader.convert(Bool(), value_node, path + (key,))
                continue
            _ENGINE_NAME.convert(loader, key_node, path + (key,))
            engine = _ENGINE_SECTION.build(loader, value_node, path + (key,), name=key)
            if engine.name == "llama.cpp" and engine.version is None:
                engine = attrs.evolve(engine, version=DEFAULT_LLAMA_CPP_VERSION)
            builds[key] = engine
        return Engines(builds=builds, install_os_packages=install)


@attrs.frozen
class Engines:
    """server.yaml's ``engines:`` section: the builds by engine name, and the OS-package policy.

    llama.cpp is always there: when server.yaml does not name it, the
    release this llmgw was checked against stands in (absent is not "none").
    """

    builds: dict[str, Engine] = attrs.Factory(_default_engines)
    # Let nodes install the OS packages an engine needs (apt-get / dnf) instead
    # of only naming them.  Off by default: it runs the node's package manager.
    install_os_packages: bool = False

    def get(self, name: str) -> Engine | None:
        return self.builds.get(name)


@attrs.frozen
class Profile:
    """How to run a model: which engine, its arguments, and what a node must offer."""

    name: str
    engine: str = setting(kind=Enum(KNOWN_ENGINES, noun="engine"))
    args: tuple[str, ...] = setting((), kind=ListOf(Str(what="a string (one command-line argument)")))
    gpus: int = setting(0, least=0)
    # None: no memory requirement stated (not "needs zero").
    min_memory_gb: float | None = setting(None, least=0)
    node_selector: dict[str, str] = setting(factory=dict, kind=MapOf(Str(what="a string (a label value)")))
    # Nodes one replica spans (vLLM/SGLang multi-node); 1 is a single node.
    ranks: int = setting(1, least=1)
    # How those nodes' ranks meet: "native" (the engine's own launcher) or
    # "ray" (vLLM on a Ray cluster); None: native.
    launcher: str | None = setting(None, kind=Nullable(Enum(LAUNCHERS, noun="launcher")))
    # Free memory each GPU given to a rank must have, in GB; None: not checked.
    min_gpu_free_gb: float | None = setting(None, least=0)
    # Defaults for its models' scale: (each model's own keys win); its min and max are not used.
    scale: Scale = setting(factory=Scale, kind=SCALE_SECTION)


def _check_files_pattern(text: str) -> None:
    """A model's ``files:`` pattern matches paths in a repository: nothing that could not be one."""
    if not text or len(text) > 1024 or re.search(r"[\x00-\x1f\x7f\\]", text) or text.startswith("/"):
        raise ValueError("a pattern is a path in the repository, 1 to 1024 characters, not starting with /, "
                         "without control characters or backslashes (config.json, *.safetensors, tokenizer/)")


@attrs.frozen
class Model:
    """A model served under ``name``; ``source`` is a path on the nodes or a URL.

    ``replicas`` is the number of slots the reconciler keeps: the count, or
    the ``max`` of a range.  ``scale`` is the model's scaling policy resolved,
    its ``min`` and ``max`` always agreeing with ``replicas``.  In code, give
    ``replicas=N`` (a fixed count: ``scale``'s min and max follow it),
    ``replicas=Replicas(M, X)`` as server.yaml's ``{min: M, max: X}``, or
    ``replicas=X`` with a ``scale`` whose max is X; ``attrs.evolve`` keeps
    the range.
    """

    name: str
    source: str | None = setting(None, kind=Nullable(Str(what="a string (a path on the nodes or a URL)")))
    # Keyword-only so that it may follow source, whose default lets a sim model leave it out.
    profile: str = setting(kind=Str(what="the name of one of profiles:"), kw_only=True)
    replicas: int = setting(1, kind=REPLICAS)
    sha256: str | None = setting(None, kind=Nullable(SHA256))
    # Room the weights need on a node that fetches them, in GB; None: not stated.
    disk_gb: float | None = setting(None, least=0)
    # Glob patterns of the files of a repository source (hf://ORG/REPO) to fetch; (): every file.
    files: tuple[str, ...] = setting((), kind=ListOf(
        Str(what="a glob pattern of a repository's files (*.safetensors)", check=_check_files_pattern)))
    # Not in the fingerprint (llmgw.control.catalog): a change of policy restarts no engine.
    scale: Scale = setting(factory=Scale, kind=SCALE_SECTION, kw_only=True)
    # Whether a stream its engine breaks off goes on on another replica (docs/router.rst); not in the fingerprint.
    continuation: bool = setting(True, kw_only=True)

    def __attrs_post_init__(self) -> None:
        count, scale = self.replicas, self.scale
        if isinstance(count, Replicas):
            low, high = count.min, count.max
        elif scale.max == count:
            low, high = scale.min, count
        elif not scale.elastic:
            low = high = count
        else:
            raise ValueError(f"model {self.name}: scale's max ({scale.max}) is not replicas ({count}); "
                             f"give replicas=Replicas({scale.min}, {count}) or a scale with max={count}")
        if low > high:
            raise ValueError(f"model {self.name}: min {low} is more than max {high}")
        # Frozen: the two fields are settled here, once, as attrs allows.
        object.__setattr__(self, "replicas", high)
        if (scale.min, scale.max) != (low, high):
            object.__setattr__(self, "scale", attrs.evolve(scale, min=low, max=high))


def resolve_scales(loader: Loader, models: dict[str, Model], profiles: dict[str, Profile]) -> dict[str, Model]:
    """Each model with its profile's ``scale:`` keys under its own; refuse own keys a fixed count cannot use.

    A model whose count is fixed takes only the keys that apply to it
    (``priority``) from its profile: the rest stay the defaults, so what it
    shows is what it runs by.

    Run once every model's profile is known to exist.
    """
    out = {}
    for name, model in models.items():
        path = ("models", name, "scale")
        own = written(loader, path)
        inherited = written(loader, ("profiles", model.profile, "scale"))
        if not model.scale.elastic:
            check_fixed(loader, path, model.replicas, own)
            inherited = tuple(key for key in inherited if key in FIXED_KEYS)
        scale = over(model.scale, own, profiles[model.profile].scale, inherited)
        out[name] = model if scale == model.scale else attrs.evolve(model, scale=scale)
    return out


# Which keys of engines.NAME each engine takes.
_ENGINE_KEYS = {
    "llama.cpp": ("version", "base_url", "sha256"),
    "vllm": ("version", "python", "pip", "index_url"),
    "sglang": ("version", "python", "pip", "index_url"),
    "sim": (),
}


def check_engines(loader: Loader, engines: Engines) -> None:
    """Keys that do not apply to an engine, a Python engine with no source, a release with no digests."""
    from llmgw.engines.releases import SHIPPED_SHA256, sha256_table

    for name, engine in engines.builds.items():
        here = ("engines", name)
        allowed = _ENGINE_KEYS[name]
        for key in _ENGINE_SECTION.keys:
            value = getattr(engine, key)
            if value in (None, {}) or key in allowed:
                continue
            path = here + (key,)
            raise loader.fail(
                loader.line(path), path,
                f"{name} takes no {key}:" + (f" it takes {', '.join(allowed)}" if allowed else " sim is llmgw's own and needs no build"),
            )
        if name in ("vllm", "sglang"):
            if (engine.python is None) == (engine.pip is None):
                raise loader.fail(
                    loader.line(here), here,
                    f"give {name} either python: (the interpreter of an environment the site provides) "
                    f"or pip: (a requirement each node installs into a venv of its own), not "
                    + ("both" if engine.python else "neither"),
                )
            if engine.index_url is not None and engine.pip is None:
                path = here + ("index_url",)
                raise loader.fail(loader.line(path), path, "index_url: is where pip: installs from; add pip:, or remove it")
        # The stand-in default (server.yaml names no llama.cpp) is not refused
        # here: its nodes say which asset lacks a digest when they need it.
        if name == "llama.cpp" and here in loader.lines and not sha256_table(engine):
            path = here + ("sha256",)
            shipped = ", ".join(sorted(SHIPPED_SHA256)) or "none"
            raise loader.fail(
                loader.line(path), path,
                f"llmgw has no sha256 for the assets of llama.cpp {engine.version} (it ships them for: {shipped}); "
                f"add sha256: {{ASSET: DIGEST}} under engines.llama.cpp with the digest of each asset your nodes "
                f"need (such as llama-{engine.version}-bin-ubuntu-x64.tar.gz), from the release page: "
                "nodes never install an engine they cannot check",
            )

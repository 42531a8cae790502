"""The engine builds llmgw ships knowledge of, and how server.yaml's ``engines:`` becomes what nodes install.

``SHIPPED_SHA256`` holds, per llama.cpp release tag this llmgw was checked
against, the sha256 of each release asset, as published by the release.
server.yaml's ``engines.llama.cpp.sha256`` is merged over it, so a site
mirror or a newer release needs only the digests of the assets its nodes
use.  A node never installs an asset whose digest neither names: it reports
the engine broken and says which key to add.

``engine_plan(config)`` is the ``EnginePlan`` every node receives: the builds
of the engines some profile uses, nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.records import EngineBuild, EnginePlan

if TYPE_CHECKING:
    from llmgw.config.server import Engine, ServerConfig

LLAMA_CPP_BASE_URL = "https://github.com/ggml-org/llama.cpp/releases/download/"

# tag -> {asset file name: sha256}; filled from the release's own published
# digests, never computed from a download llmgw did not check.
SHIPPED_SHA256: dict[str, dict[str, str]] = {}

# Engines a node can install from an EngineBuild; sim is llmgw's own and
# always there.
INSTALLABLE = ("llama.cpp", "vllm", "sglang")


def sha256_table(engine: Engine) -> dict[str, str]:
    """Asset name -> digest for *engine*'s version: the shipped table, then server.yaml's on top."""
    table = dict(SHIPPED_SHA256.get(engine.version or "", {}))
    table.update(engine.sha256)
    return table


def build_of(engine: Engine) -> EngineBuild:
    """What a node receives for one ``engines.NAME`` of server.yaml."""
    if engine.name == "llama.cpp":
        base = engine.base_url or LLAMA_CPP_BASE_URL
        return EngineBuild(
            name=engine.name,
            version=engine.version,
            base_url=base if base.endswith("/") else base + "/",
            sha256=sha256_table(engine),
        )
    return EngineBuild(
        name=engine.name,
        version=engine.version,
        python=engine.python,
        pip=engine.pip,
        index_url=engine.index_url,
    )


def engine_plan(config: ServerConfig) -> EnginePlan:
    """The builds of every installable engine some profile of *config* uses, by name."""
    used = sorted({p.engine for p in config.profiles.values()} & set(INSTALLABLE))
    builds = [build_of(config.engines.builds[name]) for name in used if name in config.engines.builds]
    return EnginePlan(builds=builds, install_os_packages=config.engines.install_os_packages)

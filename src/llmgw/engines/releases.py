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
    from llmgw.config.catalog import Engine
    from llmgw.config.server import ServerConfig

LLAMA_CPP_BASE_URL = "https://github.com/ggml-org/llama.cpp/releases/download/"

# tag -> {asset file name: sha256}: the digests GitHub publishes for each
# asset of the release (the ``digest`` of the releases API), for the Linux
# and macOS builds a node can run.  Where these come from and how they were
# cross-checked is in docs/engines.rst; a new tag is added here only with
# digests read from its release, never from a download llmgw did not check.
SHIPPED_SHA256: dict[str, dict[str, str]] = {
    "b11194": {
        "llama-b11194-bin-ubuntu-x64.tar.gz": "527c09064f3c89e4b6e1008a641e31903a04ccdd1c69abd0752acbbd4e1905f6",
        "llama-b11194-bin-ubuntu-arm64.tar.gz": "92a8e5bb9f2f16804715fa6876f64691827a54d41d39dca67e2a83aa70f133ce",
        "llama-b11194-bin-ubuntu-vulkan-x64.tar.gz": "e4f8163eaf2e4d45639238a6fbc09f559e4ff5c0e7d612088a282ed128359c5e",
        "llama-b11194-bin-ubuntu-vulkan-arm64.tar.gz": "1aa413dda941b31f58ff40205dcd9bad200eb569ef82623b8bc3adf8115162ef",
        "llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz": "d415b688f353fcb5a387f272a5b6d783b8f09267b3b73e5e8920de6df9bffac9",
        "cudart-llama-b11194-bin-ubuntu-cuda-12.8-x64.tar.gz": "3ef39066810c3375bd2e30f418a8b7be7042a4e553e69ca0f9d8132c4fba4ca4",
        "llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz": "d4c637a0c8fd7bdca68d140c9a36cc6038067a7aa29f7b1994f52f2dafede8fd",
        "cudart-llama-b11194-bin-ubuntu-cuda-13.4-x64.tar.gz": "df147535ca08a49cb9be1ced3241e0a043dbedc8a0138b847f0c2e09012ac54c",
        "llama-b11194-bin-ubuntu-cuda-13.4-arm64.tar.gz": "3eecee705f32e964afb5a25b13d42af81385f9209c404479eb15deb3e567e957",
        "cudart-llama-b11194-bin-ubuntu-cuda-13.4-arm64.tar.gz": "8096d68b54c2d5043337e6a99bd446df495f0d409202a92ca70ddee8fa29d2ce",
        "llama-b11194-bin-ubuntu-rocm-10.0-x64.tar.gz": "b364ae02badfba6feb47931978b06aaf9c939a49f4f31d80290517fd4bacd604",
        "llama-b11194-bin-macos-arm64.tar.gz": "cc5d31e048c1c440149a0aaf25a6e387823511c0f23561ec534a4ec07c14e9e1",
        "llama-b11194-bin-macos-x64.tar.gz": "fe9b6c1a2856647303b31401b89e9aab320416706c358c3ce4beb71d21b1f37a",
    },
}

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

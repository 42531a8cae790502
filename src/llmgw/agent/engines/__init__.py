"""The node's side of installing an engine: the pure(ish) pieces the installer composes.

* :mod:`.archive` — :func:`extract`: unpack a release archive, refusing anything that would
  write outside its own new directory;
* :mod:`.assets` — :func:`llama_cpp_asset`: which llama.cpp release asset this node needs,
  from :func:`this_platform`;
* :mod:`.ospackages` — the OS packages that provide the shared libraries an engine build lacks:
  :func:`advice` names them, :func:`install` runs apt-get or dnf when the plan allows it.
"""

from __future__ import annotations

from .archive import UnsafeArchive, extract
from .assets import Asset, NoAsset, Platform, cuda_of_driver, cuda_of_nvml, llama_cpp_asset, this_platform
from .ospackages import OSPackagesFailed, advice, install, package_manager, packages_for

__all__ = [
    "Asset", "NoAsset", "OSPackagesFailed", "Platform", "UnsafeArchive", "advice", "cuda_of_driver", "cuda_of_nvml",
    "extract", "install", "llama_cpp_asset", "package_manager", "packages_for", "this_platform",
]

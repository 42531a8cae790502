"""The node's side of installing an engine: the pure(ish) pieces the installer composes.

* :mod:`.archive` — :func:`~.archive.extract`: unpack a release archive, refusing anything that
  would write outside its own new directory;
* :mod:`.assets` — :func:`~.assets.llama_cpp_asset`: which llama.cpp release asset this node needs;
* :mod:`.ospackages` — the OS packages that provide the shared libraries an engine build lacks,
  as advice or, when the plan allows, installed with apt-get or dnf.
"""

from __future__ import annotations

"""The node's side of installing an engine, one module per piece.

* :mod:`.install` — the ``Installer`` the agent runs: converges on the control
  plane's ``EnginePlan``, downloads, checks, unpacks, proves and marks each build;
* :mod:`.buildlife` — a build's states (installing, installed, broken) and the table between them;
* :mod:`.proving` — whether a llama.cpp build runs here: its libraries (OS packages installed when
  the plan allows) and ``--version``;
* :mod:`.downloads` — the release archives on their way: paced, under a deadline, checked against
  their sha256, given up when the plan moves on;
* :mod:`.pip` — a vLLM/SGLang build: a given interpreter probed, or a venv of the node's own;
* :mod:`.layout` — where builds live under the state dir, their markers, publishing and removal;
* :mod:`.archive` — :func:`~.archive.extract`: unpack a release archive, refusing anything that
  would write outside its own new directory;
* :mod:`.assets` — :func:`~.assets.llama_cpp_asset`: which llama.cpp release asset this node
  needs, from :func:`~.assets.this_platform`;
* :mod:`.ospackages` — the OS packages that provide the shared libraries a build lacks:
  :func:`~.ospackages.advice` names them, :func:`~.ospackages.install` runs apt-get or dnf when
  the plan allows it.

Nothing is re-exported here: ``install`` is both a module and a function of
``ospackages``, and a package attribute may be only one of them.
"""

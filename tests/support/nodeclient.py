"""The official openai Node client, pinned, installed from the npm registry into build/node-openai/.

``tests/support/node/package.json`` pins the version and its lock file the
bytes; ``install()`` runs ``npm ci`` into ``build/node-openai`` only when the
pinned version is not already there, so a second run, or one offline after a
first, installs nothing.  ``make test`` runs ``python -m tests.support.nodeclient``
before pytest, so CI has it.

``node_client()`` is what a test asks for: (node, the client's module URL).
Where node, npm or the package is missing it skips the test saying what to
install; under ``CI=true`` it fails instead, as tests/conftest.py does for the
real engines, since CI must run what the suite claims to test.

``run(node, module, script, *args)`` runs one of tests/support/node/*.mjs,
which import the client from ``$LLMGW_OPENAI_NODE``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tests" / "support" / "node"
TARGET = ROOT / "build" / "node-openai"
#: The client's own README: "Node.js 20 LTS or later".
NODE_MAJOR = 20
INSTALL_TIMEOUT_S = 300
INSTALL = "make test installs it (python -m tests.support.nodeclient)"


class Missing(Exception):
    """What the Node client tests need and do not have, said as what to install."""


def pinned() -> str:
    return json.loads((SOURCE / "package.json").read_text())["dependencies"]["openai"]


def installed_version(target: Path | None = None) -> str | None:
    manifest = (target or TARGET) / "node_modules" / "openai" / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def node() -> str:
    """The path of a node new enough for the client."""
    found = shutil.which("node")
    if found is None:
        raise Missing(f"no node on PATH; apt-get install nodejs npm (Node.js {NODE_MAJOR} or later)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < NODE_MAJOR:
        raise Missing(f"{found} is Node.js {version or '(no version)'}; the openai client needs {NODE_MAJOR} or later")
    return found


def install(target: Path | None = None) -> Path:
    """The client's directory under *target* (``TARGET``), installed with ``npm ci`` unless the pinned version is there."""
    target = target or TARGET
    want = pinned()
    if installed_version(target) == want:
        return target / "node_modules" / "openai"
    npm = shutil.which("npm")
    if npm is None:
        raise Missing(f"openai@{want} is not in {target} and there is no npm to install it; apt-get install npm")
    target.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(SOURCE / name, target / name)
    done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
                          cwd=target, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or installed_version(target) != want:
        last = "\n".join((done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-5:])
        raise Missing(f"npm ci of openai@{want} into {target} failed ({done.returncode}): {last}")
    return target / "node_modules" / "openai"


def module_url(package: Path) -> str:
    return (package / "index.mjs").resolve().as_uri()


def node_client() -> tuple[str, str]:
    """(node, the client's module URL); skips the test, or fails it under CI=true, saying what is missing."""
    try:
        return node(), module_url(install())
    except Missing as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the Node client tests cannot run: {e}; .ci/run installs node, {INSTALL}",
                        pytrace=False)
        pytest.skip(f"{e}; {INSTALL}")


def run(node_path: str, module: str, script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``node tests/support/node/SCRIPT ARGS`` with the client at *module*: blocking, run it in a thread."""
    # NODE_NO_WARNINGS is left out: a warning the client prints is a finding, not noise to hide.
    env = {**{k: v for k, v in os.environ.items() if k != "NODE_NO_WARNINGS"}, "LLMGW_OPENAI_NODE": module}
    return subprocess.run([node_path, str(SOURCE / script), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env, cwd=SOURCE)


def main() -> int:
    try:
        node()
        package = install()
    except Missing as e:
        print(f"nodeclient: {e}", file=sys.stderr)
        # Elsewhere the Node client's tests skip, saying this; under CI they must run.
        return 1 if os.environ.get("CI") == "true" else 0
    print(f"nodeclient: openai@{installed_version()} in {package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

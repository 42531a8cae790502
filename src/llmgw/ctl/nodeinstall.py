"""On the node: what its Python is, for a wheelhouse built for it, and llmgw installed from one, every file's sha256 checked.

Sent over ssh with :mod:`llmgw.ctl.nodeside` (the standard library only, as
nodeside is).  ``check`` answers :func:`facts`; ``install`` is
:func:`install`: the wheels arrive on stdin into a stage beside the venv,
each checked against the sha256 computed before it was sent, and pip
installs from that stage alone, ``--require-hashes`` against the
requirements file the wheelhouse gives (every wheel pinned by version and
sha256).  pip runs without the node's pip configuration or ``PIP_*``
environment: no index, find-links or constraint of the node's can add a
file, and none it names is asked.  Only where the operator names an index
(``--index-url``) is one asked, and the same hashes hold there.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

PIP_TIMEOUT_S = 900
# In the venv: the requirements (with their sha256) it was installed from, for a re-run to compare.
INSTALLED = "llmgw-requirements.txt"
# pip names the file whose hash differs on a line of its own, under this heading.
_MISMATCH = re.compile(r"^\s+(\S+)==\S+ from (\S+)", re.M)


class InstallRefused(Exception):
    """One sentence for the operator: nothing was installed, and the node is as it was."""


def facts(prefix: str) -> dict:
    """The node's Python as a wheel's tags name it, and the sha256 of what the venv at *prefix* was installed from."""
    libc, libc_version = platform.libc_ver()
    return {
        "python_version": "%d.%d" % sys.version_info[:2],
        "implementation": sys.implementation.name,
        "soabi": sysconfig.get_config_var("SOABI") or "",
        "platform": sysconfig.get_platform(),
        "libc": f"{libc} {libc_version}".strip(),
        "installed_set": _sha256_of(os.path.join(prefix, INSTALLED)),
    }


def _sha256_of(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def install(request: dict, stdin=None) -> dict:
    """A venv at the request's prefix with exactly its requirements; a venv this made is removed if anything fails."""
    prefix, requirements = request["prefix"], request["requirements"]
    wheels, index_url = request.get("wheels") or [], request.get("index_url")
    if not wheels and not index_url:
        raise InstallRefused("the install request carries no wheels and names no index; nothing was installed")
    created = not os.path.exists(prefix)
    made = prefix  # the first directory of the prefix not there yet: removed whole if the install fails
    while not os.path.exists(os.path.dirname(made)):
        made = os.path.dirname(made)
    stage = tempfile.mkdtemp(prefix=".llmgw-wheels-", dir=_existing_parent(os.path.dirname(prefix) or "/"))
    try:
        _receive(wheels, stage, stdin or sys.stdin.buffer)
        listed = os.path.join(stage, "requirements.txt")
        with open(listed, "w", encoding="utf-8") as f:
            f.write(requirements)
        if created:
            _run([sys.executable, "-m", "venv", prefix], "creating the venv")
        pip = [os.path.join(prefix, "bin", "python"), "-m", "pip", "install", "--quiet", "--no-input",
               "--disable-pip-version-check", "--require-hashes", "--only-binary=:all:", "--no-cache-dir"]
        pip += ["--index-url", index_url] if index_url else ["--no-index", "--find-links", stage]
        _pip([*pip, "--requirement", listed], stage)
        shutil.copyfile(listed, os.path.join(prefix, INSTALLED))
    except BaseException:
        if created and os.path.exists(made):
            shutil.rmtree(made, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {"changed": [prefix], "created": created}


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _receive(wheels: list[dict], stage: str, stdin) -> None:
    """Each wheel from *stdin* into *stage*, refused whole if any differs from the sha256 the operator computed."""
    for wheel in wheels:
        name = os.path.basename(wheel["name"])
        if not name.endswith(".whl") or name != wheel["name"] or name.startswith("."):
            raise InstallRefused(f"{wheel['name']!r} is not a wheel's file name; nothing was installed")
        digest = hashlib.sha256()
        left = int(wheel["size"])
        with open(os.path.join(stage, name), "wb") as f:
            while left:
                chunk = stdin.read(min(left, 1 << 20))
                if not chunk:
                    raise InstallRefused(f"the connection ended {left} bytes short of {name}; nothing was "
                                         "installed; run onboarding again")
                digest.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        if digest.hexdigest() != wheel["sha256"]:
            raise InstallRefused(f"{name} arrived with sha256 {digest.hexdigest()}, not the {wheel['sha256']} "
                                 "computed before it was sent, so nothing was installed; run onboarding again, and "
                                 "if it recurs, something between here and the node changes what it carries")


def pip_environment() -> dict[str, str]:
    """This process's environment without the node's pip settings: no ``PIP_*``, no pip configuration file."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _pip(argv: list[str], stage: str) -> None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=pip_environment())
    except subprocess.TimeoutExpired:
        raise SystemExit(f"pip did not finish in {PIP_TIMEOUT_S} s: {shlex.join(argv)}") from None
    if out.returncode == 0:
        return
    if "DO NOT MATCH THE HASHES" in out.stderr:
        wrong = [os.path.basename(where) for _, where in _MISMATCH.findall(out.stderr)]
        raise InstallRefused(f"pip refused {', '.join(wrong) or 'a wheel'}: its sha256 is not the one the "
                             "wheelhouse's requirements give it, so nothing was installed; it changed after the "
                             "wheelhouse was made, or the index serves another file: make the wheelhouse again "
                             "(llmgw ctl wheelhouse NEWDIR) and serve those very files")
    sys.stderr.write(out.stderr[-4000:])
    raise SystemExit(f"pip install failed (exit status {out.returncode}): {shlex.join(argv)}")


def _run(argv: list[str], what: str) -> None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what} did not finish in {PIP_TIMEOUT_S} s: {shlex.join(argv)}") from None
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit status {out.returncode}): {shlex.join(argv)}")

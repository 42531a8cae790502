"""The wheelhouse onboarding installs from: exactly the llmgw this runs, its dependencies pinned, every wheel's sha256 written down.

A wheelhouse is a directory of wheels and a ``requirements.txt`` that
names each of them ``NAME==VERSION --hash=sha256:…``; the node installs
with ``pip install --no-index --require-hashes`` from it alone
(:mod:`llmgw.ctl.nodeinstall`).  By default onboarding assembles one per
node Python (:class:`NodeTags`, from what ``check`` found): llmgw's wheel
made from the running llmgw (:mod:`llmgw.ctl.selfwheel`), and its
dependencies by ``pip download --only-binary=:all:`` for the node's tags
from this machine's package index or pip cache, at the versions this
machine runs (``importlib.metadata``).  It is kept in
``$XDG_CACHE_HOME/llmgw/wheelhouse`` (``~/.cache``), one per llmgw, node
tags and pins, so fifty nodes are one download.  ``llmgw ctl wheelhouse
DIR`` makes one where a site keeps its own; ``--wheels DIR`` reads it,
each file checked against its ``requirements.txt`` before any is sent.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import attrs

from llmgw.ctl import closure, selfwheel
from llmgw.ctl.ssh import Refusal
from llmgw.text import printable

REQUIREMENTS = "requirements.txt"
DOWNLOAD_TIMEOUT_S = 900
# The oldest glibc a manylinux tag names (manylinux1 is glibc 2.5).
OLDEST_GLIBC_MINOR = 5
_LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
_WHEEL = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
                    r"(?:-\d[A-Za-z0-9_.]*)?-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+\.whl")
_PINNED = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9._,\s-]*\])?\s*==\s*(?P<version>[A-Za-z0-9_.!+]+)"
                     r"\s*(?:;[^-]*)?(?P<hashes>(?:\s+--hash=sha256:[0-9a-f]{64})+)\s*")
_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


@attrs.frozen
class NodeTags:
    """A node's Python as wheels' tags name it: what ``pip download`` is told to fetch for."""

    python_version: str  # "3.11"
    implementation: str  # "cp"
    abi: str  # "cp311", "cp313t"
    machine: str  # "x86_64", "aarch64"
    glibc: str  # "2.36"

    @property
    def platforms(self) -> tuple[str, ...]:
        """Every manylinux tag a glibc this new runs, newest first, then ``linux_MACHINE``."""
        minor = int(self.glibc.split(".")[1])
        tags = []
        for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1):
            tags.append(f"manylinux_2_{m}_{self.machine}")
            if m in _LEGACY:
                tags.append(f"{_LEGACY[m]}_{self.machine}")
        return (*tags, f"linux_{self.machine}")

    @property
    def label(self) -> str:
        return f"{self.abi}-manylinux_{self.glibc.replace('.', '_')}_{self.machine}"

    def pip_args(self) -> list[str]:
        argv = ["--only-binary=:all:", "--python-version", self.python_version,
                "--implementation", self.implementation, "--abi", self.abi]
        for platform in self.platforms:
            argv += ["--platform", platform]
        return argv


def node_tags(found: dict, where: str) -> NodeTags:
    """*where*'s tags from what ``check`` answered (:func:`llmgw.ctl.nodeinstall.facts`); a Refusal for a Python no wheelhouse is assembled for."""
    version, soabi, platform, libc = found["python_version"], found["soabi"], found["platform"], found["libc"]
    if found["implementation"] != "cpython" or not re.fullmatch(r"cpython-\d+t?(-.*)?", soabi):
        raise Refusal(f"{where}'s Python is {found['implementation']} ({soabi or 'no SOABI'}); onboarding assembles "
                      "wheelhouses for CPython only: build one for that node and give --wheels DIR")
    glibc = re.fullmatch(r"glibc (2\.\d+)", libc)
    machine = re.fullmatch(r"linux-([A-Za-z0-9_]+)", platform)
    if glibc is None or machine is None:
        raise Refusal(f"{where} runs {libc or 'an unknown C library'} on {platform}; onboarding assembles wheelhouses "
                      "for Linux with glibc (manylinux) only: build one for that node (pip download "
                      "--platform …) and give --wheels DIR")
    return NodeTags(version, "cp", "cp" + soabi.split("-")[1], machine.group(1), glibc.group(1))


def this_machine() -> NodeTags:
    """This machine's own tags, as ``check`` would say them of it."""
    from llmgw.ctl import nodeinstall

    return node_tags(nodeinstall.facts("/nonexistent"), "this machine")


def platform_tags(python_version: str, platform: str, abi: str | None = None) -> NodeTags:
    """Tags from the command line: ``--python-version 3.11 --platform manylinux_2_28_x86_64`` (the node's glibc)."""
    if not re.fullmatch(r"3\.\d+", python_version):
        raise Refusal(f"--python-version {printable(python_version)!r}: give MAJOR.MINOR, such as 3.11")
    tag = re.fullmatch(r"manylinux_2_(\d+)_([A-Za-z0-9_]+)", platform)
    if tag is None:
        raise Refusal(f"--platform {printable(platform)!r}: give the node's manylinux tag, manylinux_2_GLIBC_MACHINE "
                      "(manylinux_2_28_x86_64 for glibc 2.28 on x86_64; `ldd --version` says the glibc)")
    abi = abi or "cp" + python_version.replace(".", "")
    if not re.fullmatch(r"cp\d+t?", abi):
        raise Refusal(f"--abi {printable(abi)!r}: give a CPython ABI tag, such as cp311 (cp313t free-threaded)")
    return NodeTags(python_version, "cp", abi, tag.group(2), f"2.{tag.group(1)}")


@attrs.frozen
class Wheel:
    name: str
    project: str  # normalized: lower case, runs of -_. as -
    version: str
    size: int
    sha256: str
    path: Path

    def sent(self) -> dict:
        """As the node's install request names it (checked there as it arrives)."""
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@attrs.frozen
class Wheelhouse:
    """The wheels to carry and the requirements the node installs, with their sha256, exactly."""

    directory: Path
    wheels: tuple[Wheel, ...]
    requirements: str
    version: str  # llmgw's

    @property
    def requirements_sha256(self) -> str:
        """What ``check`` answers of a venv installed from these (``installed_set``)."""
        return hashlib.sha256(self.requirements.encode()).hexdigest()


def project(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _hashed(path: Path) -> Wheel:
    found = _WHEEL.fullmatch(path.name)
    if found is None:
        raise Refusal(f"{printable(str(path))} is not named as a wheel is (NAME-VERSION-PY-ABI-PLATFORM.whl); "
                      "move it out of the wheelhouse")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return Wheel(path.name, project(found["name"]), found["version"], path.stat().st_size, digest.hexdigest(), path)


def requirements_text(wheels: list[Wheel]) -> str:
    """One ``NAME==VERSION --hash=sha256:…`` per project, each of its wheels' hashes listed: pip takes no other file."""
    by = {}
    for wheel in wheels:
        by.setdefault((wheel.project, wheel.version), []).append(wheel.sha256)
    lines = ["# Made by llmgw: every wheel pinned by version and sha256 (pip install --require-hashes)."]
    for (name, version), hashes in sorted(by.items()):
        lines.append(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in sorted(hashes)))
    return "\n".join(lines) + "\n"


def read(directory: str | Path, version: str) -> Wheelhouse:
    """The wheelhouse in *directory*: each wheel its ``requirements.txt`` names, checked against it here, before any is sent.

    A directory with no ``requirements.txt`` (``pip wheel . -w DIR``) is
    taken as it is: every wheel in it, pinned by the sha256 computed now.
    """
    directory = Path(directory)
    wheels = [_hashed(p) for p in sorted(directory.glob("*.whl"))]
    if not any(w.project == "llmgw" and w.version == version for w in wheels):
        raise Refusal(f"{directory} has no llmgw-{version}-*.whl, the server's version; make a wheelhouse with "
                      f"`llmgw ctl wheelhouse NEWDIR` from an llmgw {version}, and give --wheels NEWDIR")
    listed = directory / REQUIREMENTS
    if not listed.exists():
        versions = {}
        for wheel in wheels:
            versions.setdefault(wheel.project, set()).add(wheel.version)
        twice = sorted(p for p, v in versions.items() if len(v) > 1)
        if twice:
            raise Refusal(f"{directory} has wheels of more than one version of {', '.join(twice)} and no "
                          f"{REQUIREMENTS} to say which; keep one, or make the wheelhouse with `llmgw ctl wheelhouse`")
        return Wheelhouse(directory, tuple(wheels), requirements_text(wheels), version)
    text = listed.read_text(encoding="utf-8")
    pinned = _pinned(listed, text)
    if ("llmgw", version) not in pinned:
        raise Refusal(f"{listed} does not pin llmgw=={version}, the server's version; make a wheelhouse with "
                      f"`llmgw ctl wheelhouse NEWDIR` from an llmgw {version}, and give --wheels NEWDIR")
    carried = []
    for (name, pin), hashes in sorted(pinned.items()):
        mine = [w for w in wheels if w.project == name and w.version == pin]
        for wheel in mine:
            if wheel.sha256 not in hashes:
                raise Refusal(f"{wheel.path} has sha256 {wheel.sha256}, which {listed} does not give "
                              f"{name}=={pin}: it changed after the wheelhouse was made, so nothing was sent; "
                              "make the wheelhouse again (llmgw ctl wheelhouse NEWDIR)")
        if not mine:
            raise Refusal(f"{listed} pins {name}=={pin}, and {directory} has no wheel of it; add it, or make the "
                          "wheelhouse again (llmgw ctl wheelhouse NEWDIR)")
        carried += mine
    return Wheelhouse(directory, tuple(carried), text, version)


def _pinned(listed: Path, text: str) -> dict[tuple[str, str], set[str]]:
    """Each ``NAME==VERSION`` of *listed* with its sha256s; a Refusal naming the line pip would read otherwise."""
    pinned = {}
    logical, number = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        number = number or n
        line = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        if logical.strip():
            found = _PINNED.fullmatch(logical.strip())
            if found is None:
                raise Refusal(f"{listed} line {number}: onboarding takes only NAME==VERSION lines with their "
                              "--hash=sha256:… (what `llmgw ctl wheelhouse` writes), since each file must be "
                              f"pinned; it reads {printable(logical.strip()[:120])!r}")
            hashes = set(re.findall(r"[0-9a-f]{64}", found["hashes"]))
            pinned.setdefault((project(found["name"]), found["version"]), set()).update(hashes)
        logical, number = "", 0
    return pinned


def pins() -> str:
    """Every distribution this process can import, ``NAME==VERSION`` (the first of a name on sys.path, as import finds it)."""
    import importlib.metadata

    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name and project(name) not in seen and project(name) != "llmgw":
            seen[project(name)] = f"{project(name)}=={dist.version}"
    return "".join(line + "\n" for _, line in sorted(seen.items()))


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmgw" / "wheelhouse"


def assembled(tags: NodeTags, root: Path | None = None) -> Wheelhouse:
    """The wheelhouse for *tags* of the running llmgw and its pins, from the cache, or assembled into it once."""
    source = selfwheel.running()
    constraints = pins()
    key = hashlib.sha256(f"{source.digest()}\0{tags!r}\0{constraints}".encode()).hexdigest()[:16]
    where = (root or cache_root()) / f"llmgw-{source.version}-{tags.label}-{key}"
    with _locks_lock:
        lock = _locks.setdefault(str(where), threading.Lock())
    with lock:
        _own_cache(where.parent)
        if not (where / REQUIREMENTS).exists():
            _made_whole(where, lambda stage: assemble(stage, tags, source, constraints))
        return read(where, source.version)


def _own_cache(root: Path) -> None:
    """*root* made (0700) and held to be this user's alone: what is cached there is installed on nodes as root."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.stat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise Refusal(f"the wheelhouse cache {root} belongs to uid {st.st_uid} or others may write to it, and what is "
                      "kept there is installed on nodes; make it yours alone (chmod go-w), or set XDG_CACHE_HOME")


def _made_whole(where: Path, fill) -> None:
    """*where* filled by *fill* in a stage beside it and renamed into place, so it is whole or absent."""
    stage = Path(tempfile.mkdtemp(prefix=f".{where.name}.", dir=where.parent))
    try:
        fill(stage)
        if where.exists() and not (where / REQUIREMENTS).exists() and not any(where.iterdir()):
            where.rmdir()
        elif where.exists() and not (where / REQUIREMENTS).exists():
            shutil.rmtree(where)  # left half made by an older run: this one is whole
        try:
            os.replace(stage, where)
        except OSError:
            if not (where / REQUIREMENTS).exists():
                raise
            # Another ctl made the same one meanwhile: the same llmgw, tags and pins.
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def assemble(into: Path, tags: NodeTags, source: selfwheel.Running | None = None, constraints: str | None = None) -> None:
    """Fill *into* with llmgw's wheel, its dependencies' for *tags* at this machine's versions, and requirements.txt."""
    source = source or selfwheel.running()
    constraints = pins() if constraints is None else constraints
    with tempfile.TemporaryDirectory(prefix=".llmgw-build-") as scratch:
        own = selfwheel.build(source, Path(scratch))
        pinned = Path(scratch) / "constraints.txt"
        pinned.write_text(constraints)
        _download(into, tags, pinned, [str(own)])
        if not (into / own.name).exists():
            shutil.copy(own, into / own.name)
        # pip read the dependencies' markers for this machine's Python: what the node's needs as well, fetched.
        environment = closure.marker_environment(tags.python_version, tags.machine)
        for _ in range(closure.MAX_ROUNDS):
            held = {project(m["name"]): (m["version"], p) for p in into.glob("*.whl") if (m := _WHEEL.fullmatch(p.name))}
            lacking = closure.missing(held, "llmgw", environment)
            if not lacking:
                break
            _download(into, tags, pinned, lacking, "--no-deps")
        else:
            raise Refusal(f"llmgw's dependencies for {tags.label} still lack {', '.join(lacking)} after "
                          f"{closure.MAX_ROUNDS} rounds of pip download; make the wheelhouse by hand and give --wheels DIR")
    wheels = [_hashed(p) for p in sorted(into.glob("*.whl"))]
    (into / REQUIREMENTS).write_text(requirements_text(wheels))


def _download(into: Path, tags: NodeTags, pinned: Path, wanted: list[str], *more: str) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-input",
            "--dest", str(into), *tags.pip_args(), "--constraint", str(pinned), *more, *wanted]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Refusal(f"fetching llmgw's dependencies for {tags.label} took more than {DOWNLOAD_TIMEOUT_S} s") from None
    if out.returncode != 0:
        said = " ".join(line.strip() for line in out.stderr.splitlines()
                        if line.strip() and not line.startswith("WARNING: Location"))
        raise Refusal(f"fetching llmgw's dependencies for {tags.label} from this machine's package index failed "
                      f"(pip download, exit status {out.returncode}): {printable(said[-1500:])}; make a wheelhouse "
                      "where the index is reachable (llmgw ctl wheelhouse DIR --python-version … --platform …) "
                      "and onboard with --wheels DIR")


# -- onboarding's install step --

def same_version(server_version: str) -> None:
    """A Refusal, before any node is reached, when the llmgw here is not the server's: it is what a node would get."""
    here = selfwheel.running().version
    if here != server_version:
        raise Refusal(f"this ctl runs llmgw {here} and the server {server_version}; onboarding installs on the node "
                      f"the llmgw that runs here, so run it from an llmgw {server_version}, or give --wheels DIR, a "
                      f"wheelhouse of llmgw {server_version} (llmgw ctl wheelhouse DIR)")


def index_url(text: str) -> str:
    """*text* when it is an index's URL pip can be given (http, https or file, no space or control character)."""
    if re.fullmatch(r"(https?|file)://[^\s\x00-\x1f\x7f]+", text):
        return text
    raise Refusal(f"--index-url {printable(repr(text[:300]))}: give the URL of a package index serving this "
                  "wheelhouse's very files (https://…/simple, or file:///…)")


def install_request(house: Wheelhouse, index_url: str | None) -> tuple[dict, list[Path]]:
    """nodeside's install request for *house* and the files it carries: none where the node asks *index_url*."""
    carried = [] if index_url else list(house.wheels)
    return ({"requirements": house.requirements, "index_url": index_url, "wheels": [w.sent() for w in carried]},
            [w.path for w in carried])


def described(house: Wheelhouse, index_url: str | None, kept: bool) -> str:
    """Where the install came from, for the step's line."""
    if index_url:
        return f"from {printable(index_url)}, each of {len(house.wheels)} files held to its sha256 by pip"
    whose = f"from {house.directory}" if kept else "assembled here"
    return f"from {len(house.wheels)} wheels {whose}, carried over, each sha256 checked"


# -- llmgw ctl wheelhouse DIR --

def add_parser(sub) -> None:
    command = sub.add_parser("wheelhouse", help="make a wheelhouse onboarding installs from (--wheels DIR): this llmgw, "
                             "its dependencies pinned, requirements.txt with every sha256")
    command.add_argument("directory", metavar="DIR", help="where the wheels go (made; it must be empty)")
    command.add_argument("--python-version", metavar="X.Y", help="the nodes' Python (default: this machine's)")
    command.add_argument("--platform", metavar="TAG", help="the nodes' manylinux_2_GLIBC_MACHINE tag "
                         "(default: this machine's)")
    command.add_argument("--abi", metavar="TAG", help="the nodes' CPython ABI tag (default cpXY of --python-version)")
    command.set_defaults(func=cmd_wheelhouse)


def cmd_wheelhouse(args) -> int:
    here = this_machine() if not (args.python_version and args.platform) else None  # a Mac makes a Linux node's too
    tags = platform_tags(args.python_version or here.python_version,
                         args.platform or f"manylinux_{here.glibc.replace('.', '_')}_{here.machine}", args.abi)
    into = Path(args.directory)
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise Refusal(f"{into} is there and not an empty directory; give a new one (a wheelhouse is made whole)")
    into.parent.mkdir(parents=True, exist_ok=True)
    _made_whole(into, lambda stage: assemble(stage, tags))
    house = read(into, selfwheel.running().version)
    print(f"{into}: llmgw {house.version} and {len(house.wheels) - 1} dependencies for {tags.label}, "
          f"each pinned with its sha256 in {into / REQUIREMENTS}; onboard with --wheels {into}")
    return 0

"""Engine releases made at test time: archives shaped like llama.cpp's, stand-in binaries, a mirror, a package index.

- ``stand_in(directory, ...)``: a ``llama-server`` compiled with ``cc`` that
  answers ``--version`` as told (or fails it), optionally linked against a
  shared library that is then deleted, so ``ldd`` says "not found".
- ``release_archive(source_dir, dest)``: *source_dir*'s files packed as a
  release asset, under ``build/bin/`` as llama.cpp's Linux zips have them (or
  any other folder); ``.zip`` or a tarball by *dest*'s name.  Modes and
  symbolic links are kept, which a real llama-server's libraries need.
- ``Mirror(directory)``: *directory* served over HTTP on 127.0.0.1, the way a
  release mirror serves ``TAG/ASSET``: 404 for what is not there, Range
  honoured, every request recorded, and a ``Gate`` that holds responses of
  one path open part-way until the test releases them, or lets them
  trickle through a few bytes at a time; a path can also redirect, or
  answer a body without a length that never ends.
- ``stand_in_wheel(directory, name, version)`` and ``simple_index(directory,
  wheels)``: a pure-Python wheel written with zipfile (a package with
  ``__version__`` and a console script answering ``--version``), and a
  PEP 503 "simple" index of wheels that ``pip --index-url file:///…/simple``
  installs from without any network.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import re
import shutil
import stat
import subprocess
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Iterable, Sequence

import pytest

_C_MAIN = r"""
#include <stdio.h>
#include <string.h>
%(declare)s
int main(int argc, char **argv) {
    %(call)s
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fputs(%(version)s, stderr);
        return %(status)d;
    }
    fputs("a stand-in llama-server: it only answers --version\n", stderr);
    return 2;
}
"""


def compiler() -> str:
    """The C compiler; skips the test, saying so, where there is none."""
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.skip("no C compiler (cc) to build stand-in engine binaries; install gcc")
    return found


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def stand_in(directory: Path, name: str = "llama-server", *, version: str = "version: 6000 (abc1234)\n",
             status: int = 0, missing_library: str | None = None, library_dir: Path | None = None,
             origin: bool = False) -> Path:
    """A native binary *directory*/*name* whose ``--version`` prints *version* on stderr and exits *status*.

    With *missing_library* (a soname such as ``libllmgw-gone.so.1``) it is
    linked against a library of that name which is deleted once linked: the
    loader refuses to start it, and ``ldd`` names the library "not found".
    With *library_dir* as well, the library is kept there instead and found
    through the binary's RUNPATH, until the test deletes it (``library(...)``
    puts it back).  *origin* sets the RUNPATH ``$ORIGIN``, as llama.cpp's
    builds have it: a library beside the binary is found.
    """
    cc = compiler()
    directory.mkdir(parents=True, exist_ok=True)
    scratch = directory / f".build-{name}"
    scratch.mkdir()
    try:
        declare = call = ""
        link: list[str] = []
        if missing_library:
            stem = re.fullmatch(r"lib([A-Za-z0-9_+-]+)\.so(\.[0-9.]+)?", missing_library)
            assert stem, f"{missing_library!r} is not a soname like libNAME.so.1"
            library(scratch, missing_library, link_name=f"lib{stem.group(1)}.so")
            if library_dir is not None:
                library(library_dir, missing_library)
            declare, call = "int llmgw_gone(void);", "llmgw_gone();"
            link = [f"-L{scratch}", f"-l{stem.group(1)}"]
            if library_dir is not None:
                link.append(f"-Wl,-rpath,{library_dir}")
        if origin:
            link.append("-Wl,-rpath,$ORIGIN")
        source = scratch / "main.c"
        source.write_text(_C_MAIN % {"declare": declare, "call": call, "version": _c_string(version),
                                     "status": status})
        binary = directory / name
        _run([cc, "-o", str(binary), str(source), *link])
    finally:
        shutil.rmtree(scratch)
    return binary


def library(directory: Path, soname: str, *, link_name: str | None = None) -> Path:
    """A shared library *directory*/*soname* (or *link_name*) with that soname, compiled with ``cc``."""
    cc = compiler()
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f".{soname}.c"
    source.write_text("int llmgw_gone(void) { return 0; }\n")
    out = directory / (link_name or soname)
    try:
        _run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(source)])
    finally:
        source.unlink()
    return out


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr}"


def release_archive(source_dir: Path, dest: Path, *, inside: str = "build/bin") -> Path:
    """Every file of *source_dir* packed into *dest* under *inside*/ (``""``: at the top).

    A ``.zip`` name makes a zip, ``.tar.gz``/``.tgz``, ``.tar.xz``,
    ``.tar.bz2`` and ``.tar`` make tarballs.  Folders are entries of their
    own, executable bits and symbolic links are kept.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in source_dir.rglob("*"))
    prefix = inside.strip("/")
    names = [(p, "/".join(filter(None, (prefix, p.relative_to(source_dir).as_posix())))) for p in files]
    if dest.name.endswith(".zip"):
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
            for path, name in names:
                _zip_entry(z, path, name)
        return dest
    mode = {".gz": "w:gz", ".tgz": "w:gz", ".xz": "w:xz", ".bz2": "w:bz2", ".tar": "w"}[dest.suffix]
    with tarfile.open(dest, mode) as t:
        for path, name in names:
            t.add(path, arcname=name, recursive=False)
    return dest


def _zip_entry(z: zipfile.ZipFile, path: Path, name: str) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        info = zipfile.ZipInfo(name)
        info.create_system = 3  # Unix, so the mode in external_attr is read
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, os.readlink(path))
    elif stat.S_ISDIR(st.st_mode):
        z.write(path, name + "/")
    else:
        z.write(path, name)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Gate:
    """Holds every response of one path after its first *at* bytes, until ``release()``; ``let(n)`` trickles."""

    def __init__(self, at: int):
        self.at = at
        #: How many responses have reached the gate and wait (or waited) there.
        self.reached = 0
        #: Bytes let through the gate by ``let()`` and sent.
        self.let_through = 0
        self._open = False
        self._allowed = 0
        self._changed = threading.Condition()

    def release(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()

    def let(self, n: int) -> None:
        """Let *n* more bytes through (a mirror that trickles); the gate stays shut after them."""
        with self._changed:
            self._allowed += n
            self._changed.notify_all()

    def _arrive(self) -> None:
        with self._changed:
            self.reached += 1

    def _wait(self) -> int | None:
        """How many bytes may go now (None: all that are left), once some may."""
        with self._changed:
            self._changed.wait_for(lambda: self._open or self._allowed)
            if self._open:
                return None
            n, self._allowed = self._allowed, 0
            return n


class Mirror:
    """The files under *directory* served on 127.0.0.1 from a thread: ``url("b6000/ASSET")``."""

    def __init__(self, directory: Path, chunk: int = 64 * 1024):
        self.directory = Path(directory)
        self.chunk = chunk
        #: The path of every GET, in order ("/b6000/llama-b6000-bin-ubuntu-x64.zip").
        self.requests: list[str] = []
        self._gates: dict[str, Gate] = {}
        self._redirects: dict[str, str] = {}
        self._endless: set[str] = set()
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> Mirror:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._server = server
        return self

    def stop(self) -> None:
        for gate in self._gates.values():
            gate.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def url(self, path: str = "") -> str:
        """The URL of *path* under the mirror; ``url()`` is the base, ending in "/"."""
        assert self._server is not None, "start() the mirror first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path.lstrip('/')}"

    def publish(self, archive: Path, tag: str) -> str:
        """Put *archive* where a release of *tag* keeps it (``TAG/NAME``); its URL."""
        (self.directory / tag).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(archive, self.directory / tag / archive.name)
        return self.url(f"{tag}/{archive.name}")

    def hold(self, path: str, at: int) -> Gate:
        """From now on, responses for *path* stop after *at* bytes until the gate is released."""
        gate = self._gates["/" + path.lstrip("/")] = Gate(at)
        return gate

    def redirect(self, path: str, to: str) -> None:
        """From now on, *path* answers 302 to *to* (a path on the mirror, or a URL)."""
        self._redirects["/" + path.lstrip("/")] = to if "://" in to else self.url(to)

    def endless(self, path: str) -> None:
        """From now on, *path* answers 200 with no length and a body that never ends."""
        self._endless.add("/" + path.lstrip("/"))

    def count(self, path: str) -> int:
        """How many GETs *path* has had."""
        return self.requests.count("/" + path.lstrip("/"))


def _handler(mirror: Mirror):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            mirror.requests.append(path)
            if path in mirror._redirects:
                self.send_response(302)
                self.send_header("Location", mirror._redirects[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in mirror._endless:
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    while True:
                        self.wfile.write(bytes(mirror.chunk))
                except OSError:
                    return  # the client hung up
            file = (mirror.directory / path.lstrip("/")).resolve()
            if path.endswith("/"):
                file = file / "index.html"  # a folder's page, as a package index serves one
            if not file.is_file() or not file.is_relative_to(mirror.directory.resolve()):
                self.send_error(404, "Not Found", f"{path} is not on this mirror")
                return
            data = file.read_bytes()
            start = 0
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if match and int(match.group(1)) < len(data):
                start = int(match.group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            try:
                self._send(data, start, mirror._gates.get(path))
            except OSError:
                pass  # the client went away

        def _send(self, data: bytes, pos: int, gate: Gate | None) -> None:
            end = gate.at if gate is not None and pos < gate.at < len(data) else len(data)
            pos = self._write(data, pos, end)
            if end < len(data):
                gate._arrive()
                while pos < len(data):
                    n = gate._wait()
                    sent = self._write(data, pos, len(data) if n is None else min(len(data), pos + n))
                    if n is not None:
                        gate.let_through += sent - pos
                    pos = sent

        def _write(self, data: bytes, pos: int, end: int) -> int:
            while pos < end:
                piece = data[pos:min(pos + mirror.chunk, end)]
                self.wfile.write(piece)
                self.wfile.flush()
                pos += len(piece)
            return pos

        def log_message(self, *args):
            pass

    return Handler


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def stand_in_wheel(directory: Path, name: str = "vllm", version: str = "0.11.0", *,
                   module: str | None = None, import_error: str | None = None) -> Path:
    """A pure-Python wheel of *name* *version*: ``import MODULE; MODULE.__version__`` and a ``NAME --version`` script.

    With *import_error* the package raises ImportError with that text when
    imported, as a package built for another platform does.
    """
    module = module or name.replace("-", "_")
    dist = f"{name.replace('-', '_')}-{version}"
    init = f"__version__ = {version!r}\n"
    if import_error:
        init += f"raise ImportError({import_error!r})\n"
    files = {
        f"{module}/__init__.py": init,
        f"{module}/__main__.py": (
            "import sys\n\n\ndef main():\n"
            f"    from {module} import __version__\n"
            "    if sys.argv[1:] == ['--version']:\n        print(__version__)\n        return 0\n"
            f"    print('a stand-in {name}: it only answers --version', file=sys.stderr)\n    return 2\n\n\n"
            "if __name__ == '__main__':\n    sys.exit(main())\n"
        ),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: llmgw-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}.dist-info/entry_points.txt": f"[console_scripts]\n{name} = {module}.__main__:main\n",
    }
    record = f"{dist}.dist-info/RECORD"
    lines = [f"{path},{_record_hash(text.encode())},{len(text.encode())}" for path, text in files.items()]
    files[record] = "\n".join([*lines, f"{record},,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def simple_index(directory: Path, wheels: Iterable[Path]) -> str:
    """A PEP 503 index of *wheels* under *directory*/simple; its ``file://`` URL, for ``--index-url``."""
    simple = directory / "simple"
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        projects.setdefault(_normalized(wheel.name.split("-", 1)[0]), []).append(wheel)
    for project, files in projects.items():
        folder = simple / project
        folder.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in files:
            shutil.copyfile(wheel, folder / wheel.name)
            links.append(f'<a href="{wheel.name}#sha256={sha256_of(wheel)}">{wheel.name}</a><br>')
        (folder / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    top = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{top}</body></html>\n")
    return simple.as_uri()


def names_in(archive: Path) -> Sequence[str]:
    """The member names of a zip or tarball, to check what a helper packed."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            return z.namelist()
    with tarfile.open(archive) as t:
        return t.getnames()

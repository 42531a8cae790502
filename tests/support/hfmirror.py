"""A Hugging Face hub on 127.0.0.1: repositories served from a directory, in the hub's own API.

``HubMirror(root)`` serves every directory ``root/ORG/REPO`` as the
repository ``ORG/REPO`` at revision ``main`` (and at its commit, a sha1 of
the listing, as the hub's 40 hex digits), answering what huggingface_hub and
llmgw ask the real hub:

* ``GET /api/models/ORG/REPO`` and ``/api/models/ORG/REPO/revision/REV``
  (``?blobs=true`` adds each sibling's size, blobId and lfs);
* ``GET /api/models/ORG/REPO/tree/REV[/PATH]?recursive=true``, paged like the
  hub with a ``Link: <…>; rel="next"`` header (``page_size``);
* ``GET`` and ``HEAD /ORG/REPO/resolve/REV/PATH`` with Range, ``ETag``,
  ``X-Repo-Commit`` and, for LFS files (weights by suffix, or 10 MiB and
  more), ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``; the listing
  gives LFS files ``lfs: {oid: sha256, size, pointerSize}`` as the hub does.

It is a real process (Twisted, ``twisted.web``), so plain tests that block
and reactor tests alike can use it.  The test steers it between requests:

* ``hold(path, *stops)``: every response for *path* (``ORG/REPO/FILE``) sends
  up to each stop (a byte offset of the file) and waits there until
  ``release(path)``; ``reached(path)`` counts the stops met, so a test looks
  at a download while it is held open instead of racing it;
* ``let(path, n)``: every response held at a stop of *path* sends *n* more
  bytes and stays held there, a mirror that trickles;
* ``cut(path, at, times=1)``: the next *times* responses close the
  connection at byte *at*, an interrupted download;
* ``corrupt(path)``: serve *path* with its first byte changed, the listing
  unchanged, so only a checksum can tell;
* ``seen(path)``: the requests for *path*, each with its Range, status and
  the body bytes sent, and the revision asked for (an API request's path is
  its URL path, ``/api/…``, and it has the repository's ``commit``).

With ``token=``, every request must carry ``Authorization: Bearer TOKEN``.
``stop()`` releases every stop and ends the process.  As a context manager::

    with HubMirror(tmp_path / "hub") as hub:
        env["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".msgpack", ".h5", ".npz", ".tflite")
LFS_FROM_BYTES = 10 << 20
START_TIMEOUT_S = 30.0


class HubMirror:
    """The client side: starts the server process and steers it."""

    def __init__(self, root: Path, *, token: str | None = None, page_size: int = 1000, chunk: int = 64 * 1024):
        self.root = Path(root)
        self.token = token
        self.page_size = page_size
        self.chunk = chunk
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "the mirror is not started"
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HubMirror:
        self.root.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.TemporaryDirectory(prefix="hfmirror-")
        port_file = Path(self._dir.name) / "port"
        self.log = Path(self._dir.name) / "mirror.log"
        config = {"root": str(self.root), "token": self.token, "page_size": self.page_size,
                  "chunk": self.chunk, "port_file": str(port_file)}
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen([sys.executable, __file__, json.dumps(config)], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        # Imported here: the mirror's own process runs this file with no tests/ on its path.
        from tests.support.wait import NeverHappened, wait_for

        def output() -> str:
            return self.log.read_text(errors="replace")[-2000:]

        try:
            wait_for(lambda: port_file.exists() or self._proc.poll() is not None, START_TIMEOUT_S,
                     "the hub mirror to write its port", interval=0.02, detail=output)
        except NeverHappened:
            self.stop()
            raise
        if not port_file.exists():
            said = output()
            self.stop()
            raise AssertionError(f"the hub mirror exited before it wrote its port:\n{said}")
        self.port = int(port_file.read_text())
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> HubMirror:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _control(self, verb: str, **body):
        request = urllib.request.Request(f"{self.url}/_mirror/{verb}", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def hold(self, path: str, *stops: int) -> None:
        self._control("hold", path=path, stops=list(stops))

    def release(self, path: str) -> None:
        self._control("release", path=path)

    def let(self, path: str, n: int) -> None:
        self._control("let", path=path, n=n)

    def reached(self, path: str) -> int:
        return self._control("state")["reached"].get(path, 0)

    def cut(self, path: str, at: int, times: int = 1) -> None:
        self._control("cut", path=path, at=at, times=times)

    def corrupt(self, path: str) -> None:
        self._control("corrupt", path=path)

    def seen(self, path: str | None = None) -> list[dict]:
        """Requests, in order: ``{method, path, range, status, sent, authorization}``; of *path* only, if given."""
        seen = self._control("state")["seen"]
        return [s for s in seen if path is None or s["path"] == path]


# ---- the server process: only the standard library and Twisted below ----


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class _Repo:
    """A repository read from its directory: each file's size, hashes and whether it is LFS."""

    def __init__(self, org: str, name: str, directory: Path):
        self.id = f"{org}/{name}"
        self.directory = directory
        self.files: dict[str, dict] = {}
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            rel = path.relative_to(directory).as_posix()
            data = path.read_bytes()
            sha256 = hashlib.sha256(data).hexdigest()
            entry = {"type": "file", "path": rel, "size": len(data), "oid": git_blob_sha1(data)}
            if rel.endswith(LFS_SUFFIXES) or len(data) >= LFS_FROM_BYTES:
                pointer = _lfs_pointer(sha256, len(data))
                entry["oid"] = git_blob_sha1(pointer)
                entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": len(pointer)}
            self.files[rel] = entry
        self.folders = sorted({"/".join(rel.split("/")[:i]) for rel in self.files
                               for i in range(1, rel.count("/") + 1)})
        listing = json.dumps(sorted(self.files.values(), key=lambda e: e["path"]), sort_keys=True)
        self.commit = hashlib.sha1(f"{self.id}\n{listing}".encode()).hexdigest()

    def tree(self, under: str, recursive: bool) -> list[dict]:
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        entries = [{"type": "directory", "path": f, "size": 0, "oid": hashlib.sha1(f.encode()).hexdigest()}
                   for f in self.folders if f.startswith(prefix)]
        entries += [e for p, e in self.files.items() if p.startswith(prefix)]
        if not recursive:
            entries = [e for e in entries if "/" not in e["path"][len(prefix):]]
        return sorted(entries, key=lambda e: e["path"])

    def info(self, blobs: bool) -> dict:
        siblings = []
        for path, entry in self.files.items():
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["size"],
                                      "pointerSize": entry["lfs"]["pointerSize"]}
            siblings.append(sibling)
        return {"_id": self.commit[:24], "id": self.id, "modelId": self.id, "sha": self.commit,
                "private": False, "gated": False, "disabled": False, "downloads": 0, "likes": 0,
                "tags": [], "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": siblings}


def serve(config: dict) -> None:
    from twisted.internet import reactor
    from twisted.web import resource, server

    root = Path(config["root"])
    holds: dict[str, list[int]] = {}
    released: dict[str, int] = {}
    reached: dict[str, int] = {}
    cuts: dict[str, list[int]] = {}  # path -> [at, times]
    corrupt: set[str] = set()
    seen: list[dict] = []
    waiting: list = []  # responses held at a stop: (path, index, its Sender)

    repos: dict[str, tuple[tuple, _Repo]] = {}

    def repo_of(org: str, name: str) -> _Repo | None:
        """The repository at root/ORG/REPO as it is now; hashed again only when a file changed."""
        directory = root / org / name
        if not org or not name or org.startswith((".", "_")) or not directory.is_dir():
            return None
        stamp = tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns)
                             for p in directory.rglob("*") if p.is_file()))
        known = repos.get(str(directory))
        if known is None or known[0] != stamp:
            known = repos[str(directory)] = (stamp, _Repo(org, name, directory))
        return known[1]

    def error(request, code: int, message: str, kind: str | None = None) -> bytes:
        request.setResponseCode(code)
        request.setHeader(b"Content-Type", b"application/json")
        if kind:
            request.setHeader(b"X-Error-Code", kind.encode())
        return json.dumps({"error": message}).encode()

    def header(request, name: bytes) -> str | None:
        value = request.getHeader(name)
        return None if value is None else value.decode("latin-1")

    def wake(path: str) -> None:
        for item in list(waiting):
            if item[0] == path and released.get(path, 0) > item[1]:
                waiting.remove(item)
                reactor.callLater(0, item[2].send)

    class Mirror(resource.Resource):
        isLeaf = True

        def render_POST(self, request):
            parts = request.path.decode().split("/")
            if parts[:2] != ["", "_mirror"] or len(parts) != 3:
                return error(request, 404, "no such control")
            body = json.loads(request.content.read() or b"{}")
            verb, path = parts[2], body.get("path")
            if verb == "hold":
                holds[path] = sorted(body["stops"])
            elif verb == "let":
                for item in [w for w in waiting if w[0] == path]:
                    item[2].trickle(body["n"])
            elif verb == "release":
                released[path] = released.get(path, 0) + 1
                wake(path)
            elif verb == "cut":
                cuts[path] = [body["at"], body["times"]]
            elif verb == "corrupt":
                corrupt.add(path)
            elif verb != "state":
                return error(request, 404, f"no control {verb}")
            request.setHeader(b"Content-Type", b"application/json")
            return json.dumps({"seen": seen, "reached": reached}).encode()

        def render_HEAD(self, request):
            return self.render_GET(request)

        def render_GET(self, request):
            token = config.get("token")
            if token and header(request, b"authorization") != f"Bearer {token}":
                return error(request, 401, "Invalid credentials in Authorization header")
            raw = request.path.decode()
            segments = [unquote(s) for s in raw.split("/")[1:]]
            if segments[:2] == ["api", "models"] and len(segments) >= 4:
                record = {"method": request.method.decode(), "path": raw, "range": None,
                          "authorization": header(request, b"authorization"), "status": 0, "sent": 0}
                seen.append(record)
                body = self.api(request, segments[2:])
                repo = repo_of(segments[2], segments[3])
                record.update(status=request.code, sent=len(body), commit=repo and repo.commit)
                return body
            if len(segments) >= 5 and segments[2] == "resolve":
                return self.resolve(request, segments)
            return error(request, 404, "Not Found")

        def revision(self, request, repo: _Repo | None, rev: str):
            if repo is None:
                return None, error(request, 404, "Repository not found", "RepoNotFound")
            if rev not in ("main", repo.commit):
                return None, error(request, 404, f"Invalid rev id: {rev}", "RevisionNotFound")
            return repo, None

        def api(self, request, segments: list[str]):
            org, name, *rest = segments
            args = {k.decode(): v[0].decode() for k, v in request.args.items()}
            repo = repo_of(org, name)
            if not rest or rest[0] == "revision":
                repo, refused = self.revision(request, repo, rest[1] if len(rest) > 1 else "main")
                if refused is not None:
                    return refused
                request.setHeader(b"Content-Type", b"application/json")
                return json.dumps(repo.info(args.get("blobs", "").lower() in ("true", "1"))).encode()
            if rest[0] != "tree" or len(rest) < 2:
                return error(request, 404, "Not Found")
            repo, refused = self.revision(request, repo, rest[1])
            if refused is not None:
                return refused
            entries = repo.tree("/".join(rest[2:]), args.get("recursive", "").lower() in ("true", "1"))
            cursor = int(args.get("cursor", "0"))
            page = entries[cursor:cursor + config["page_size"]]
            if cursor + config["page_size"] < len(entries):
                query = "&".join(f"{k}={quote(v)}" for k, v in {**args, "cursor": str(cursor + len(page))}.items())
                here = urlsplit(request.uri.decode()).path
                host = request.getHost()
                request.setHeader(b"Link", f'<http://127.0.0.1:{host.port}{here}?{query}>; rel="next"'.encode())
            request.setHeader(b"Content-Type", b"application/json")
            return json.dumps(page).encode()

        def resolve(self, request, segments: list[str]):
            org, name, _, rev, *file_parts = segments
            repo, refused = self.revision(request, repo_of(org, name), rev)
            if refused is not None:
                return refused
            rel = "/".join(file_parts)
            entry = repo.files.get(rel)
            key = f"{repo.id}/{rel}"
            record = {"method": request.method.decode(), "path": key, "revision": rev, "range": header(request, b"range"),
                      "authorization": header(request, b"authorization"), "status": 0, "sent": 0}
            seen.append(record)
            if entry is None:
                record["status"] = 404
                return error(request, 404, f"{rel} does not exist at {rev}", "EntryNotFound")
            size = entry["size"]
            request.setHeader(b"X-Repo-Commit", repo.commit.encode())
            request.setHeader(b"Accept-Ranges", b"bytes")
            if "lfs" in entry:
                request.setHeader(b"ETag", f'"{entry["lfs"]["oid"]}"'.encode())
                request.setHeader(b"X-Linked-Etag", f'"{entry["lfs"]["oid"]}"'.encode())
                request.setHeader(b"X-Linked-Size", str(size).encode())
            else:
                request.setHeader(b"ETag", f'"{entry["oid"]}"'.encode())
            start, end = 0, size
            wanted = record["range"]
            if wanted and wanted.startswith("bytes="):
                first, _, last = wanted[len("bytes="):].partition("-")
                start = int(first)
                end = min(size, int(last) + 1) if last else size
                if start >= size:
                    record["status"] = 416
                    request.setResponseCode(416)
                    request.setHeader(b"Content-Range", f"bytes */{size}".encode())
                    return b""
                request.setResponseCode(206)
                request.setHeader(b"Content-Range", f"bytes {start}-{end - 1}/{size}".encode())
            record["status"] = request.code
            request.setHeader(b"Content-Length", str(end - start).encode())
            if request.method == b"HEAD":
                return b""
            data = (repo.directory / rel).read_bytes()
            if key in corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            cut = cuts.get(key)
            cut_at = None
            if cut and cut[1] > 0 and start < cut[0] < end:
                cut[1] -= 1
                cut_at = cut[0]
            Sender(request, key, data, start, end, record, cut_at).send()
            return server.NOT_DONE_YET

    class Sender:
        """One response body: in chunks, pausing at the stops, cutting where told."""

        def __init__(self, request, key, data, start, end, record, cut_at):
            self.request, self.key, self.data, self.pos, self.end = request, key, data, start, end
            self.record, self.cut_at = record, cut_at
            self.stops = [(i, s) for i, s in enumerate(holds.get(key, [])) if s > start]
            self.gone = False
            request.notifyFinish().addErrback(lambda _: setattr(self, "gone", True))

        def send(self) -> None:
            while not self.gone:
                limit = self.end
                if self.stops:
                    limit = min(limit, self.stops[0][1])
                if self.cut_at is not None:
                    limit = min(limit, self.cut_at)
                while self.pos < limit:
                    piece = self.data[self.pos:min(self.pos + config["chunk"], limit)]
                    self.request.write(piece)
                    self.pos += len(piece)
                    self.record["sent"] += len(piece)
                if self.cut_at is not None and self.pos >= self.cut_at:
                    self.request.transport.unregisterProducer()
                    self.request.transport.loseConnection()
                    return
                if self.stops and self.pos >= self.stops[0][1]:
                    index, _ = self.stops.pop(0)
                    reached[self.key] = reached.get(self.key, 0) + 1
                    if released.get(self.key, 0) <= index:
                        waiting.append((self.key, index, self))
                        return
                    continue
                self.request.finish()
                return

        def trickle(self, n: int) -> None:
            """*n* more bytes from where the response is held; it stays held after them."""
            if self.gone:
                return
            piece = self.data[self.pos:min(self.end, self.pos + n)]
            self.request.write(piece)
            self.pos += len(piece)
            self.record["sent"] += len(piece)
            self.stops = [stop for stop in self.stops if stop[1] > self.pos]

    def stop_all(*_):
        for path in holds:
            released[path] = len(holds[path]) + 1
            wake(path)
        reactor.callLater(0, reactor.stop)

    site = server.Site(Mirror())
    site.displayTracebacks = True
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    tmp = config["port_file"] + ".tmp"
    Path(tmp).write_text(str(port.getHost().port))
    os.replace(tmp, config["port_file"])
    signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(stop_all))
    reactor.run(installSignalHandlers=False)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))

"""What a model's ``source:`` names, and the name its fetched copy gets: a contract of two processes.

A source is one of

* an absolute path on the nodes (``/srv/models/gemma.gguf``): used where it
  is, never copied, never deleted;
* an ``https://…`` or ``http://…`` URL: fetched into the agent's weights
  directory;
* ``hf://ORG/REPO/FILE`` or ``hf://ORG/REPO@REV/FILE``: a file of a Hugging
  Face repository, fetched from ``<endpoint>/ORG/REPO/resolve/REV/FILE``
  (``REV`` defaults to ``main``; it is one path segment — a branch, a tag or
  a commit — so a ref with slashes is written percent-encoded,
  ``@refs%2Fpr%2F1``).  ``FILE`` may name a file in a folder of the repository
  (``hf://ORG/REPO/q4/model.gguf``).

* ``hf://ORG/REPO`` or ``hf://ORG/REPO@REV`` (no file): the whole repository
  at that revision — every file, or those the model's ``files:`` patterns
  allow — fetched into one directory, as vLLM and SGLang load a model;
* ``hf://ORG/REPO/NAME-00001-of-00003.gguf``: the first part of a split GGUF
  fetches every part, under their own names in one directory, since
  llama.cpp finds the other parts beside the first by name.

A fetched file is stored under its *cache name*,
``llmgw-<first 16 hex digits of sha256(source)>-<safe file name>``.  The
hash is of the source exactly as the catalog writes it, so the set of files
llmgw fetched for a catalog is a calculation, not a guess: anything in the
directory without such a name was put there by somebody else.  A
repository, or the parts of a split GGUF, is a directory under such a name;
with ``files:`` patterns, ``llmgw-<16 hex>-<8 hex of the patterns>-<name>``,
since another model may want other files of the same repository.

The control plane and the agent both compute cache names — the control
plane to tell which node holds a model and which files nobody wants, the
agent to fetch and to check what it is asked to remove — so the scheme lives
here, outside either package.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import attrs

HF_ENDPOINT = "https://huggingface.co"
PARTIAL_SUFFIX = ".partial"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CACHE_NAME = re.compile(r"llmgw-[0-9a-f]{16}-[A-Za-z0-9._-]{1,80}")
_HF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HF_REV = re.compile(r"[A-Za-z0-9._%-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# llama.cpp's gguf-split names: the stem, this part's number and the count, five digits each.
SPLIT_GGUF = re.compile(r"(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")
MAX_SPLIT_PARTS = 1000


@attrs.frozen
class WeightsSource:
    """A parsed ``source:``.  ``url`` is None for a local path and a repository, ``path`` for a URL.

    ``layout`` is what a fetch makes: ``"file"``, or a directory —
    ``"repository"`` (``hf://ORG/REPO[@REV]``) or ``"parts"`` (a split GGUF's
    first part, fetched with the others).
    """

    text: str  # as the catalog wrote it; the cache name hashes this
    kind: str  # "path" | "http" | "hf"
    file_name: str  # what a person calls it: "gemma-3-270m-q4_k_m.gguf"
    path: str | None = None
    url: str | None = None
    layout: str = "file"  # "file" | "repository" | "parts"
    # hf:// only: "ORG/REPO", the revision as written ("main" when none), the
    # endpoint, and the file's path in the repository ("" for a repository).
    repository: str | None = None
    revision: str | None = None
    endpoint: str | None = None
    repo_path: str | None = None

    @property
    def fetched(self) -> bool:
        return self.kind != "path"

    @property
    def directory(self) -> bool:
        """Whether a fetch of it makes a directory (a repository, or a split GGUF's parts)."""
        return self.layout != "file"

    def part_names(self) -> list[str]:
        """The repository paths of every part of a split GGUF, the first one first."""
        match = SPLIT_GGUF.fullmatch(self.file_name)
        assert self.layout == "parts" and match is not None and self.repo_path is not None
        folder = self.repo_path[: len(self.repo_path) - len(self.file_name)]
        count = int(match.group("count"))
        return [f"{folder}{match.group('stem')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def parse(source: object, *, hf_endpoint: str = HF_ENDPOINT) -> WeightsSource:
    """The :class:`WeightsSource` *source* names, or ``ValueError`` saying what to write instead."""
    if not isinstance(source, str):
        raise ValueError(f"a source is a string (a path on the nodes or a URL), not {type(source).__name__}")
    if not source:
        raise ValueError("the source is empty; give the weights' path on the nodes or a URL")
    if source != source.strip():
        raise ValueError(f"source {source!r} has spaces at its ends; remove them")
    if _CONTROL.search(source):
        raise ValueError(f"source {source!r} contains a control character (a NUL or a newline); remove it")
    if source.startswith("/"):
        return WeightsSource(text=source, kind="path", file_name=Path(source).name or source, path=source)
    scheme, sep, _ = source.partition("://")
    if not sep:
        raise ValueError(
            f"source {source!r} is neither an absolute path nor a URL; write the path on the nodes "
            "from / (a relative path depends on the agent's working directory), or "
            "https://…, or hf://ORG/REPO/FILE"
        )
    scheme = scheme.lower()
    if scheme == "hf":
        return _parse_hf(source, hf_endpoint)
    if scheme in ("http", "https"):
        return _parse_http(source)
    if scheme == "file":
        raise ValueError(f"source {source!r}: write a local file as its path (/…), without file://")
    raise ValueError(f"source {source!r}: llmgw fetches https://, http:// and hf:// URLs, not {scheme}://")


def _parse_http(source: str) -> WeightsSource:
    if not source.isascii() or " " in source:
        raise ValueError(
            f"source {source!r}: a URL must be ASCII without spaces; percent-encode the rest (%20 for a space)"
        )
    try:
        parts = urlsplit(source)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"source {source!r} is not a URL: {e}") from None
    del port
    if not parts.hostname:
        raise ValueError(f"source {source!r} names no host; write https://HOST/PATH")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"the source for host {parts.hostname} carries credentials in the URL, which would be logged "
            "and shown; "
            "serve the file without them, or use hf:// with HF_TOKEN for Hugging Face"
        )
    if parts.fragment:
        raise ValueError(f"source {source!r} has a #fragment, which is never sent to the server; remove it")
    name = unquote(parts.path.rsplit("/", 1)[-1]) or parts.hostname
    return WeightsSource(text=source, kind="http", file_name=name, url=source)


def _parse_hf(source: str, hf_endpoint: str) -> WeightsSource:
    rest = source[len("hf://"):]
    segments = rest.split("/")
    if len(segments) < 2 or not all(segments):
        raise ValueError(
            f"source {source!r}: write hf://ORG/REPO for a whole repository, or hf://ORG/REPO/FILE, "
            "with @REVISION after REPO if not main "
            "(for example hf://unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf)"
        )
    org, repo, *file_parts = segments
    repo, at, revision = repo.partition("@")
    if at and not revision:
        raise ValueError(f"source {source!r}: nothing after @; give a branch, tag or commit, or leave out the @")
    revision = revision or "main"
    for what, value in (("organisation", org), ("repository", repo)):
        if not _HF_NAME.fullmatch(value):
            raise ValueError(
                f"source {source!r}: {what} {value!r} is not a Hugging Face name "
                "(letters, digits, '.', '_' and '-', starting with a letter or digit)"
            )
    if not _HF_REV.fullmatch(revision):
        raise ValueError(
            f"source {source!r}: revision {revision!r} must be one segment of letters, digits, '.', '_', '-'; "
            "percent-encode a slash (refs%2Fpr%2F1)"
        )
    for part in file_parts:
        if part in (".", "..") or "\\" in part or "?" in part or "#" in part:
            raise ValueError(f"source {source!r}: file path segment {part!r} is not allowed")
    endpoint = hf_endpoint.rstrip("/")
    where = dict(repository=f"{org}/{repo}", revision=revision, endpoint=endpoint, repo_path="/".join(file_parts))
    if not file_parts:
        return WeightsSource(text=source, kind="hf", file_name=repo, layout="repository", **where)
    split = SPLIT_GGUF.fullmatch(file_parts[-1])
    if split is not None:
        index, count = int(split.group("index")), int(split.group("count"))
        if not 1 <= count <= MAX_SPLIT_PARTS or not 1 <= index <= count:
            raise ValueError(f"source {source!r}: part {index} of {count} is not a split GGUF's part "
                             f"(1 to {MAX_SPLIT_PARTS} parts)")
        if index != 1:
            first = f"{split.group('stem')}-00001-of-{count:05d}.gguf"
            raise ValueError(f"source {source!r}: name the first part, {first}; llmgw fetches every part "
                             "beside it, where llama.cpp looks for them")
        return WeightsSource(text=source, kind="hf", file_name=file_parts[-1], layout="parts", **where)
    file_path = "/".join(quote(p, safe="") for p in file_parts)
    url = f"{endpoint}/{org}/{repo}/resolve/{revision}/{file_path}"
    return WeightsSource(text=source, kind="hf", file_name=file_parts[-1], url=url, **where)


def _safe_file_name(source: str, room: int) -> str:
    try:
        name = parse(source).file_name
    except ValueError:
        name = source.rstrip("/").rsplit("/", 1)[-1]
    safe = _UNSAFE.sub("_", name)[-room:].lstrip(".")
    if safe.endswith(PARTIAL_SUFFIX):
        # A file that ends in .partial would read as an unfinished download.
        safe = safe[:-len(PARTIAL_SUFFIX)] + "_partial"
    return safe or "weights"


def patterns_key(files: object) -> str:
    """The ``files:`` patterns as one string, whatever their order; "" for none (every file)."""
    if not files or isinstance(files, str):
        return ""
    return "\n".join(sorted({f for f in files if isinstance(f, str)}))


def source_prefix(source: str) -> str:
    """``llmgw-<sha256(source)[:16]>-``: how every cache name of *source* starts, with any patterns."""
    return f"llmgw-{hashlib.sha256(source.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}-"


def cache_name(source: str, files: object = ()) -> str:
    """``llmgw-<sha256(source)[:16]>-<safe file name>``: the name a fetched *source* is stored under.

    Defined for any string, valid or not, so a catalog entry always protects
    the file named after it, whatever this version thinks of its syntax.
    With *files* (a repository's ``files:`` patterns), 8 hex digits of
    their digest come before the name.
    """
    patterns = patterns_key(files)
    if not patterns:
        return source_prefix(source) + _safe_file_name(source, 80)
    digest = hashlib.sha256(patterns.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{source_prefix(source)}{digest}-{_safe_file_name(source, 71)}"


def partial_name(source: str, files: object = ()) -> str:
    """The temporary name a download of *source* is written under until it is verified."""
    return cache_name(source, files) + PARTIAL_SUFFIX


def is_cache_name(name: object) -> bool:
    """True for a file name llmgw gives a finished download (not a ``.partial``)."""
    return (isinstance(name, str) and _CACHE_NAME.fullmatch(name) is not None
            and not name.endswith(PARTIAL_SUFFIX))

"""llmgw's own wheel, made from the llmgw this process runs: its installed distribution, or the source tree it runs from.

Onboarding installs on a node exactly the llmgw the operator runs, never a
package of that name from an index.  Where this llmgw was installed by pip
(a ``llmgw-*.dist-info`` with a ``RECORD`` beside the package), its files
are read back as the ``RECORD`` lists them, each checked against the sha256
pip recorded, and zipped again into a wheel (entries sorted, timestamps
fixed, so the same installation makes the same bytes).  Where it runs from
a source tree (``src/llmgw`` beside a ``setup.cfg``: a checkout, or an
editable install), that tree is built with ``pip wheel --no-deps``.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import attrs

from llmgw.ctl.ssh import Refusal
from llmgw.text import printable

BUILD_TIMEOUT_S = 600
# Written by pip at install time: no part of the wheel it installed from.
_INSTALL_ONLY = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")
_EPOCH = (1980, 1, 1, 0, 0, 0)


@attrs.frozen
class Running:
    """Where the running llmgw comes from: ``installed`` (its dist-info) or ``source`` (the tree's root)."""

    kind: str
    path: Path
    version: str

    def digest(self) -> str:
        """sha256 over what this llmgw is made of: the RECORD pip wrote, or every source file of the tree."""
        digest = hashlib.sha256(self.kind.encode() + b"\0" + self.version.encode() + b"\0")
        if self.kind == "installed":
            digest.update((self.path / "RECORD").read_bytes())
            return digest.hexdigest()
        for path in _source_files(self.path):
            digest.update(str(path.relative_to(self.path)).encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()


def running(package_file: str | None = None) -> Running:
    """The llmgw this process runs (or the one whose ``__init__.py`` is *package_file*), and where it comes from."""
    import llmgw

    package = Path(package_file or llmgw.__file__).resolve().parent
    for info in sorted(package.parent.glob("llmgw-*.dist-info")):
        record = info / "RECORD"
        if record.is_file() and any(row[:1] == ["llmgw/__init__.py"] for row in _rows(record)):
            return Running("installed", info, _version_of(info))
    root = package.parent.parent
    if package.parent.name == "src" and (root / "setup.cfg").is_file():
        return Running("source", root, llmgw.__version__)
    raise Refusal(f"the llmgw this runs ({printable(str(package))}) is neither an installed distribution nor a "
                  "source tree, so onboarding cannot make its wheel; give --wheels DIR, a wheelhouse made by "
                  "`llmgw ctl wheelhouse DIR` where llmgw is installed")


def build(source: Running, into: Path) -> Path:
    """llmgw's wheel from *source*, written into *into*; its path."""
    if source.kind == "installed":
        return _rezip(source.path, into)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
            "--wheel-dir", str(into), str(source.path)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Refusal(f"building llmgw's wheel from {source.path} took more than {BUILD_TIMEOUT_S} s") from None
    made = sorted(into.glob(f"llmgw-{source.version}-*.whl"))
    if out.returncode != 0 or len(made) != 1:
        raise Refusal(f"building llmgw's wheel from the source tree {source.path} failed (pip wheel, exit status "
                      f"{out.returncode}): {printable(out.stderr.strip()[-1500:])}")
    return made[0]


def _rezip(info: Path, into: Path) -> Path:
    """The installed distribution *info* zipped into a wheel, each file checked against the sha256 pip recorded."""
    site = info.parent
    version = _version_of(info)
    tags = [line.split(":", 1)[1].strip() for line in (info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")]
    if not tags:
        raise Refusal(f"{info / 'WHEEL'} names no tag; reinstall llmgw (pip install --force-reinstall)")
    entries = []
    for row in _rows(info / "RECORD"):
        name, recorded = row[0], row[1] if len(row) > 1 else ""
        if name.startswith(("..", "/")) or "__pycache__/" in name or name.endswith(".pyc"):
            continue  # a console script (made again from entry_points.txt), bytecode
        if name.startswith(f"{info.name}/") and name.split("/", 1)[1] in _INSTALL_ONLY:
            continue
        data = (site / name).read_bytes()
        if recorded and recorded != _record_hash(data):
            raise Refusal(f"{site / name} is not the file pip installed (its sha256 differs from {info / 'RECORD'}'s), "
                          "so this is not an llmgw a node should run; reinstall llmgw here "
                          "(pip install --force-reinstall) and onboard again")
        entries.append((name, data))
    wheel = into / f"llmgw-{version}-{'.'.join(sorted({t.split('-')[0] for t in tags}))}-" \
                   f"{'.'.join(sorted({t.split('-')[1] for t in tags}))}-{'.'.join(sorted({t.split('-')[2] for t in tags}))}.whl"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted(entries):
            _add(z, name, data)
            writer.writerow([name, _record_hash(data), len(data)])
        writer.writerow([f"{info.name}/RECORD", "", ""])
        _add(z, f"{info.name}/RECORD", record.getvalue().encode())
    return wheel


def _add(z: zipfile.ZipFile, name: str, data: bytes) -> None:
    entry = zipfile.ZipInfo(name, date_time=_EPOCH)
    entry.compress_type = zipfile.ZIP_DEFLATED
    entry.external_attr = 0o644 << 16
    z.writestr(entry, data)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _rows(record: Path) -> list[list[str]]:
    return [row for row in csv.reader(record.read_text(encoding="utf-8").splitlines()) if row]


def _version_of(info: Path) -> str:
    for line in (info / "METADATA").read_text(encoding="utf-8").splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise Refusal(f"{info / 'METADATA'} says no version; reinstall llmgw (pip install --force-reinstall)")


def _source_files(root: Path) -> list[Path]:
    found = [root / n for n in ("setup.cfg", "pyproject.toml", "setup.py", "README.rst") if (root / n).is_file()]
    for top in (root / "src" / "llmgw", root / "twisted" / "plugins"):
        found += [p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(found)

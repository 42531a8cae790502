"""archive.extract: what a release archive may write, and that a refused one leaves nothing behind."""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmgw.agent.engines.archive import UnsafeArchive, extract

# (name, kind, payload): kind is file | exec | dir | symlink | hardlink | fifo | chr | blk | sock;
# payload is a file's bytes or a link's target.
Member = tuple[str, str, "bytes | str"]


def make_tar(path: Path, members: list[Member], compression: str = "gz") -> Path:
    types = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
             "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE}
    with tarfile.open(path, f"w:{compression}") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind in ("file", "exec"):
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                info.mode = 0o755 if kind == "exec" else 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = types[kind]
            info.mode = 0o755
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
            tar.addfile(info)
    return path


def make_zip(path: Path, members: list[Member]) -> Path:
    modes = {"file": stat.S_IFREG | 0o644, "exec": stat.S_IFREG | 0o755, "dir": stat.S_IFDIR | 0o755,
             "symlink": stat.S_IFLNK | 0o777, "fifo": stat.S_IFIFO | 0o644, "chr": stat.S_IFCHR | 0o644,
             "blk": stat.S_IFBLK | 0o644, "sock": stat.S_IFSOCK | 0o644}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, warnings.catch_warnings():
        # A repeated name is what some tests are about.
        warnings.simplefilter("ignore", UserWarning)
        for name, kind, payload in members:
            info = zipfile.ZipInfo(name + ("/" if kind == "dir" and not name.endswith("/") else ""))
            info.create_system = 3
            info.external_attr = modes[kind] << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, payload if kind != "dir" else b"")
    return path


def make(tmp_path: Path, fmt: str, members: list[Member], name: str = "llama.bin") -> Path:
    path = tmp_path / name
    return make_zip(path, members) if fmt == "zip" else make_tar(path, members, fmt)


def refusal(archive: Path, dest: Path, **limits) -> str:
    with pytest.raises(UnsafeArchive) as caught:
        extract(archive, dest, **limits)
    assert not os.path.lexists(dest), "a refused archive leaves its directory behind"
    return str(caught.value)


GOOD: list[Member] = [
    ("llama-b6000/", "dir", ""),
    ("llama-b6000/llama-server", "exec", b"\x7fELF server"),
    ("llama-b6000/LICENSE", "file", b"MIT"),
    ("llama-b6000/libllama.so.0.0.6000", "exec", b"\x7fELF lib"),
    ("llama-b6000/libllama.so.0", "symlink", "libllama.so.0.0.6000"),
    ("llama-b6000/libllama.so", "symlink", "libllama.so.0"),
    ("llama-b6000/share/empty", "file", b""),
]


@pytest.mark.parametrize("fmt", ["gz", "xz", "bz2", "", "zip"])
def test_a_release_archive_unpacks_with_its_links_and_executable_bits(tmp_path, fmt):
    # Named .zip whatever it is: the content says what it is, not the name.
    archive = make(tmp_path, fmt, GOOD, name="llama-b6000-bin-ubuntu-x64.zip")
    dest = tmp_path / "out"
    written = extract(archive, dest)
    top = dest / "llama-b6000"
    assert written == [name.rstrip("/") for name, _, _ in GOOD]
    assert (top / "llama-server").read_bytes() == b"\x7fELF server"
    assert os.access(top / "llama-server", os.X_OK)
    assert (top / "LICENSE").stat().st_mode & 0o777 == 0o644
    assert os.readlink(top / "libllama.so") == "libllama.so.0"
    assert (top / "libllama.so").read_bytes() == b"\x7fELF lib"
    assert (top / "share" / "empty").read_bytes() == b""


def test_a_tar_hardlink_becomes_a_copy_of_the_file_it_names(tmp_path):
    archive = make_tar(tmp_path / "a.tar", [("bin/llama-server", "exec", b"x" * 10),
                                            ("bin/server", "hardlink", "bin/llama-server")], "")
    extract(archive, tmp_path / "out")
    copy = tmp_path / "out" / "bin" / "server"
    assert copy.read_bytes() == b"x" * 10 and os.access(copy, os.X_OK)
    assert copy.stat().st_ino != (tmp_path / "out" / "bin" / "llama-server").stat().st_ino


def test_a_directory_named_twice_is_written_once(tmp_path):
    archive = make(tmp_path, "gz", [("lib/libggml.so", "file", b"x"), ("lib/", "dir", ""), ("./lib/", "dir", "")])
    assert extract(archive, tmp_path / "out") == ["lib/libggml.so", "lib"]


def test_setuid_and_other_mode_bits_are_not_kept(tmp_path):
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("su")
        info.mode, info.size = 0o4777, 1
        tar.addfile(info, io.BytesIO(b"x"))
    extract(path, tmp_path / "out")
    assert (tmp_path / "out" / "su").stat().st_mode & 0o7777 == 0o755


BOTH = ["gz", "zip"]


@pytest.mark.parametrize("fmt", BOTH)
@pytest.mark.parametrize("members, sentence", [
    ([("/etc/passwd", "file", b"x")],
     "llama.bin: member '/etc/passwd' is an absolute path: an engine archive unpacks only below its own directory"),
    ([("bin/../../escape", "file", b"x")],
     "llama.bin: member 'bin/../../escape' has a '..' component: unpacking it would write outside its directory"),
    ([("..\\escape", "file", b"x")],
     "llama.bin: member '..\\\\escape' has a '..' component: unpacking it would write outside its directory"),
    ([("lib", "symlink", "../../etc")],
     "llama.bin: member 'lib' is a symlink to '../../etc', which lands outside its directory"),
    ([("lib", "symlink", "/etc")],
     "llama.bin: member 'lib' is a symlink to the absolute path '/etc', outside its directory"),
    # Each link stays inside on its own; followed one through the other, the second climbs out.
    ([("a/b", "symlink", ".."), ("a/c", "symlink", "b/..")],
     "llama.bin: member 'a/c' is a symlink to 'b/..', which lands outside its directory"),
    ([("a", "dir", ""), ("a", "file", b"x")],
     "llama.bin: member 'a' repeats the directory 'a' as a file"),
    ([("a", "file", b"x"), ("a/b", "file", b"x")],
     "llama.bin: member 'a/b' repeats 'a', a file, as a directory"),
    ([("a", "file", b"x"), ("a", "file", b"y")],
     "llama.bin: member 'a' repeats 'a', a file written earlier"),
    ([("sub/", "dir", ""), ("lib", "symlink", "sub"), ("lib/libggml.so", "file", b"x")],
     "llama.bin: member 'lib/libggml.so' writes through the symlink 'lib' written earlier"),
    ([("lib", "symlink", "sub"), ("lib", "file", b"x")],
     "llama.bin: member 'lib' repeats 'lib', a symlink written earlier"),
    ([("q", "fifo", b"")],
     "llama.bin: member 'q' is a fifo: an engine archive holds only files, directories and links"),
    ([("dev/sda", "chr", b"")],
     "llama.bin: member 'dev/sda' is a character device: an engine archive holds only files, directories and links"),
])
def test_each_unsafe_member_is_refused_in_its_own_words(tmp_path, fmt, members, sentence):
    assert refusal(make(tmp_path, fmt, members), tmp_path / "out") == sentence


def test_a_link_that_comes_to_point_outside_through_a_later_link_is_refused_at_the_end(tmp_path):
    # x -> y/.. is dest itself when written; once y -> . exists, x is dest's parent.
    archive = make(tmp_path, "gz", [("x", "symlink", "y/.."), ("y", "symlink", ".")])
    assert refusal(archive, tmp_path / "out") == (
        "llama.bin: member 'x' is a symlink to 'y/..', which lands outside its directory through links written after it"
    )


def test_a_block_device_in_a_tar_and_a_socket_in_a_zip_are_refused(tmp_path):
    assert refusal(make(tmp_path, "", [("disk", "blk", b"")]), tmp_path / "out") == (
        "llama.bin: member 'disk' is a block device: an engine archive holds only files, directories and links"
    )
    zip_archive = make_zip(tmp_path / "s.zip", [("ok", "file", b"x"), ("sock", "sock", b"")])
    assert refusal(zip_archive, tmp_path / "out") == (
        "s.zip: member 'sock' is a socket: an engine archive holds only files, directories and links"
    )


@pytest.mark.parametrize("members, sentence", [
    ([("bin/server", "hardlink", "../../etc/passwd")],
     "llama.bin: member 'bin/server' is a hardlink to '../../etc/passwd', outside its directory"),
    ([("bin/server", "hardlink", "/etc/passwd")],
     "llama.bin: member 'bin/server' is a hardlink to '/etc/passwd', outside its directory"),
    ([("up", "symlink", ".."), ("bin/server", "hardlink", "up/passwd")],
     "llama.bin: member 'up' is a symlink to '..', which lands outside its directory"),
    ([("lib", "symlink", "."), ("bin/server", "hardlink", "lib")],
     "llama.bin: member 'bin/server' is a hardlink to 'lib', which is not a file unpacked before it"),
    ([("bin/server", "hardlink", "llama-server")],
     "llama.bin: member 'bin/server' is a hardlink to 'llama-server', which is not a file unpacked before it"),
])
def test_a_hardlink_must_name_a_file_already_unpacked(tmp_path, members, sentence):
    assert refusal(make(tmp_path, "gz", members), tmp_path / "out") == sentence


@pytest.mark.parametrize("fmt", BOTH)
def test_more_members_than_the_limit_are_refused(tmp_path, fmt):
    archive = make(tmp_path, fmt, [(f"f{i}", "file", b"x") for i in range(3)])
    sentence = refusal(archive, tmp_path / "out", max_members=2)
    assert sentence in ("llama.bin holds more than 2 members (at 'f2'): that is not an engine build",
                        "llama.bin holds 3 members, more than 2: that is not an engine build")


def test_a_tar_bigger_than_the_limit_is_refused_at_the_member_that_passes_it(tmp_path):
    archive = make(tmp_path, "gz", [("a", "file", b"x" * 600), ("b", "file", b"x" * 600)])
    assert refusal(archive, tmp_path / "out", max_bytes=1024) == (
        "llama.bin unpacks to more than 1024 bytes (at 'b'): that is not an engine build"
    )


def test_a_zip_bigger_than_the_limit_is_refused_before_anything_is_written(tmp_path):
    archive = make(tmp_path, "zip", [("a", "file", b"\0" * 3000)])
    assert refusal(archive, tmp_path / "out", max_bytes=2048) == (
        "llama.bin says it unpacks to 3000 bytes, more than 2048 bytes: that is not an engine build"
    )


def test_the_bytes_written_count_where_the_declared_sizes_do_not(tmp_path):
    # Hardlinks declare no size and are written as copies: counted as written.
    members = [("a", "file", b"x" * 600)] + [(f"l{i}", "hardlink", "a") for i in range(3)]
    assert refusal(make(tmp_path, "gz", members), tmp_path / "out", max_bytes=2000) == (
        "llama.bin unpacks to more than 2000 bytes (at 'l2'): that is not an engine build"
    )


def test_a_zip_that_lies_about_its_sizes_is_refused(tmp_path):
    archive = make_zip(tmp_path / "bomb.zip", [("big", "file", b"\0" * 100_000)])
    data = bytearray(archive.read_bytes())
    # Declare 10 bytes in the local header (offset 22) and the central directory (offset 24).
    struct.pack_into("<I", data, 22, 10)
    struct.pack_into("<I", data, data.index(b"PK\x01\x02") + 24, 10)
    archive.write_bytes(bytes(data))
    sentence = refusal(archive, tmp_path / "out", max_bytes=1000)
    assert sentence.startswith("bomb.zip is not a complete archive: "), sentence


@pytest.mark.parametrize("fmt", ["gz", "xz", "bz2", "", "zip"])
def test_a_truncated_archive_is_not_a_complete_archive(tmp_path, fmt):
    members = [("llama-server", "exec", os.urandom(200_000)), ("libllama.so", "file", os.urandom(50_000))]
    archive = make(tmp_path, fmt, members, name="cut")
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    sentence = refusal(archive, tmp_path / "out")
    assert sentence.startswith("cut is not a complete archive: "), sentence


def test_a_file_that_is_no_archive_at_all_says_what_it_starts_with(tmp_path):
    page = tmp_path / "llama.zip"
    page.write_bytes(b"<!DOCTYPE html><html>Not Found</html>")
    assert refusal(page, tmp_path / "out") == (
        "llama.zip is not a complete archive: it starts with 3c 21 44 4f 43 54 59 50, which is neither tar nor zip"
    )
    (tmp_path / "empty").write_bytes(b"")
    assert refusal(tmp_path / "empty", tmp_path / "out") == "empty is not a complete archive: it is empty"


def test_a_damaged_member_of_a_zip_is_caught_by_its_crc(tmp_path):
    archive = make_zip(tmp_path / "a.zip", [("llama-server", "exec", b"A" * 5000)])
    data = bytearray(archive.read_bytes())
    data[40] ^= 0xFF  # inside the first member's compressed data
    archive.write_bytes(bytes(data))
    assert refusal(archive, tmp_path / "out").startswith("a.zip is not a complete archive: ")


def test_an_existing_directory_is_neither_used_nor_removed(tmp_path):
    archive = make(tmp_path, "gz", GOOD)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists: an archive is unpacked only into a new directory"):
        extract(archive, dest)
    assert (dest / "keep").read_text() == "mine"


# -- any archive at all ------------------------------------------------------

def _paths(parts: list[str], absolute: int):
    """Paths of up to four *parts*, one in *absolute* of them absolute."""
    slash = st.sampled_from(["/"] + [""] * (absolute - 1))
    return st.tuples(slash, st.lists(st.sampled_from(parts), min_size=1, max_size=4)).map(
        lambda t: t[0] + "/".join(t[1])
    ).filter(lambda name: name.strip("/") != "")


# Names mostly plain, so that members get written and links get followed;
# targets climbing often, so that a link that escapes is common.
_name = _paths(["a"] * 6 + ["b"] * 6 + ["lib"] * 6 + [".", "", ".."], absolute=24)
_target = _paths(["a", "b", "lib", "..", "..", ".", ""], absolute=6)
_common = ["file", "file", "exec", "dir", "dir", "dir"] + ["symlink"] * 6
_tar_kind = st.sampled_from(_common + ["hardlink", st.sampled_from(["fifo", "chr", "blk"])]).flatmap(
    lambda k: k if isinstance(k, st.SearchStrategy) else st.just(k))
_zip_kind = st.sampled_from(_common + [st.sampled_from(["fifo", "chr", "sock"])]).flatmap(
    lambda k: k if isinstance(k, st.SearchStrategy) else st.just(k))


def _members(kinds):
    return st.lists(st.tuples(_name, kinds, _target, st.binary(max_size=8)), max_size=5).map(
        lambda ms: [(n, k, t if k in ("symlink", "hardlink") else data) for n, k, t, data in ms]
    )


def _unpack_somewhere(fmt: str, members: list[Member]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        try:
            archive = make(base, fmt, members)
        except (ValueError, OSError, tarfile.TarError):
            assume(False)
        inner = base / "outer" / "inner"
        inner.mkdir(parents=True)
        dest = inner / "dest"
        try:
            extract(archive, dest)
        except UnsafeArchive:
            assert not os.path.lexists(dest)
        else:
            root = os.path.realpath(dest)
            for where, dirs, files in os.walk(dest):
                for entry in dirs + files:
                    path = os.path.join(where, entry)
                    assert os.path.commonpath([root, os.path.realpath(path)]) == root, path
                    mode = os.lstat(path).st_mode
                    assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)
                                or stat.S_ISSOCK(mode)), path
        outside = sorted(str(p.relative_to(base)) for p in base.rglob("*") if dest not in [p, *p.parents])
        assert outside == ["llama.bin", "outer", "outer/inner"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(members=_members(_tar_kind))
def test_no_tar_writes_outside_its_directory_or_makes_a_device(members):
    _unpack_somewhere("gz", members)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(members=_members(_zip_kind))
def test_no_zip_writes_outside_its_directory_or_makes_a_device(members):
    _unpack_somewhere("zip", members)


_safe_name = st.lists(st.sampled_from(["bin", "lib", "llama-server", "x.so"]), min_size=1, max_size=3).map("/".join)


@st.composite
def _trees(draw):
    files = draw(st.dictionaries(_safe_name, st.tuples(st.binary(max_size=64), st.booleans()), max_size=8))
    # A path that is also another's directory cannot be a file too.
    return {n: v for n, v in files.items() if not any(o.startswith(n + "/") for o in files)}


@settings(max_examples=60, deadline=None)
@given(tree=_trees(), fmt=st.sampled_from(["gz", "zip"]))
def test_a_good_archive_round_trips(tree, fmt):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        members = [(n, "exec" if x else "file", data) for n, (data, x) in tree.items()]
        extract(make(base, fmt, members), base / "out")
        got = {
            str(p.relative_to(base / "out")): (p.read_bytes(), bool(p.stat().st_mode & 0o111))
            for p in (base / "out").rglob("*") if p.is_file()
        }
        assert got == tree


# -- a real build -------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["gz", "zip"])
def test_a_real_llama_server_packed_as_a_release_runs_once_unpacked(tmp_path, fmt):
    import subprocess

    from tests.support.engines import llama_server

    built = Path(llama_server(tmp_path / "built")).parent
    if not (built / "libllama.so.0").is_symlink():
        pytest.skip(f"{built} is not a directory laid out like a release (libllama.so.0 -> …)")
    # As the release does: one top folder, the libraries' soname chains as links.
    members: list[Member] = [("llama-b6000/", "dir", "")]
    for path in sorted(built.iterdir()):
        name = f"llama-b6000/{path.name}"
        if path.is_symlink():
            members.append((name, "symlink", os.readlink(path)))
        elif path.is_file():
            members.append((name, "exec" if os.access(path, os.X_OK) else "file", path.read_bytes()))
    extract(make(tmp_path, fmt, members), tmp_path / "out")
    server = tmp_path / "out" / "llama-b6000" / "llama-server"
    ran = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "version:" in ran.stdout + ran.stderr, ran.stdout + ran.stderr

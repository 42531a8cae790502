"""Memory and disk, measured on this machine and compared with what the OS says."""

from __future__ import annotations

import collections
import os

import psutil
import pytest

from llmgw.agent.discovery import memory, sample, storage

GIB = 1 << 30


def test_memory_is_what_the_kernel_says():
    total, available = memory.probe()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert abs(available - vm.available) < max(GIB // 4, vm.total // 20)


def test_memory_is_read_again_for_each_heartbeat(monkeypatch):
    # A VM given more memory becomes a candidate without restarting its agent.
    Reading = collections.namedtuple("Reading", "total available")
    readings = iter([Reading(8 * GIB, 6 * GIB), Reading(32 * GIB, 30 * GIB)])
    monkeypatch.setattr(psutil, "virtual_memory", lambda: next(readings))
    first, second = sample(weights_dirs=[]), sample(weights_dirs=[])
    assert (first.memory_total_bytes, second.memory_total_bytes) == (8 * GIB, 32 * GIB)


def test_a_weights_dir_is_its_filesystem(tmp_path):
    (fs,) = storage.probe([str(tmp_path)])

    vfs = os.statvfs(tmp_path)
    assert fs.weights_dirs == [str(tmp_path)]
    assert os.path.ismount(fs.mountpoint)
    assert str(tmp_path.resolve()).startswith(fs.mountpoint)
    assert fs.total_bytes == vfs.f_blocks * vfs.f_frsize
    # Something else on this machine may be writing as we measure.
    assert abs(fs.free_bytes - vfs.f_bavail * vfs.f_frsize) < GIB // 4
    assert 0 <= fs.free_bytes <= fs.total_bytes
    types = [p.fstype for p in psutil.disk_partitions(all=True) if p.mountpoint == fs.mountpoint]
    assert fs.fstype == types[-1]
    assert fs.shared is (fs.fstype in storage.SHARED_FSTYPES)


def test_two_dirs_on_one_filesystem_are_one_entry(tmp_path):
    # Counted per directory, 24 GB twice would take a 40 GB model.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (fs,) = storage.probe([str(a), str(b)])
    assert fs.weights_dirs == [str(a), str(b)]


def test_a_link_to_a_dir_is_the_same_filesystem(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (fs,) = storage.probe([str(tmp_path / "real"), str(tmp_path / "link")])
    assert len(fs.weights_dirs) == 2


def test_a_missing_dir_is_skipped_not_full(tmp_path):
    # What an unmounted filer looks like: no entry, rather than "no space".
    assert storage.probe([str(tmp_path / "not-mounted")]) == []
    (fs,) = storage.probe([str(tmp_path / "not-mounted"), str(tmp_path)])
    assert fs.weights_dirs == [str(tmp_path)]


def test_a_file_is_not_a_weights_dir(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert storage.probe([str(tmp_path / "model.gguf")]) == []


def test_one_dir_named_twice_is_listed_once(tmp_path):
    (fs,) = storage.probe([str(tmp_path), str(tmp_path)])
    assert fs.weights_dirs == [str(tmp_path)]


@pytest.mark.skipif(not os.path.ismount("/dev/shm"), reason="no /dev/shm mount here")
def test_dirs_on_two_filesystems_are_two_entries(tmp_path):
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("tmp is on /dev/shm here")
    found = storage.probe([str(tmp_path), "/dev/shm"])
    assert [fs.weights_dirs for fs in found] == [[str(tmp_path)], ["/dev/shm"]]
    assert found[1].mountpoint == "/dev/shm"


@pytest.mark.parametrize("fstype, shared", [
    ("nfs4", True), ("lustre", True), ("gpfs", True), ("beegfs", True), ("cephfs", False),
    ("ceph", True), ("fuse.glusterfs", True), ("fuse.sshfs", True), ("cifs", True),
    ("ext4", False), ("xfs", False), ("btrfs", False), ("zfs", False), ("tmpfs", False),
    ("overlay", False), (None, None),
])
def test_shared_filesystems(fstype, shared):
    # "cephfs" is not a kernel type name (the kernel client says "ceph"); local
    # is the safe reading of a name we do not know.
    assert storage.is_shared(fstype) is shared


def test_the_last_mount_on_a_mountpoint_is_the_one_seen():
    Part = collections.namedtuple("Part", "device mountpoint fstype opts")
    mounts = [Part("/dev/sda1", "/", "ext4", ""), Part("/dev/nvme0n1", "/srv", "xfs", ""),
              Part("filer:/models", "/srv", "nfs4", "")]
    assert storage.fstype_of("/srv", mounts) == "nfs4"
    assert storage.fstype_of("/data", mounts) is None

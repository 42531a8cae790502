"""Room for weights: one entry per filesystem holding a configured weights directory."""

from __future__ import annotations

import os
import stat

import attrs
import psutil
from twisted.logger import Logger

from llmgw.records import Filesystem

log = Logger()

# Filesystems whose space belongs to every node mounting them.  The control plane
# sums them apart from local disks, or twenty nodes would each report the same
# free terabyte and twenty models would be placed into room for one.  Names as
# the kernel shows them in /proc/self/mounts; FUSE ones carry their "fuse." prefix.
SHARED_FSTYPES = frozenset({
    # NFS and SMB
    "nfs", "nfs4", "cifs", "smb3", "smbfs",
    # parallel and cluster filesystems of HPC sites
    "lustre", "gpfs", "beegfs", "wekafs", "orangefs", "pvfs2", "panfs",
    "ocfs2", "gfs2", "afs",
    # Ceph and Gluster, kernel and FUSE clients
    "ceph", "fuse.ceph", "fuse.ceph-fuse", "glusterfs", "fuse.glusterfs",
    # FUSE network and object-store mounts
    "fuse.sshfs", "fuse.juicefs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone",
    "fuse.mfs", "fuse.lizardfs", "fuse.quobyte",
    # A VM's window onto its host's disk: other guests see the same bytes.
    "9p", "virtiofs",
})


def is_shared(fstype: str | None) -> bool | None:
    return None if fstype is None else fstype in SHARED_FSTYPES


def probe(weights_dirs: list[str]) -> list[Filesystem]:
    """One Filesystem per filesystem that holds any of *weights_dirs*, in their order.

    A directory that does not exist is skipped rather than reported as having no
    room: that is what an unmounted filer looks like, and "no space" would make
    placement refuse the node for a reason that is not true.  Several directories
    on one filesystem are one entry, because free space belongs to the disk, not
    the path; counted per directory, 24 GB twice would take a 40 GB model.
    """
    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError) as e:
        log.info("cannot list mounts ({error}); filesystem types not reported", error=e)
        mounts = []

    found: dict[int, Filesystem] = {}
    dirs: dict[int, list[str]] = {}
    for configured in dict.fromkeys(weights_dirs):  # the same dir twice is one dir
        try:
            real = os.path.realpath(configured)
            st = os.stat(real)
            if not stat.S_ISDIR(st.st_mode):
                continue
            vfs = os.statvfs(real)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.info("weights dir {path} unreadable ({error}); skipped", path=configured, error=e)
            continue
        # st_dev, not the mountpoint: a bind mount shows one filesystem at two
        # mountpoints, and its bytes must still be counted once.
        if st.st_dev in found:
            dirs[st.st_dev].append(configured)
            continue
        mountpoint = mountpoint_of(real)
        fstype = fstype_of(mountpoint, mounts)
        found[st.st_dev] = Filesystem(
            mountpoint=mountpoint,
            fstype=fstype,
            shared=is_shared(fstype),
            total_bytes=vfs.f_blocks * vfs.f_frsize,
            # f_bavail, not f_bfree: the blocks reserved for root are not room
            # the agent, running as its own user, can fill.
            free_bytes=vfs.f_bavail * vfs.f_frsize,
        )
        dirs[st.st_dev] = [configured]
    return [attrs.evolve(fs, weights_dirs=dirs[dev]) for dev, fs in found.items()]


def mountpoint_of(path: str) -> str:
    """The mountpoint of the filesystem holding *path* (a real path)."""
    path = os.path.abspath(path)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def fstype_of(mountpoint: str, mounts: list) -> str | None:
    """The type of the filesystem mounted last at *mountpoint*: it hides earlier ones."""
    fstype = None
    for part in mounts:
        if part.mountpoint == mountpoint:
            fstype = part.fstype or None
    return fstype

"""What `llmgw ctl onboard` runs on the node, sent over ssh: the standard library only, one request per run.

The operator's side (:mod:`llmgw.ctl.onboard`) pipes this file to the node's Python, followed by one
JSON line (the request) and the bytes it names (the wheels it carries).  It answers one JSON line on
stdout.  A refusal exits with :data:`REFUSED` and one sentence on stderr; anything else that fails exits
otherwise, its stderr shown to the operator as it is.  Every request either does what it says or takes
back what it did, and its answer lists what it changed (``changed``), so a re-run that changes nothing
says so.  Before llmgw is installed this runs under the node's own Python; the request that makes the
key (``csr``) runs under the venv's, which has ``cryptography`` — so the key is made on the node and
only the request leaves it.  Running as root, it acts only through paths :func:`_trusted` holds.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

try:  # on a node, ssh.py's program made it this module: llmgw is not installed there yet
    import llmgw_nodeinstall as nodeinstall
except ImportError:
    from llmgw.ctl import nodeinstall

REFUSED = 3
# Checked before anything is installed: a venv with llmgw's dependencies is about 150 MB.
MIN_FREE_MB = 500
SYSTEMCTL_TIMEOUT_S = 60
HUB_TIMEOUT_S = 5.0
UNIT = "llmgw-agent.service"
# Offboarding: each engine's process group is given this long after SIGTERM, then as long again after SIGKILL.
ENGINE_STOP_S = 10.0
# At most this many of the state directory's shard records are read, each at most this big.
MAX_RECORDS, MAX_RECORD_BYTES = 4096, 1 << 20
# The agent's (psutil's) create_time and the one read here come from the same /proc figures.
CREATE_TIME_TOLERANCE_S = 0.05
# The files in the configuration directory onboarding writes, and offboarding removes.
CONFIG_FILES = ("agent.yaml", "ca.crt", "node.crt", "node.key")


class Declined(Exception):
    """One sentence for the operator; the node is as it was."""


def main() -> int:
    request = json.loads(sys.stdin.buffer.readline())
    try:
        answer = OPS[request["op"]](request)
    except (Declined, nodeinstall.InstallRefused) as e:
        print(str(e), file=sys.stderr)
        return REFUSED
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


# -- check: what the node has, before anything is done --

def check(request: dict) -> dict:
    """Refuse with one sentence per missing thing; answer what is installed already."""
    problems = []
    if sys.version_info < (3, 11):
        problems.append(f"{sys.executable} is Python {sys.version.split()[0]}; llmgw needs 3.11 or newer")
    if shutil.which("systemctl") is None:
        problems.append("there is no systemctl on PATH: llmgw's agent runs as a systemd unit, and "
                        "other init systems are not supported; install the agent by hand (docs/operations.rst)")
    prefix = request["prefix"]
    free = _free_mb(prefix)
    if free < request.get("min_free_mb", MIN_FREE_MB):
        problems.append(f"{_existing_parent(prefix)} has {free} MB free; the venv at {prefix} needs "
                        f"{request.get('min_free_mb', MIN_FREE_MB)} MB")
    agent = (_uid_of(request["owner"]) or (None,))[0] if request.get("owner") else None
    for key in ("prefix", "config_dir", "state_dir", "unit_dir"):
        parent = _existing_parent(request[key])
        if not os.access(parent, os.W_OK):
            problems.append(f"{parent} is not writable by {_user()}, and {request[key]} goes there; "
                            "onboard as root (USER@HOST) or choose --" + key.replace("_", "-"))
        try:  # before anything is installed, or the venv's python run as root
            _trusted(request[key], agent if key == "state_dir" else None)
        except Declined as e:
            problems.append(f"{e} (--{key.replace('_', '-')})")
    owner = request.get("owner")
    if owner is not None and _uid_of(owner) is None:
        useradd = shlex.join(["useradd", "--system", "--home-dir", request["state_dir"], owner])
        problems.append(f"there is no user {owner} on this node for the agent to run as; create it "
                        f"({useradd}) or choose --user")
    host, port = request["hub_host"], request["hub_port"]
    try:
        socket.create_connection((host, port), timeout=HUB_TIMEOUT_S).close()
    except OSError as e:
        problems.append(f"the hub {host}:{port} cannot be reached from this node "
                        f"({e.strerror or e}); open the port, or give the address the node "
                        "reaches it at with --node-hub")
    if problems:
        raise Declined("; ".join(problems))
    return {
        "hostname": socket.gethostname().split(".")[0],
        "python": sys.executable,
        "installed": _installed_version(prefix),
        "certificate": _read_text(os.path.join(request["config_dir"], "node.crt")),
        "has_key": os.path.lexists(os.path.join(request["config_dir"], "node.key")),
        **nodeinstall.facts(prefix),  # the tags of the wheelhouse it installs from, and what its venv came from
    }


def _existing_parent(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _free_mb(path: str) -> int:
    fs = os.statvfs(_existing_parent(path))
    return fs.f_bavail * fs.f_frsize // (1024 * 1024)


def _uid_of(user: str) -> tuple[int, int] | None:
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _installed_version(prefix: str) -> str | None:
    python = os.path.join(prefix, "bin", "python")
    if not os.path.exists(python):
        return None
    try:
        out = subprocess.run([python, "-c", "import llmgw; print(llmgw.__version__)"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _read_text(path: str) -> str | None:
    try:  # a symbolic link reads as no text, so it is written over, not followed
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), encoding="utf-8") as f:
            return f.read(64 * 1024)
    except (OSError, ValueError):
        return None


# -- install: nodeinstall.install, exactly the wheelhouse's files, each sha256 checked --

def _run(argv: list[str], what: str, timeout: float) -> None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what} did not finish in {timeout:.0f} s: {shlex.join(argv)}") from None
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"{what} failed (exit status {out.returncode}): {shlex.join(argv)}")


# -- csr: the node's key (made here once, kept) and a request for its certificate --

def csr(request: dict) -> dict:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key_path = os.path.join(_directory(request["config_dir"]), "node.key")
    created = not os.path.lexists(key_path)
    if created:
        key = ec.generate_private_key(ec.SECP256R1())
        _write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()), private=True)
    else:
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    request_pem = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request["node_id"])]))
        .sign(key, hashes.SHA256())
    ).public_bytes(serialization.Encoding.PEM).decode()
    return {"request": request_pem, "changed": [os.path.join(request["config_dir"], "node.key")] if created else []}


# -- write: the configuration, the certificates and the unit, each only when it differs --

def write(request: dict) -> dict:
    """Each file whose text differs, written whole where :func:`_directory` trusts; the agent's user given its own."""
    changed = []
    ids = _uid_of(request["owner"]) if os.getuid() == 0 else None
    for path, text, private in request["files"]:
        real = os.path.join(_directory(os.path.dirname(path)), os.path.basename(path))
        if _read_text(real) != text:
            _write(real, text.encode(), private=private)
            changed.append(path)
    for directory in request["dirs"]:
        changed.extend([] if os.path.lexists(directory) else [directory])
        real = _directory(directory, agent=ids and ids[0])
        if ids is not None:
            _give(real, ids, os.O_DIRECTORY)
    for path in request["owned"] if ids is not None else ():  # each in a directory written in above
        _give(os.path.join(_directory(os.path.dirname(path)), os.path.basename(path)), ids, 0)
    return {"changed": changed}


def _write(path: str, data: bytes, private: bool) -> None:
    """*data* at *path* whole (a rename, which replaces a link rather than follow it), 0600 when *private*."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        os.fchmod(fd, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _give(path: str, ids: tuple[int, int], kind: int) -> None:
    """chown *path* to *ids* through a descriptor opened without following a link (O_NOFOLLOW)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | kind)
    except OSError as e:
        raise Declined(f"{path} cannot be given to the agent's user ({e.strerror})"
                       f"{'; it is a symbolic link, and no file a link points at is' * os.path.islink(path)}: "
                       "move it away and onboard again") from None
    try:
        if not (stat.S_ISDIR if kind else stat.S_ISREG)(os.fstat(fd).st_mode):
            raise Declined(f"{path} is not a {'directory' if kind else 'file'}; move it away and onboard again")
        os.fchown(fd, *ids)
    finally:
        os.close(fd)


def _directory(path: str, agent: int | None = None) -> str:
    """*path*, made when missing, as a real path only root (or this user) can redirect (docs/onboarding.rst)."""
    real = _trusted(path, agent)
    if not os.path.isdir(real):
        if os.path.lexists(real):
            raise Declined(f"{path} is there and is not a directory; move it away and onboard again")
        os.makedirs(real, mode=0o755, exist_ok=True)
        real = _trusted(path, agent)  # made meanwhile by someone else: held to the same rule
    return real


def _trusted(path: str, agent: int | None) -> str:
    real, todo, links, mine = "/", [p for p in os.path.abspath(path).split("/") if p], 0, {0, os.geteuid()}
    while todo:
        step = os.path.normpath(os.path.join(real, todo.pop(0)))
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return os.path.normpath(os.path.join(step, *todo))
        link = stat.S_ISLNK(st.st_mode)
        if st.st_uid not in mine | ({agent} if agent is not None and not todo and not link else set()):
            why = f"belongs to uid {st.st_uid} (make it root's: chown -h root {shlex.quote(step)})"
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            why = f"is writable by others than its owner (chmod go-w {shlex.quote(step)})"
        elif link and links > 40:
            why = "is one link more than 40 on the way"
        else:
            why = None
        if why is not None:
            raise Declined(f"{step} {why}, and {path} is reached through it, so another user could point "
                           "onboarding elsewhere; fix that or choose another path")
        target = os.readlink(step) if link else ""  # a link's target is read on from where the link is
        real = ("/" if target.startswith("/") else real) if link else step
        links, todo = links + link, [p for p in target.split("/") if p] + todo
    return real


# -- start and remove: the unit --

def start(request: dict) -> dict:
    """Enable the unit and (re)start it when anything changed or it is not running."""
    active = _systemctl("is-active", "--quiet", UNIT, check=False) == 0
    if active and not request["restart"]:
        return {"changed": []}
    _systemctl("daemon-reload")
    _systemctl("enable", UNIT)
    _systemctl("restart" if active else "start", UNIT)
    return {"changed": [UNIT]}


def remove(request: dict) -> dict:
    """Stop and remove the agent: its unit, its venv, the files onboarding wrote; the state directory stays."""
    agent, changed = (_uid_of(request.get("owner") or "") or (None,))[0], []
    for key in ("unit_dir", "state_dir", "prefix", "config_dir"):  # nothing removed through another user's link
        _trusted(request[key], agent if key == "state_dir" else None)
    unit_path = os.path.join(request["unit_dir"], UNIT)
    if os.path.exists(unit_path):
        _systemctl("stop", UNIT, check=False)
        _systemctl("disable", UNIT, check=False)
        os.unlink(unit_path)
        _systemctl("daemon-reload", check=False)
        changed.append(unit_path)
    # The unit's KillMode=process leaves the engines running (a restarted agent adopts them);
    # an agent taken away leaves none.
    changed.extend(stop_engines(request["state_dir"], owner=agent))
    if _is_llmgw_venv(request["prefix"]):
        shutil.rmtree(_trusted(request["prefix"], None))  # a link root made: the venv it points at, then the link
        if os.path.islink(request["prefix"]):
            os.unlink(request["prefix"])
        changed.append(request["prefix"])
    for name in CONFIG_FILES:
        path = os.path.join(request["config_dir"], name)
        if os.path.lexists(path):
            os.unlink(path)
            changed.append(path)
    return {"changed": changed}


def _is_llmgw_venv(prefix: str) -> bool:
    """Whether *prefix* is a venv with llmgw's twistd in it, as install makes (a system prefix, /usr, is not a venv)."""
    return all(os.path.isfile(os.path.join(prefix, *p)) for p in (("pyvenv.cfg",), ("bin", "twistd")))


def stop_engines(state_dir: str, stop_s: float = ENGINE_STOP_S, owner: int | None = None) -> list[str]:
    """Kill the engine process groups the agent recorded in *state_dir*/shards, and wait (bounded) until they are gone.

    A group is killed only when its recorded leader is the very process the
    agent started (pid and start time), or when the leader has exited and
    its group still runs (a group id is not reused while its group lives);
    and, with *owner* (the agent's uid), only when every process in it is
    that user's: the agent's user writes the records, and offboarding runs
    as root, so a forged record must not name another user's group.
    What is left after SIGKILL and *stop_s* is a failure naming it.
    """
    groups = {}
    shards = os.path.join(state_dir, "shards")
    try:
        names = sorted(n for n in os.listdir(shards) if n.endswith(".json"))[:MAX_RECORDS]
    except OSError:
        return []
    for name in names:
        found = _engine_group(os.path.join(shards, name))
        if found is not None and (owner is None or _group_owned_by(found, owner)):
            groups[found] = name[:-len(".json")]
    if not groups:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + stop_s
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(_group_alive(g) for g in groups):
            return [f"engine process group {g} (shard {shard})" for g, shard in groups.items()]
    left = [f"{g} (shard {shard})" for g, shard in groups.items() if _group_alive(g)]
    raise SystemExit(f"engine process groups {', '.join(left)} still run {2 * stop_s:.0f} s after SIGTERM and "
                     "SIGKILL; kill them by hand (kill -KILL -- -PGID) and run offboarding again")


def _engine_group(path: str) -> int | None:
    """The process group a shard record names, when it is the agent's engine and still runs; else None."""
    try:  # the agent's user writes these: a link is not followed, a FIFO not waited on
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            record = json.loads(f.read(MAX_RECORD_BYTES + 1)[:MAX_RECORD_BYTES])
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    pid, pgid, started = record.get("pid"), record.get("pgid"), record.get("create_time")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in (pid, pgid)) or \
            not isinstance(started, (int, float)) or isinstance(started, bool):
        return None
    if pgid == os.getpgrp() or pgid != pid:
        return None
    now = _create_time(pid)
    if now is not None:
        same = abs(now - started) <= CREATE_TIME_TOLERANCE_S and _pgid(pid) == pgid
        return pgid if same else None
    return pgid if _group_alive(pgid) else None


def _group_owned_by(pgid: int, uid: int) -> bool:
    """Whether every process of group *pgid* runs as *uid* (real and effective), as the agent's engines do."""
    for pid in (n for n in os.listdir("/proc") if n.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[2] != str(pgid):
                    continue
            with open(f"/proc/{pid}/status") as f:
                uids = next(line.split()[1:3] for line in f if line.startswith("Uid:"))
        except (OSError, IndexError, StopIteration):
            continue  # gone meanwhile
        if uids != [str(uid), str(uid)]:
            return False
    return True


def _create_time(pid: int) -> float | None:
    """*pid*'s start, as psutil reckons it on Linux (boot time plus start ticks); None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    if fields[0] == "Z":
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _group_alive(pgid: int) -> bool:
    """Whether a process of group *pgid* runs (a zombie, waiting for its parent to reap it, has finished)."""
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        pids = None
    if pids is None:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _systemctl(*args: str, check: bool = True) -> int:
    try:
        out = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"systemctl {' '.join(args)} did not finish in {SYSTEMCTL_TIMEOUT_S} s") from None
    if check and out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"systemctl {' '.join(args)} failed (exit status {out.returncode})")
    return out.returncode


OPS = {"check": check, "install": nodeinstall.install, "csr": csr, "write": write, "start": start, "remove": remove}

if __name__ == "__main__":
    sys.exit(main())

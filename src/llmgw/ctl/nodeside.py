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
import socket
import stat
import subprocess
import sys
import tempfile

try:  # on a node, ssh.py's program made these modules: llmgw is not installed there yet
    import llmgw_nodehost as nodehost
    import llmgw_nodeinstall as nodeinstall
except ImportError:
    from llmgw.ctl import nodehost, nodeinstall

REFUSED = 3
# Checked before anything is installed: a venv with llmgw's dependencies is about 150 MB.
MIN_FREE_MB = 500
SYSTEMCTL_TIMEOUT_S = 60
HUB_TIMEOUT_S = 5.0
UNIT = "llmgw-agent.service"
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
    problems += nodehost.host_problems(request)
    prefix = request["prefix"]
    problems += _short_of_space(request)
    agent = (_uid_of(request["owner"]) or (None,))[0] if request.get("owner") else None
    paths = [(k, request[k]) for k in ("prefix", "config_dir", "state_dir", "unit_dir")]
    for key, path in paths + [("weights_dir", d) for d in request.get("weights_dirs", [])]:
        parent = _existing_parent(path)
        if not os.access(parent, os.W_OK):
            problems.append(f"{parent} is not writable by {_user()}, and {path} goes there; "
                            "onboard as root (USER@HOST) or choose --" + key.replace("_", "-"))
        try:  # before anything is installed, or the venv's python run as root
            _trusted(path, agent if key in ("state_dir", "weights_dir") else None)
        except Declined as e:
            problems.append(f"{e} (--{key.replace('_', '-')})")
    owner = request.get("owner")
    if owner is not None and _uid_of(owner) is None:
        useradd = shlex.join(["useradd", "--system", "--home-dir", request["state_dir"], owner])
        problems.append(f"there is no user {owner} on this node for the agent to run as; create it "
                        f"({useradd}) or choose --user")
    elif owner is not None:
        problems += nodehost.unreachable(owner, [(k, request[k]) for k in ("prefix", "config_dir", "state_dir")]
                                         + [("weights_dir", d) for d in request.get("weights_dirs", [])])
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


def _short_of_space(request: dict) -> list[str]:
    """One sentence per filesystem with less free than the venv and the state dir it holds need, together."""
    needs = {}  # device: [free MB, needed MB, what]
    for path, mb in ((request["prefix"], request.get("min_free_mb", MIN_FREE_MB)),
                     (request["state_dir"], request.get("min_state_free_mb", nodehost.MIN_STATE_FREE_MB))):
        dev = os.stat(_existing_parent(path)).st_dev
        need = needs.setdefault(dev, [_free_mb(path), 0, []])
        need[1] += mb
        need[2].append(f"{path} ({mb} MB)")
    return [f"the filesystem of {' and '.join(what)} has {free} MB free, and they need {need} MB; free some, or "
            "choose --prefix or --state-dir elsewhere" for free, need, what in needs.values() if free < need]


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
    # The state dir, and the weights dirs (0750 when made here: the agent's alone, as the unit's UMask= makes its own).
    for directory, mode in [(d, 0o755) for d in request["dirs"]] + [(d, 0o750) for d in request.get("weights_dirs", [])]:
        changed.extend([] if os.path.lexists(directory) else [directory])
        real = _directory(directory, agent=ids and ids[0], mode=mode)
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


def _directory(path: str, agent: int | None = None, mode: int = 0o755) -> str:
    """*path*, made (*mode*) when missing, as a real path only root (or this user) can redirect (docs/onboarding.rst)."""
    real = _trusted(path, agent)
    if not os.path.isdir(real):
        if os.path.lexists(real):
            raise Declined(f"{path} is there and is not a directory; move it away and onboard again")
        os.makedirs(os.path.dirname(real), mode=0o755, exist_ok=True)
        try:
            os.mkdir(real, mode)
            os.chmod(real, mode, follow_symlinks=False)  # whatever the umask
        except FileExistsError:
            pass
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
    """Stop the agent, then remove it: its unit, its venv, the files onboarding wrote; the state directory stays.

    Nothing is removed while the agent still runs (the holder of its state
    lock, or a twistd from its venv), nor the venv while anything runs from it:
    each is refused naming the pid.  The answer says how the stop went.
    """
    agent, changed, prefix = (_uid_of(request.get("owner") or "") or (None,))[0], [], request["prefix"]
    for key in ("unit_dir", "state_dir", "prefix", "config_dir"):  # nothing removed through another user's link
        _trusted(request[key], agent if key == "state_dir" else None)
    unit_path = os.path.join(request["unit_dir"], UNIT)
    stopped = _stop_unit() if os.path.exists(unit_path) else f"no {UNIT} in {request['unit_dir']} to stop"
    running = nodehost.agent_running(request["state_dir"], prefix)
    if running:
        raise Declined(f"the agent still runs, {', '.join(running)}, and {stopped}; nothing was removed: stop it "
                       f"(systemctl stop {UNIT}, or kill that pid) and offboard again")
    # The unit's KillMode=process leaves the engines running (a restarted agent adopts them);
    # an agent taken away leaves none.
    changed.extend(nodehost.stop_engines(request["state_dir"], owner=agent))
    left = nodehost.running_from(prefix) if _is_llmgw_venv(prefix) else []
    if left:
        raise Declined(f"{', '.join(left)} still run from {prefix}, so it was not removed, nor anything else"
                       f"{' but ' + ', '.join(changed) if changed else ''}; stop them and offboard again")
    if os.path.exists(unit_path):
        if shutil.which("systemctl") is not None:
            _systemctl("disable", UNIT, check=False)
        os.unlink(unit_path)
        if shutil.which("systemctl") is not None:
            _systemctl("daemon-reload", check=False)
        changed.append(unit_path)
    if _is_llmgw_venv(prefix):
        shutil.rmtree(_trusted(prefix, None))  # a link root made: the venv it points at, then the link
        if os.path.islink(prefix):
            os.unlink(prefix)
        changed.append(prefix)
    for name in CONFIG_FILES:
        path = os.path.join(request["config_dir"], name)
        if os.path.lexists(path):
            os.unlink(path)
            changed.append(path)
    return {"changed": changed, "stopped": stopped}


def _stop_unit() -> str:
    """``systemctl stop`` the agent's unit; how it went, in words."""
    if shutil.which("systemctl") is None:
        return f"there is no systemctl on this node to stop {UNIT} with"
    try:
        status = _systemctl("stop", UNIT, check=False)
    except SystemExit as e:
        return str(e)
    return f"`systemctl stop {UNIT}` succeeded" if status == 0 else f"`systemctl stop {UNIT}` failed (exit status {status})"


def _is_llmgw_venv(prefix: str) -> bool:
    """Whether *prefix* is a venv with llmgw's twistd in it, as install makes (a system prefix, /usr, is not a venv)."""
    return all(os.path.isfile(os.path.join(prefix, *p)) for p in (("pyvenv.cfg",), ("bin", "twistd")))


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

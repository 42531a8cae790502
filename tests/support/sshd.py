"""A real OpenSSH server on 127.0.0.1 standing in for a node, for onboarding over ssh.

Each :class:`SshNode` is one `sshd -D -e -f CONFIG` on a free port with its
own host key, a client key made at test time in its authorized_keys, and a
PATH of the test's choosing on which ``systemctl`` is :data:`SYSTEMCTL`: a
stand-in that starts a unit's ``ExecStart`` line as written (with its
``WorkingDirectory`` and ``Environment``), so the unit file onboarding
installed is what runs.  :class:`Operator` is the operator's side: one
ssh_config and one known_hosts, written by the test, naming every node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.net import free_port, listening
from tests.support.wait import wait_for

SYSTEMCTL = r'''#!{python}
"""systemctl for one test: units from $LLMGW_TEST_UNIT_DIR, run detached, their pid in $LLMGW_TEST_UNIT_DIR/NAME.pid."""
import configparser, os, shlex, signal, subprocess, sys, time

units = os.environ["LLMGW_TEST_UNIT_DIR"]
calls = os.path.join(units, "systemctl.calls")
with open(calls, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
args = [a for a in sys.argv[1:] if not a.startswith("-")]
verb, names = args[0], args[1:]


def pid_of(name):
    try:
        pid = int(open(os.path.join(units, name + ".pid")).read())
        with open(f"/proc/{{pid}}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return pid if state != "Z" else None
    except (OSError, ValueError):
        return None


def start(name):
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(units, name))
    service = unit["Service"]
    env = dict(os.environ)
    for line in service.get("Environment", "").splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    log = open(os.path.join(units, name + ".log"), "ab")
    proc = subprocess.Popen(shlex.split(service["ExecStart"]), cwd=service.get("WorkingDirectory"), env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    open(os.path.join(units, name + ".pid"), "w").write(str(proc.pid))


def stop(name):
    pid = pid_of(name)
    if pid is None:
        return
    os.killpg(pid, signal.SIGTERM)
    # What systemd does, not a test's wait: TimeoutStopSec (15 s here), then SIGKILL.
    for _ in range(300):
        if pid_of(name) is None:
            break
        time.sleep(0.05)
    else:
        os.killpg(pid, signal.SIGKILL)
    os.unlink(os.path.join(units, name + ".pid"))


if verb in ("daemon-reload", "enable", "disable"):
    sys.exit(0)
for name in names:
    if verb == "is-active":
        sys.exit(0 if pid_of(name) else 3)
    if verb in ("stop", "restart"):
        stop(name)
    if verb in ("start", "restart") and pid_of(name) is None:
        start(name)
'''


def engine_groups_under(base: Path) -> set[int]:
    """The process groups of live engines whose agent's state dir is under *base*."""
    import psutil

    from llmgw.agent.procs import MARK_STATE_DIR

    groups = set()
    for proc in psutil.process_iter():
        try:
            state_dir = proc.environ().get(MARK_STATE_DIR)
            if state_dir and Path(state_dir).is_relative_to(base) and proc.status() != psutil.STATUS_ZOMBIE:
                groups.add(os.getpgid(proc.pid))
        except (OSError, psutil.Error):
            continue
    return groups


class SshNode:
    """One sshd on 127.0.0.1 as a node: *path* is the PATH its sessions get, *env* more of their environment."""

    def __init__(self, sshd: str, base: Path, alias: str, path: str | None = None, env: dict[str, str] | None = None):
        self.sshd, self.base, self.alias = sshd, base, alias
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.units = base / "units"
        self.units.mkdir(exist_ok=True)
        self.bin = base / "bin"
        self.bin.mkdir(exist_ok=True)
        systemctl = self.bin / "systemctl"
        systemctl.write_text(SYSTEMCTL.format(python=sys.executable))
        systemctl.chmod(0o755)
        self.path = path or f"{self.bin}:/usr/bin:/bin"
        self.host_key = base / "host_key"
        _keygen(self.host_key)
        self.client_key = base / "client_key"
        _keygen(self.client_key)
        (base / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        self.config = base / "sshd_config"
        self.config.write_text(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {self.host_key}
PidFile {base / 'sshd.pid'}
AuthorizedKeysFile {base / 'authorized_keys'}
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
SetEnv PATH={self.path} LLMGW_TEST_UNIT_DIR={self.units}{''.join(f" {k}={v}" for k, v in (env or {}).items())}
""")
        self.proc: subprocess.Popen | None = None

    def start(self) -> SshNode:
        # sshd run as root wants its privilege separation directory, which
        # Debian's service makes at boot and a container has not.
        if os.getuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.log = open(self.base / "sshd.log", "ab")
        self.proc = subprocess.Popen([self.sshd, "-D", "-e", "-f", str(self.config)], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: listening(self.port) or self.proc.poll() is not None, 15, f"sshd on {self.port} to listen",
                 detail=lambda: (self.base / "sshd.log").read_text(errors="replace"))
        assert self.proc.poll() is None, (self.base / "sshd.log").read_text(errors="replace")
        return self

    def known_host(self) -> str:
        return f"[127.0.0.1]:{self.port} {Path(f'{self.host_key}.pub').read_text().strip()}\n"

    def agent_pid(self) -> int | None:
        try:
            return int((self.units / "llmgw-agent.service.pid").read_text())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        pid = self.agent_pid()
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Engines outlive their agent by design (a restarted agent adopts
        # them), so the agent's end is not theirs: stop every engine an agent
        # on this node started, whichever of its state dirs it ran on.
        for group in engine_groups_under(self.base):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)


class Operator:
    """The operator's ssh_config and known_hosts: each node by its alias, its host key known unless told not."""

    def __init__(self, base: Path):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.config = base / "ssh_config"
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text("")
        self.config.write_text("")

    def add(self, node: SshNode, known: bool = True) -> None:
        with open(self.config, "a") as f:
            f.write(f"""Host {node.alias}
  HostName 127.0.0.1
  Port {node.port}
  User root
  IdentityFile {node.client_key}
  IdentitiesOnly yes
  UserKnownHostsFile {self.known_hosts}
  GlobalKnownHostsFile /dev/null
""")
        if known:
            with open(self.known_hosts, "a") as f:
                f.write(node.known_host())


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30,
                   capture_output=True)

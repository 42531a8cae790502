"""Where onboarding puts llmgw on a node, and what it writes there: agent.yaml, and the agent's unit.

The layout's paths and user go into the unit as plain text, wherever the
unit names them: ``ExecStart=``, ``Environment=PATH=``,
``WorkingDirectory=``, ``User=``, ``Group=``, and any line of an operator's
own unit (``--unit``).  systemd reads each of those by its own rules — a
newline starts another setting, every setting expands ``%`` specifiers,
``ExecStart=`` splits on white space, takes quotes and backslashes and
expands ``$NAME``, ``PATH=`` splits on ``:`` — so no one escaping is right in
all of them.  A value that would need any is refused, not escaped: a path is
absolute, has no ``..``, and is made of ASCII letters, digits and
``/ . _ - + @ ,`` only (``{node}`` in it stands for the node's id); a user is
a name systemd and useradd both take.  Each is checked where the command
line is read, before anything reaches a node, and again where the unit is
filled in.
"""

from __future__ import annotations

import json
import os
import re
import string
from pathlib import Path

import attrs

from llmgw.ctl.ssh import Refusal

UNIT_NAME = "llmgw-agent.service"
# Where contrib/'s unit says llmgw, its configuration and its state live.
UNIT_PREFIX, UNIT_CONFIG_DIR, UNIT_STATE_DIR, UNIT_USER = "/opt/llmgw", "/etc/llmgw", "/var/lib/llmgw", "llmgw"
NODE_PLACEHOLDER = "{node}"
# What a path and a user may hold: characters that need no quoting anywhere in a unit, nor in a shell.
_PATH_CHARS = frozenset(string.ascii_letters + string.digits + "/._+@,-")
_USER_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
# useradd's longest name.
MAX_USER = 32
_NAMED = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space",
          "%": "'%' (a specifier to systemd)", "$": "'$' (a variable in ExecStart=)",
          ":": "':' (PATH='s separator)", "\\": "a backslash"}


def _said(text: str) -> str:
    """*text* as an error shows it: quoted, every character outside printable ASCII escaped."""
    return "'" + "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in text) + "'"


def _odd(text: str, allowed: frozenset) -> str | None:
    """The first character of *text* not in *allowed*, in words; None when there is none."""
    for c in text:
        if c not in allowed:
            return _NAMED.get(c, _said(c) if c != "'" else "a quote")
    return None


def unit_path(text: str, flag: str) -> str:
    """*text*, when it can go into the agent's unit as it is; a Refusal naming *flag* and what is wrong otherwise."""
    plain = text.replace(NODE_PLACEHOLDER, "node")
    if not plain.startswith("/"):
        raise Refusal(f"{flag} {_said(text)}: give an absolute path (as in {UNIT_PREFIX})")
    if ".." in plain.split("/"):
        raise Refusal(f"{flag} {_said(text)}: give the path without '..' (onboarding writes there, and "
                      "offboarding removes what it wrote)")
    odd = _odd(plain, _PATH_CHARS)
    if odd is not None:
        raise Refusal(f"{flag} {_said(text)} holds {odd}; onboarding takes paths of ASCII letters, digits and "
                      "/ . _ - + @ , only (with {node} for the node's id), since the agent's systemd unit takes "
                      "them as they are, never escaped")
    return text


def unit_user(text: str) -> str:
    """*text*, when it is a user name the unit's User= and Group= take as it is; a Refusal otherwise."""
    odd = _odd(text, _USER_CHARS)
    if odd is None and 0 < len(text) <= MAX_USER and text[0] not in string.digits + ".-":
        return text
    raise Refusal(f"--user {_said(text)} is not a user name onboarding puts in the agent's unit (User=, Group=): "
                  f"it takes a letter or '_' followed by letters, digits, '_', '.' and '-', {MAX_USER} at most"
                  + (f" ({odd} is none of those)" if odd else "") + "; create such a user on the node and give it")


@attrs.frozen
class Layout:
    """Where things go on the node."""

    prefix: str = UNIT_PREFIX
    config_dir: str = UNIT_CONFIG_DIR
    state_dir: str | None = None
    unit_dir: str = "/etc/systemd/system"
    user: str = UNIT_USER
    # --weights-dir: in agent.yaml, made on the node for the agent's user, and writable under the unit.
    weights_dirs: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def state(self) -> str:
        return UNIT_STATE_DIR if self.state_dir is None else self.state_dir

    def for_node(self, node_id: str) -> Layout:
        """The layout with ``{node}`` in any path replaced by *node_id* (nodes that share a filesystem)."""
        return Layout(*(None if v is None else v.replace(NODE_PLACEHOLDER, node_id)
                        for v in (self.prefix, self.config_dir, self.state_dir, self.unit_dir)), self.user,
                      tuple(d.replace(NODE_PLACEHOLDER, node_id) for d in self.weights_dirs))

    def checked(self) -> Layout:
        """This layout, when each of its values can go into the unit as it is; a Refusal naming the flag otherwise."""
        for flag, value in (("--prefix", self.prefix), ("--config-dir", self.config_dir),
                            ("--state-dir", self.state), ("--unit-dir", self.unit_dir)):
            unit_path(value, flag)
        for value in self.weights_dirs:
            unit_path(value, "--weights-dir")
        unit_user(self.user)
        # The state dir and the weights dirs are given to the agent's user, and writable under its unit.
        others = {"--prefix": self.prefix, "--config-dir": self.config_dir, "--unit-dir": self.unit_dir}
        given_away("--state-dir", self.state, others, inside=False)
        for value in self.weights_dirs:
            given_away("--weights-dir", value, others, inside=True)
        return self

    def request(self) -> dict:
        return {"prefix": self.prefix, "config_dir": self.config_dir, "state_dir": self.state,
                "unit_dir": self.unit_dir, "owner": self.user, "weights_dirs": list(self.weights_dirs)}


# Directories of the system a node's onboarding never gives to the agent's user, nor any that holds one.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc/systemd/system", "/home", "/lib", "/lib64", "/media", "/mnt", "/opt",
               "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr/bin", "/usr/lib", "/usr/local/bin",
               "/usr/sbin", "/usr/share", "/var/lib", "/var/log", "/var/tmp")


def given_away(flag: str, path: str, others: dict[str, str], inside: bool) -> None:
    """Refuse *path* (given to the agent's user) when it is, or holds, a system directory or one of *others*;
    with *inside*, also when it lies within one of *others* (the venv, the configuration, the units)."""
    plain = os.path.normpath(path.replace(NODE_PLACEHOLDER, "node"))

    def holds(outer: str, inner: str) -> bool:
        return inner == outer or inner.startswith(outer.rstrip("/") + "/")

    system = next((d for d in SYSTEM_DIRS if holds(plain, d)), None)
    if system is not None:
        raise Refusal(f"{flag} {_said(path)} is, or holds, the system's {system}, which onboarding would give to "
                      "the agent's user and make writable under its unit; give a directory of its own "
                      "(as in /var/lib/llmgw or /data/llmgw-weights)")
    for other, where in others.items():
        where = os.path.normpath(where.replace(NODE_PLACEHOLDER, "node"))
        if holds(plain, where) or (inside and holds(where, plain)):
            raise Refusal(f"{flag} {_said(path)} {'holds' if holds(plain, where) else 'is inside'} {other} "
                          f"{_said(where)}, which the agent's user must not be able to change; give a directory "
                          "apart from the venv, the configuration and the units")


def unit_text(unit: str | None, layout: Layout) -> str:
    """The agent's unit (--unit, else the one llmgw ships) with the layout's prefix, directories and user filled in.

    The package carries llmgw-agent.service (the same file as contrib/'s), so
    a pip-installed llmgw onboards without its source tree.
    """
    layout.checked()
    if unit:
        try:
            text = Path(unit).read_text()
        except OSError as e:
            raise Refusal(f"cannot read the agent's unit {unit} (--unit: {e.strerror}); give a readable file, or "
                          f"leave --unit out for the {UNIT_NAME} llmgw ships") from None
    else:
        from importlib import resources

        text = resources.files("llmgw.ctl").joinpath(UNIT_NAME).read_text()
    filled = {UNIT_PREFIX: layout.prefix, UNIT_CONFIG_DIR: layout.config_dir, UNIT_STATE_DIR: layout.state,
              f"User={UNIT_USER}": f"User={layout.user}", f"Group={UNIT_USER}": f"Group={layout.user}"}
    # One pass: a value filled in is never read again (--prefix /etc/llmgw/venv stays that, whatever --config-dir).
    text = re.sub("|".join(map(re.escape, filled)), lambda m: filled[m.group()], text)
    return _weights_writable(text, layout.weights_dirs, unit or UNIT_NAME)


def _weights_writable(text: str, dirs: tuple[str, ...], unit: str) -> str:
    """*text* with one more ``ReadWritePaths=`` for *dirs*, after its own (systemd adds them up), else after ``[Service]``.

    The unit's ``ProtectSystem=strict`` leaves every other path read-only, so
    a weights dir outside the state dir needs its own line.
    """
    if not dirs:
        return text
    lines = text.splitlines(keepends=True)
    after = next((i for i, line in enumerate(lines) if line.startswith("ReadWritePaths=")), None)
    if after is None:
        after = next((i for i, line in enumerate(lines) if line.strip() == "[Service]"), None)
    if after is None:
        raise Refusal(f"the agent's unit {unit} has no [Service] section to make the weights dirs writable in; "
                      "give a unit that has one (--unit)")
    added = f"# --weights-dir, written by `llmgw ctl onboard`\nReadWritePaths={' '.join(dirs)}\n"
    return "".join(lines[:after + 1] + [added] + lines[after + 1:])


def agent_yaml(args, node_id: str, hostname: str, layout: Layout) -> str:
    """agent.yaml with the hub, the TLS files and only the overrides given (JSON is YAML)."""
    tls = {k: os.path.join(layout.config_dir, f)
           for k, f in (("ca", "ca.crt"), ("cert", "node.crt"), ("key", "node.key"))}
    lines = ["# Written by `llmgw ctl onboard`; a re-run rewrites it. Every key: docs/configuration.rst.",
             f"hub: {json.dumps(args.node_hub)}", f"tls: {json.dumps(tls)}"]
    if node_id != hostname:
        lines.append(f"node_id: {json.dumps(node_id)}")
    if args.label:
        lines.append(f"labels: {json.dumps(dict(args.label))}")
    if args.fabric:
        lines.append(f"fabrics: {json.dumps(dict(args.fabric))}")
    if args.weights_dir:
        lines.append(f"weights_dirs: {json.dumps([d.replace(NODE_PLACEHOLDER, node_id) for d in args.weights_dir])}")
    if layout.state_dir is not None:
        lines.append(f"state_dir: {json.dumps(layout.state_dir)}")
    return "\n".join(lines) + "\n"


# Which of onboarding's flags each key of the agent.yaml it writes comes from.
_FLAG_OF = {"hub": "--node-hub", "labels": "--label", "fabrics": "--fabric", "weights_dirs": "--weights-dir",
            "state_dir": "--state-dir", "node_id": "--name"}


def check_agent_yaml(args, node_id: str, layout: Layout) -> None:
    """Refuse, before any node is reached, an agent.yaml the agent would refuse to start with: the agent's own rules.

    The file is read as the agent reads it (:func:`llmgw.config.agent.load_agent_config`),
    with stand-ins for the TLS files, which are made on the node later.
    """
    import tempfile

    from llmgw.config.agent import load_agent_config
    from llmgw.errors import ConfigError

    with tempfile.TemporaryDirectory(prefix="llmgw-onboard-") as here:
        for name in ("ca.crt", "node.crt", "node.key"):
            Path(here, name).touch()
        path = os.path.join(here, "agent.yaml")
        Path(path).write_text(agent_yaml(args, node_id, f"{node_id}-host", attrs.evolve(layout, config_dir=here)))
        try:
            load_agent_config(path)
        except ConfigError as e:
            said = re.sub(rf"\A{re.escape(path)}:\d+: ", "", str(e))
            flag = _FLAG_OF.get(said.split(".", 1)[0].split(":", 1)[0], "the flags")
            raise Refusal(f"the agent would refuse the agent.yaml onboarding writes for {node_id} ({said}); "
                          f"change {flag}") from None

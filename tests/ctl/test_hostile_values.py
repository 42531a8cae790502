"""What reaches a node's shell, the agent's systemd unit and ssh itself: each value one word, or refused.

The shell lines are run by real shells (sh, bash) against a sentinel file:
whatever a value holds, nothing in it runs.  The filled-in unit is read by
systemd's own parser (``systemd-analyze verify``) where the machine has it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from llmgw.ctl import nodeinstall, nodeside
from llmgw.ctl.layout import Layout, unit_path, unit_text, unit_user
from llmgw.ctl.ssh import REFUSED, Refusal, Ssh, StepFailed, _find_python, _with_python, ssh_target
from tests.support.cluster import environment
from tests.support.net import free_port

SHELLS = sorted({shutil.which(s) for s in ("sh", "bash", "dash", "zsh")} - {None})
# Each {s} is the sentinel's path: a value that ran as shell would make it.
HOSTILE = [
    "$(touch {s})",
    "`touch {s}`",
    "'; touch {s}; '",
    '"; touch {s}; "',
    "x\ntouch {s}",
    "$(touch {s})'\"",
    '\\"$(touch {s})\\"',
    "${{IFS}}$(touch {s})",
    "*; touch {s} #",
    "-c touch {s}",
    "a' \"$(touch {s})\" 'b",
]


def run_as_the_node(shell: str, line: str, cwd, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """*line* as ssh has the node's login shell run it (``$SHELL -c LINE``)."""
    return subprocess.run([shell, "-c", line], cwd=cwd, input=stdin, capture_output=True, timeout=60)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_python_the_operator_names_reaches_the_node_shell_as_one_word(tmp_path, shell, hostile):
    sentinel = tmp_path / "ran"
    python = hostile.format(s=sentinel)
    searched = run_as_the_node(shell, _find_python(python), tmp_path)
    assert searched.returncode == REFUSED, searched
    # Said back as the very word it was, and never run.
    assert f"no {python} at all" in searched.stderr.decode(), searched.stderr
    direct = run_as_the_node(shell, _with_python(python), tmp_path)
    assert direct.returncode == 127, direct
    assert not sentinel.exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_python_whose_path_holds_shell_characters_runs_nodeside(tmp_path, shell):
    odd = tmp_path / "we ird $(touch x) `y` 'q' \"d\" ; *"
    odd.mkdir()
    (odd / "python3").symlink_to(sys.executable)
    code = b"import sys; print('nodeside ran', sys.version_info >= (3, 11))"
    stdin = b"%d\n" % len(code) + code
    for line in (_find_python(str(odd / "python3")), _with_python(str(odd / "python3"))):
        out = run_as_the_node(shell, line, tmp_path, stdin)
        assert out.returncode == 0 and out.stdout == b"nodeside ran True\n", out
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]


def test_with_no_python_the_node_says_which_it_looked_for(tmp_path):
    out = subprocess.run(["/bin/sh", "-c", _find_python(None)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": str(tmp_path / "empty")})
    assert out.returncode == REFUSED
    assert "no python3 python3.13 python3.12 python3.11 at all" in out.stderr, out.stderr


BAD_TARGETS = ["-oProxyCommand=touch /tmp/x", "-F/tmp/cfg", "a;touch x", "a$(touch x)", "a`touch x`", "a b",
               "a\nb", "-root@host", "root@-host", "a|b", "a&b", "%h", "a'b", 'a"b', "a\\b", "a@b@c", "",
               "root@", "@host", "a\x1b]0;x\x07", "h\u202eost", "x" * 300]
GOOD_TARGETS = ["gpu05", "root@gpu05.example.org", "10.0.3.5", "::1", "admin_1@node-3", "_svc@fe80::1", "Gpu-05"]


@pytest.mark.parametrize("target", BAD_TARGETS)
def test_a_target_ssh_or_a_proxycommand_would_read_as_more_than_a_name_is_refused(target):
    with pytest.raises(Refusal, match="is not a target onboarding gives to ssh: it takes \\[USER@\\]HOST") as refused:
        Ssh(target)
    assert "\x1b" not in str(refused.value) and "\n" not in str(refused.value) and "\u202e" not in str(refused.value)
    with pytest.raises(Refusal):
        ssh_target(target)


@pytest.mark.parametrize("target", GOOD_TARGETS)
def test_a_plain_target_is_given_to_ssh_after_its_options_end(target):
    assert Ssh(target).argv("true")[-3:] == ["--", target, "true"]


def test_the_command_line_refuses_a_hostile_value_before_the_hub_or_ssh_is_reached(tmp_path):
    # An ssh that would say it ran, first on PATH; a hub nothing listens on.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\ntouch {tmp_path / 'ssh-ran'}\n")
    (bin_dir / "ssh").chmod(0o755)
    env = environment(PATH=f"{bin_dir}:/usr/bin:/bin")
    hub = f"wss://127.0.0.1:{free_port()}/"
    for argv, said in (
        (["onboard", "--", "-oProxyCommand=touch x"], "'-oProxyCommand=touch x' is not a target onboarding gives"),
        (["onboard", "gpu05", "--prefix", "/opt/x\nExecStartPre=/bin/sh -c 'touch x'"],
         "--prefix '/opt/x\\nExecStartPre=/bin/sh -c 'touch x'' holds a newline"),
        (["onboard", "gpu05", "--state-dir", "/var/lib/%h"], "--state-dir '/var/lib/%h' holds '%' (a specifier"),
        (["onboard", "gpu05", "--weights-dir", "/data/my weights"], "--weights-dir '/data/my weights' holds a space"),
        (["onboard", "gpu05", "--user", "llmgw\nExecStartPre=/bin/true"], "--user 'llmgw\\nExecStartPre=/bin/true' is not"),
        (["offboard", "gpu05", "--host", "a;touch x"], "'a;touch x' is not a target"),
        (["offboard", "gpu05", "--config-dir", "etc/llmgw"], "--config-dir 'etc/llmgw': give an absolute path"),
    ):
        out = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--hub", hub, *argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert said in out.stderr, (argv, out.stderr)
    assert not (tmp_path / "ssh-ran").exists() and not (tmp_path / "x").exists()


# Values systemd would read as more than a path: another setting, a specifier, a variable, a second word.
BAD_PATHS = ["/opt/x\nExecStartPre=/bin/sh -c 'touch /tmp/x'", "/opt/%h", "/opt/%%", "/opt/my llmgw", "/opt/$HOME",
             "/opt/${HOME}", '/opt/"x"', "/opt/'x'", "/opt/x\\ny", "/opt/x;y", "/opt/`x`", "/opt/x\ty", "/opt/x\r",
             "/opt/\x1b[2J", "/opt/a:b", "/opt/{nodes}", "/opt/é", "/opt/*", "opt/llmgw", "", "-/opt",
             "/opt/../etc", "/opt/{node}/.."]
GOOD_PATHS = ["/opt/llmgw", "/srv/{node}/opt", "/srv/a+b@c,d-e_f.g/llmgw", "/opt/llmgw/"]


@pytest.mark.parametrize("flag,field", [("--prefix", "prefix"), ("--config-dir", "config_dir"),
                                        ("--state-dir", "state_dir"), ("--unit-dir", "unit_dir")])
@pytest.mark.parametrize("value", BAD_PATHS)
def test_a_path_the_unit_would_read_as_more_than_a_path_is_refused_naming_its_flag(flag, field, value):
    with pytest.raises(Refusal, match=f"^{flag} ") as refused:
        unit_text(None, Layout(**{field: value}))
    assert not any(c in str(refused.value) for c in "\n\r\t\x1b")
    with pytest.raises(Refusal, match=f"^{flag} "):
        unit_path(value, flag)


BAD_USERS = ["llmgw\nExecStartPre=/bin/true", "-root", "0day", ".x", "a b", "%u", "$USER", "a;b", "a'b", "", "x" * 33,
             "llmgw\x1b", "ll\u00e9"]


@pytest.mark.parametrize("user", BAD_USERS)
def test_a_user_the_unit_would_read_as_more_than_a_name_is_refused(user):
    with pytest.raises(Refusal, match="^--user '.*' is not a user name onboarding puts in the agent's unit"):
        unit_text(None, Layout(user=user))
    with pytest.raises(Refusal):
        unit_user(user)


def test_every_accepted_value_fills_the_unit_with_the_settings_it_had(tmp_path):
    shipped = unit_text(None, Layout())
    for path in GOOD_PATHS:
        for user in ("llmgw", "_svc", "svc.ai-1", "x" * 32):
            layout = Layout(path, path + "/etc", path + "/state", path, user).for_node("gpu05")
            filled = unit_text(None, layout)
            settings = [line.split("=", 1)[0] for line in filled.splitlines() if "=" in line and line[0] != "#"]
            assert settings == [line.split("=", 1)[0] for line in shipped.splitlines() if "=" in line and line[0] != "#"]
            exec_start = next(line for line in filled.splitlines() if line.startswith("ExecStart="))
            assert shlex.split(exec_start)[0] == f"ExecStart={layout.prefix}/bin/twistd"
            assert f"\nUser={user}\nGroup={user}\n" in filled


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on this machine")
def test_systemd_reads_the_filled_unit_with_exactly_the_layouts_paths(tmp_path):
    # The most unusual path onboarding takes: systemd must find the agent's twistd at it, as it is.
    prefix = tmp_path / "a+b@c,d-e_f.g" / "llmgw"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy("/bin/true", prefix / "bin" / "twistd")
    unit = tmp_path / "llmgw-agent.service"
    unit.write_text(unit_text(None, Layout(str(prefix), str(tmp_path / "etc"), str(tmp_path / "state"), user="root")))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr
    # The check can fail: the same unit with a path systemd reads otherwise is refused by systemd.
    unit.write_text(unit.read_text().replace(f"ExecStart={prefix}", f"ExecStart={prefix}%%h"))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "twistd is not executable" in out.stderr, out.stderr


def test_offboarding_removes_a_prefix_only_when_it_is_an_llmgw_venv(tmp_path):
    # /usr with a system twistd in /usr/bin, as a distribution's python3-twisted installs it.
    system = tmp_path / "usr"
    (system / "bin").mkdir(parents=True)
    (system / "bin" / "twistd").write_text("#!/bin/sh\n")
    request = {"prefix": str(system), "config_dir": str(tmp_path / "etc"), "state_dir": str(tmp_path / "state"),
               "unit_dir": str(tmp_path / "units"), "owner": "root"}
    assert nodeside.remove(request)["changed"] == []
    assert (system / "bin" / "twistd").exists()
    (system / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert nodeside.remove(request)["changed"] == [str(system)]
    assert not system.exists()


def test_what_the_node_advises_is_shell_quoted_as_it_could_be_pasted(tmp_path):
    odd = tmp_path / "a b;$(c)"
    with pytest.raises(SystemExit) as failed:
        nodeinstall._run([sys.executable, "-c", "raise SystemExit(4)", str(odd)], "the probe")
    command = str(failed.value).split("(exit status 4): ", 1)[1]
    assert shlex.split(command)[-1] == str(odd)
    request = {"prefix": str(tmp_path), "config_dir": str(tmp_path), "state_dir": str(odd), "unit_dir": str(tmp_path),
               "owner": "no_such_user_llmgw", "hub_host": "127.0.0.1", "hub_port": free_port(), "min_free_mb": 0}
    with pytest.raises(nodeside.Declined) as declined:
        nodeside.check(request)
    advice = str(declined.value).split("create it (", 1)[1].split(") or choose --user", 1)[0]
    assert shlex.split(advice) == ["useradd", "--system", "--home-dir", str(odd), "no_such_user_llmgw"]


def test_the_wheels_advice_names_the_command_that_makes_a_wheelhouse_and_no_package_index(tmp_path):
    from llmgw.ctl import wheelhouse

    odd = tmp_path / "my wheels $(x)"
    odd.mkdir()
    with pytest.raises(Refusal) as refused:
        wheelhouse.read(odd, "1.2.3")
    assert str(refused.value).endswith("make a wheelhouse with `llmgw ctl wheelhouse NEWDIR` from an llmgw 1.2.3, "
                                       "and give --wheels NEWDIR")
    assert "pip wheel" not in str(refused.value)


# -- over a real ssh, to a real sshd on 127.0.0.1 --

@pytest.mark.sshd
@pytest.mark.slow
def test_over_ssh_a_hostile_python_is_said_back_and_never_run(nodes):
    node = nodes.add("edge1")
    sentinel = node.base / "ran"
    python = f"$(touch {sentinel})\"; touch {sentinel}; \"`touch {sentinel}`"
    with pytest.raises(Refusal, match="there is no Python 3.11 or newer on ") as refused:
        Ssh(node.alias, str(nodes.operator.config), python=python).run("check", {})
    assert f"no {python} at all" in str(refused.value)
    with pytest.raises(StepFailed) as failed:
        Ssh(node.alias, str(nodes.operator.config)).run("check", {}, python=python)
    assert failed.value.status == 127
    assert not sentinel.exists()


@pytest.mark.sshd
@pytest.mark.slow
def test_a_nodes_answer_is_escaped_before_onboarding_prints_it(nodes):
    from tests.ctl.test_onboard import fake_python

    node = nodes.add("edge1")
    answer = ('{"hostname": "edge1", "python": "\\u001b]0;owned\\u0007/usr/bin/python3", '
              '"installed": "1.0\\u001b[2J\\u202e", "certificate": null, "has_key": false, '
              '"python_version": "3.11", "implementation": "cpython", "soabi": "cpython-311-x86_64-linux-gnu", '
              '"platform": "linux-x86_64\\u001b[2J", "libc": "glibc 2.36\\u0007", "installed_set": null}')
    said = Ssh(node.alias, str(nodes.operator.config), python=fake_python(node, f"cat >/dev/null; echo '{answer}'"))
    got = said.run("check", {})
    assert got == {"hostname": "edge1", "python": "\\x1b]0;owned\\x07/usr/bin/python3",
                   "installed": "1.0\\x1b[2J\\u202e", "certificate": None, "has_key": False,
                   "python_version": "3.11", "implementation": "cpython", "soabi": "cpython-311-x86_64-linux-gnu",
                   "platform": "linux-x86_64\\x1b[2J", "libc": "glibc 2.36\\x07", "installed_set": None}


def test_a_value_filled_into_the_unit_is_not_filled_in_again():
    # The prefix holds the shipped unit's config directory: it stays as given, whatever --config-dir is.
    filled = unit_text(None, Layout("/etc/llmgw/venv", "/srv/conf", "/var/lib/llmgw/x", user="svc"))
    assert "ExecStart=/etc/llmgw/venv/bin/twistd " in filled and "--config /srv/conf/agent.yaml" in filled
    assert "Environment=PATH=/etc/llmgw/venv/bin:" in filled and "WorkingDirectory=/var/lib/llmgw/x\n" in filled


@pytest.mark.parametrize("name", ["node_", "-node", "node-", "a.b", "ca", "", "x" * 64, "nöde", "node\n01"])
def test_a_name_the_link_would_refuse_is_refused_by_the_command_line_before_the_hub_or_ssh(tmp_path, name):
    # Before, `--name node_` passed onboarding's own pattern and was refused at signing, after the node was
    # changed; and `ctl offboard node_` reached the hub and the host. Now one rule, node_name_problem.
    from llmgw.ctl.onboard import check_node_id

    with pytest.raises(Refusal):
        check_node_id(name, "--name")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\ntouch {tmp_path / 'ssh-ran'}\n")
    (bin_dir / "ssh").chmod(0o755)
    env = environment(PATH=f"{bin_dir}:/usr/bin:/bin")
    hub = f"wss://127.0.0.1:{free_port()}/"
    for argv in (["onboard", "gpu05", "--name", name], ["offboard", "--", name]):
        out = subprocess.run([sys.executable, "-m", "llmgw", "ctl", "--hub", hub, *argv], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert "--name:" in out.stderr or "node:" in out.stderr, (argv, out.stderr)
    assert not (tmp_path / "ssh-ran").exists()


@pytest.mark.parametrize("flag,value,key", [
    ("label", ("rack", " r1"), "labels.rack"), ("label", ("rack", "r\x1b[2J"), "labels.rack"),
    ("label", ("rack", "x" * 300), "labels.rack"), ("label", ("bad key", "x"), "labels.'bad key'"),
    ("fabric", ("mlx5_0", "ib 0"), "fabrics.mlx5_0"), ("fabric", ("not an adapter", "ib0"), "fabrics"),
])
def test_an_agent_yaml_the_agent_would_refuse_is_refused_by_onboarding_first(flag, value, key):
    import argparse

    from llmgw.ctl.layout import check_agent_yaml

    args = argparse.Namespace(node_hub="wss://hub.example.org:7443/", label=[], fabric=[], weights_dir=[])
    getattr(args, flag).append(value)
    with pytest.raises(Refusal, match=rf"the agent would refuse the agent.yaml onboarding writes for gpu05 \({re.escape(key)}"
                                      rf".*change --{flag}$"):
        check_agent_yaml(args, "gpu05", Layout())
    getattr(args, flag).clear()
    check_agent_yaml(args, "gpu05", Layout())

"""`llmgw ctl onboard [USER@]HOST…` and `llmgw ctl offboard NODE`: a node added or taken away over ssh.

The system's OpenSSH client does the connecting (:mod:`llmgw.ctl.ssh`), so
the operator's ``~/.ssh/config``, ProxyJump hosts, agent and known_hosts
apply as they do for ``ssh HOST``; ``BatchMode=yes`` makes an unknown host
key a refusal rather than a question, and host-key checking is never turned
off.  On the node, :mod:`llmgw.ctl.nodeside` does each step and answers
what it changed.

The node makes its own key; only its certificate request crosses, to be
signed by the control plane (``llmgw.cp.sign_node``) or, with ``--ca-dir``,
by the CA on this machine.  Each step prints as it runs, with its duration;
a step that fails prints the remote command, its exit status and its stderr,
and what the run left on the node.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import attrs

from llmgw import __version__
from llmgw.answers import Onboarding, SignableNode, SignedNode
from llmgw.ctl import wheelhouse
from llmgw.ctl.layout import (UNIT_CONFIG_DIR, UNIT_NAME, UNIT_PREFIX, UNIT_STATE_DIR, UNIT_USER, Layout, unit_path,
                              agent_yaml, check_agent_yaml, unit_text, unit_user)
from llmgw.ctl.ssh import PYTHONS, Refusal, Ssh, StepFailed, ssh_target
from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.render import said
from llmgw.roles import ROLE_NODE
from llmgw.states import NodeState
from llmgw.views import NodeView
from llmgw.wire import to_wire

REGISTER_TIMEOUT_S = 120.0
# How often the registering node's view is asked for (one node's: llmgw.cp.node).
REGISTER_POLL_S = 0.5
# What the hub answers a procedure nobody registered: a server older than the procedure.
NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
# A certificate closer than this to its end is renewed by a re-run.
RENEW_BEFORE = datetime.timedelta(days=30)


# -- one node --

@attrs.define
class Run:
    """One host's onboarding: its steps as they went, and what they changed on the node."""

    target: str
    out: object
    name: str | None = None  # --name, when given
    node_id: str | None = None
    steps: list[dict] = attrs.Factory(list)
    changed: list[str] = attrs.Factory(list)
    result: str | None = None
    reason: str | None = None
    started: float = attrs.Factory(time.monotonic)
    node: NodeView | None = None

    def say(self, text: str) -> None:
        print(f"{self.node_id or self.target}: {text}", file=self.out, flush=True)

    async def step(self, name: str, work):
        begun = time.monotonic()
        try:
            said, value = await work()
        except (Refusal, StepFailed) as e:
            seconds = time.monotonic() - begun
            self.steps.append({"step": name, "seconds": round(seconds, 3), "error": str(e)})
            self.say(f"{name} failed ({seconds:.1f} s): {e}")
            raise
        seconds = time.monotonic() - begun
        self.steps.append({"step": name, "seconds": round(seconds, 3), "said": said})
        self.say(f"{name}: {said} ({seconds:.1f} s)")
        return value

    def summary(self) -> dict:
        return {"host": self.target, "node": self.node_id, "result": self.result, "reason": self.reason,
                "seconds": round(time.monotonic() - self.started, 3), "steps": self.steps,
                "changed": self.changed, "view": None if self.node is None else to_wire(self.node)}


def _in_thread(function, *args, **kwargs):
    from twisted.internet import threads

    return threads.deferToThread(function, *args, **kwargs)


async def onboard_one(session, run: Run, ssh: Ssh, args, server: Onboarding, layout: Layout) -> None:
    if run.name is not None:
        check_node_id(run.name, "--name")
        layout = layout.for_node(run.name)

    async def check():
        answer = await _in_thread(ssh.run, "check", {**layout.request(), **_hub_parts(args.node_hub)})
        node_id = run.name or answer["hostname"]
        try:
            check_node_id(node_id, f"{run.target}'s short host name")
        except Refusal as e:
            raise Refusal(f"{e}; or give the node its id with --name") from None
        run.node_id = node_id
        if run.name is None and layout.for_node(node_id) != layout:
            # The paths depend on the id, only now known: check them again, and read what is there.
            answer = await _in_thread(ssh.run, "check", {**layout.for_node(node_id).request(),
                                                         **_hub_parts(args.node_hub)})
        return (f"Python {answer['python']} ({answer['python_version']}, {answer['platform']}, "
                f"{answer['libc'] or 'libc unknown'}), llmgw {answer['installed'] or 'not installed'}"), answer

    found = await run.step("check", check)
    node_id = run.node_id
    layout = layout.for_node(node_id)
    holds = _holds_certificate(found["certificate"], node_id, server.ca)

    async def name():
        # Whose certificate the name holds beside the CA is known now, before the node is changed.
        await _sign(session, args, node_id, None)
        return await name_in_fleet(session, node_id, run.target, holds, bool(args.replace)), None

    await run.step("name", name)

    async def install():
        # Exactly the operator's llmgw and pins: a kept wheelhouse (--wheels), else one assembled for the node's tags.
        house = args.wheel_house or await _in_thread(wheelhouse.assembled, wheelhouse.node_tags(found, run.target))
        if found["installed_set"] == house.requirements_sha256:
            return f"llmgw {server.version} is there already, from these very wheels", False
        request, payload = wheelhouse.install_request(house, args.index_url)
        answer = await _in_thread(ssh.run, "install", {**layout.request(), **request}, payload=payload)
        run.changed.extend(answer["changed"])
        source = wheelhouse.described(house, args.index_url, kept=args.wheel_house is not None)
        return f"llmgw {server.version} into {layout.prefix} {source}", True

    installed = await run.step("install", install)
    python = os.path.join(layout.prefix, "bin", "python")

    async def key():
        answer = await _in_thread(ssh.run, "csr", {"config_dir": layout.config_dir, "node_id": node_id}, python=python)
        run.changed.extend(answer["changed"])
        return ("a new key made on the node" if answer["changed"] else "the node's key, kept"), answer["request"]

    request = await run.step("key", key)

    async def certificate():
        if holds and _same_key(found["certificate"], request):
            return "the node's certificate is current", (found["certificate"], False)
        pem, serial, by = await _sign(session, args, node_id, request)
        return f"signed for node {node_id}, serial {serial}, by the {by}", (pem, True)

    cert, new_cert = await run.step("certificate", certificate)

    async def configure():
        files = [
            [os.path.join(layout.config_dir, "ca.crt"), server.ca, False],
            [os.path.join(layout.config_dir, "node.crt"), cert, False],
            [os.path.join(layout.config_dir, "agent.yaml"), agent_yaml(args, node_id, found["hostname"], layout), False],
            [os.path.join(layout.unit_dir, UNIT_NAME), unit_text(args.unit, layout), False],
        ]
        owned = [os.path.join(layout.config_dir, n) for n in ("node.key", "agent.yaml")]
        answer = await _in_thread(ssh.run, "write", {"files": files, "dirs": [layout.state], "owned": owned,
                                                     "weights_dirs": list(layout.weights_dirs),
                                                     "owner": layout.user}, python=python)
        run.changed.extend(answer["changed"])
        return (f"wrote {', '.join(answer['changed'])}" if answer["changed"] else "every file as it was"), bool(answer["changed"])

    written = await run.step("configure", configure)

    async def start():
        answer = await _in_thread(ssh.run, "start", {"restart": installed or new_cert or written}, python=python)
        run.changed.extend(answer["changed"])
        return (f"{UNIT_NAME} (re)started" if answer["changed"] else f"{UNIT_NAME} running, left alone"), None

    await run.step("start", start)

    async def register():
        view = await _wait_registered(session, node_id, args.wait)
        return f"registered, {said(view.state)}", view

    run.node = await run.step("register", register)
    run.result = "onboarded" if run.changed else "unchanged"
    if not run.changed:
        run.reason = f"nothing changed: {node_id} already runs llmgw {server.version} and is registered"
        run.say(run.reason)


async def _sign(session, args, node_id: str, request: str | None) -> tuple[str, str, str] | None:
    """*request* signed for *node_id*: the certificate, its serial, by whom; with None, only ask whether the name may be
    a node's (:func:`llmgw.pki.nodes.node_name_free`)."""
    if args.ca_dir is not None:
        from llmgw.pki.nodes import node_name_free, sign_node

        try:
            if request is None:
                node_name_free(args.ca_dir, node_id)
                return None
            signed = sign_node(args.ca_dir, node_id, request.encode(), bool(args.replace))
        except LlmgwError as e:
            raise Refusal(str(e)) from None
        by = f"CA in {args.ca_dir}"
        if signed.replaced is not None:
            by += (f" (serial {signed.replaced.revocation.serial:x} revoked in {signed.replaced.path}: copy it "
                   "to where the server reads it and run `llmgw ctl reload`)")
        return signed.path.read_text(), f"{signed.certificate.serial_number:x}", by
    from autobahn.wamp.exception import ApplicationError

    try:
        if request is None:
            checked = await session.call(uris.CP_SIGN_NODE, node_id, None, bool(args.replace), check=True)
            read_answer(SignableNode, checked, uris.CP_SIGN_NODE)
            return None
        answer = await session.call(uris.CP_SIGN_NODE, node_id, request, bool(args.replace))
    except ApplicationError as e:
        raise Refusal(e.args[0] if e.args else e.error) from None
    signed = read_answer(SignedNode, answer, uris.CP_SIGN_NODE)
    return signed.certificate, signed.serial, "control plane"


def read_answer(kind: type, answer, uri: str):
    """The control plane's *answer* to *uri* as its record (``llmgw.answers``, ``llmgw.views``); a Refusal when it does not fit."""
    from llmgw.ctl.main import decode

    try:
        return decode(kind, answer, uri)
    except LlmgwError as e:
        raise Refusal(str(e)) from None


async def fleet_node(session, node_id: str) -> NodeView | None:
    """*node_id*'s view as the control plane has it (``llmgw.cp.node``), None when the fleet has no such node.

    One node's view, whatever the fleet's size: never the whole list, which
    at ten thousand nodes does not fit a link message.
    """
    from autobahn.wamp.exception import ApplicationError

    try:
        answer = await session.call(uris.CP_NODE, node_id)
    except ApplicationError as e:
        if e.error == NO_SUCH_PROCEDURE:
            raise Refusal(f"the server has no {uris.CP_NODE}: it is older than this ctl (llmgw {__version__}); "
                          "upgrade it, or onboard with the ctl of its version") from None
        raise
    return None if answer is None else read_answer(NodeView, answer, uris.CP_NODE)


async def name_in_fleet(session, node_id: str, target: str, holds: bool, replace: bool) -> str:
    """Whether *node_id* may be *target*'s: a name the fleet has is refused unless *target* holds it or *replace*."""
    other = await fleet_node(session, node_id)
    if other is None:
        return "not in the fleet yet"
    if not holds and not replace:
        raise Refusal(f"the fleet already has a node {node_id} ({said(other.state)}, at "
                      f"{said(other.address or None)}) and {target} does not hold its certificate; "
                      f"choose another --name, or --replace to make {target} that node "
                      "(its old certificate is revoked)")
    if holds:
        return "this node, again"
    return f"replacing {node_id} (--replace): its old certificate is revoked when this one is signed"


async def _wait_registered(session, node_id: str, timeout: float) -> NodeView:
    """*node_id*'s view once it is ready, asked for every ``REGISTER_POLL_S``; after *timeout* s, a Refusal."""
    from twisted.internet import reactor, task

    deadline = time.monotonic() + timeout
    while True:
        view = await fleet_node(session, node_id)
        if view is not None and view.state == NodeState.READY:
            return view
        if time.monotonic() >= deadline:
            seen = f"it is {said(view.state)}" if view else "it has not registered"
            raise Refusal(f"{node_id} started, but {seen} after {timeout:.0f} s; its log: "
                          f"`journalctl -u llmgw-agent` on the node, or `llmgw ctl logs {node_id}`")
        await task.deferLater(reactor, REGISTER_POLL_S, lambda: None)


def check_node_id(node_id: str, what: str) -> str:
    """*node_id* when it can be a node's id (:func:`llmgw.pki.node_name_problem`, the CA's and the link's one rule); Refusal otherwise."""
    from llmgw.pki.subject import node_name_problem

    problem = node_name_problem(node_id)
    if problem is not None:
        raise Refusal(f"{what}: {problem}")
    return node_id


def _hub_parts(url: str) -> dict:
    from llmgw.huburl import parse_hub_url

    hub = parse_hub_url(url)
    return {"hub_host": hub.host, "hub_port": hub.port}


def _holds_certificate(pem: str | None, node_id: str, ca_pem: str) -> bool:
    """Whether *pem* is a current node certificate for *node_id* from the cluster CA."""
    if not pem:
        return False
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    from llmgw.errors import PKIError
    from llmgw.pki import identity_of

    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem.encode()))
        subject = identity_of(cert)
    except (ValueError, TypeError, InvalidSignature, PKIError):
        return False
    fresh = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc) > RENEW_BEFORE
    return subject.name == node_id and subject.role == ROLE_NODE and fresh


def _same_key(cert_pem: str, request_pem: str) -> bool:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def der(holder) -> bytes:
        return holder.public_key().public_bytes(serialization.Encoding.DER,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)

    try:
        return der(x509.load_pem_x509_certificate(cert_pem.encode())) == der(x509.load_pem_x509_csr(request_pem.encode()))
    except ValueError:
        return False


# -- many nodes --

async def cmd_onboard(session, args) -> int:
    from autobahn.wamp.exception import ApplicationError
    from twisted.internet import defer, reactor

    from llmgw.config.ctl import resolve_ctl_settings

    out = sys.stderr if args.json else sys.stdout
    args.node_hub = args.node_hub or resolve_ctl_settings(
        hub=args.hub, ca=args.ca, cert=args.cert, key=args.key, config_path=args.config).hub
    try:
        server = read_answer(Onboarding, await session.call(uris.CP_ONBOARDING), uris.CP_ONBOARDING)
    except ApplicationError as e:
        raise Refusal(f"the server does not onboard ({e.args[0] if e.args else e.error}); is it older than this ctl "
                      f"(llmgw {__version__})?") from None
    if args.ca_dir is None and not server.signs:
        raise Refusal("the server keeps no CA (pki.ca_dir in server.yaml is not set), so it cannot sign the "
                      "nodes' requests; set it, or run onboarding where the CA is with --ca-dir DIR")
    if args.name and len(args.name) != len(args.hosts):
        raise Refusal(f"{len(args.name)} --name for {len(args.hosts)} hosts: give one --name per host, in the "
                      "hosts' order, or none (each node is then its short host name)")
    layout = Layout(args.prefix, args.config_dir, args.state_dir, args.unit_dir, args.user, args.weights_dir).checked()
    for name in args.name or ["node"]:  # as the agent will read it, before any node is changed
        check_agent_yaml(args, name, layout.for_node(name))
    # Read and checked once, here, before any is sent: each node checks what it receives against these.
    args.wheel_house = wheelhouse.read(args.wheels, server.version) if args.wheels else None
    if args.wheel_house is None:
        wheelhouse.same_version(server.version)
    reactor.suggestThreadPoolSize(max(10, args.parallel))
    gate = defer.DeferredSemaphore(args.parallel)
    names = args.name or [None] * len(args.hosts)
    runs = [Run(target, out, name) for target, name in zip(args.hosts, names)]

    async def one(run: Run) -> None:
        try:
            await onboard_one(session, run, Ssh(run.target, args.ssh_config, args.python), args, server, layout)
        except (Refusal, StepFailed) as e:
            run.result, run.reason = "failed", str(e)
            if not run.steps or "error" not in run.steps[-1]:
                run.say(f"refused: {e}")
            if run.changed:
                run.say(f"left on the node: {', '.join(run.changed)}; run onboarding again to finish, or "
                        f"`llmgw ctl offboard {run.node_id or run.target} --host {run.target}` to remove them")
            else:
                run.say("left the node as it was")

    await defer.gatherResults([gate.run(lambda r=run: defer.ensureDeferred(one(r))) for run in runs])
    if args.json:
        json.dump([r.summary() for r in runs], sys.stdout, indent=2)
        print()
    else:
        from llmgw.ctl import tables

        shown = [r.node for r in runs if r.node is not None and r.result != "unchanged"]
        if shown:
            print(tables.nodes_table(shown))
        if len(runs) > 1:
            rows = [(r.node_id or r.target, r.result, f"{r.summary()['seconds']:.1f}", r.reason or "-") for r in runs]
            print(tables.table(("NODE", "RESULT", "SECONDS", "REASON"), rows))
    return 0 if all(r.result != "failed" for r in runs) else 1


# -- the command line --

def _pair(flag: str):
    def parse(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key or not value:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: write it as KEY=VALUE")
        return key, value

    return parse


def _checked(check, *flag: str):
    """An argparse type of *check*, its Refusal said as the command line's error."""
    def parse(text: str) -> str:
        try:
            return check(text, *flag)
        except Refusal as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _parallel(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--parallel {text!r} is not a whole number") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--parallel {n}: use 1 to 64")
    return n


def _where(command) -> None:
    # {node} in a path is the node's id: nodes that share a filesystem, or one machine in a test.
    command.add_argument("--prefix", default=UNIT_PREFIX, type=_checked(unit_path, "--prefix"),
                         help=f"the venv llmgw is installed in (default {UNIT_PREFIX})")
    command.add_argument("--config-dir", default=UNIT_CONFIG_DIR, type=_checked(unit_path, "--config-dir"),
                         help=f"agent.yaml, the certificates and the key (default {UNIT_CONFIG_DIR})")
    command.add_argument("--state-dir", type=_checked(unit_path, "--state-dir"),
                         help=f"the agent's state_dir (default {UNIT_STATE_DIR}); offboarding kills the engines "
                         "its records name")
    command.add_argument("--unit-dir", default="/etc/systemd/system", type=_checked(unit_path, "--unit-dir"),
                         help="where the unit goes (default /etc/systemd/system)")
    command.add_argument("--ssh-config", metavar="FILE", help="ssh -F FILE (default: ssh's own, ~/.ssh/config)")
    command.add_argument("--python", metavar="PATH", help="the node's Python (default: the first 3.11+ of "
                         + ", ".join(PYTHONS) + " on its PATH)")
    command.add_argument("--ca-dir", metavar="DIR", help="sign or revoke with the CA in DIR, on this machine, "
                         "instead of the server's (pki.ca_dir)")
    command.add_argument("--json", action="store_true", help="print the outcome as JSON (steps go to stderr)")


def add_parsers(sub, run) -> None:
    """``ctl onboard`` and ``ctl offboard``; *run* wraps a command with its session to the hub."""
    onboard = sub.add_parser("onboard", help="install and start the agent on hosts over ssh, and wait until each registers")
    onboard.add_argument("hosts", nargs="+", metavar="[USER@]HOST", type=_checked(ssh_target),
                         help="as you would give them to ssh")
    onboard.add_argument("--name", action="append", default=[], type=_checked(check_node_id, "--name"),
                         help="the node's id (default: its short host name), one DNS label; once per host, in order")
    onboard.add_argument("--replace", action="store_true",
                         help="take a name the fleet already has (its old certificate is revoked)")
    onboard.add_argument("--label", action="append", default=[], type=_pair("--label"), metavar="KEY=VALUE")
    onboard.add_argument("--fabric", action="append", default=[], type=_pair("--fabric"), metavar="ADAPTER=FABRIC")
    onboard.add_argument("--weights-dir", action="append", default=[], metavar="DIR",
                         type=_checked(unit_path, "--weights-dir"),
                         help="a weights dir for agent.yaml, made on the node for --user (0750) and writable under "
                         "the unit ({node} is the node's id); once per dir")
    onboard.add_argument("--user", default=UNIT_USER, type=_checked(unit_user),
                         help=f"the user the agent runs as (default {UNIT_USER})")
    onboard.add_argument("--node-hub", metavar="URL", help="the hub's URL as the node reaches it (default: --hub)")
    onboard.add_argument("--wheels", metavar="DIR", help="install from the wheelhouse in DIR (`llmgw ctl wheelhouse "
                         "DIR`), each file checked against its requirements.txt (default: one assembled here from "
                         "the llmgw this runs, for the node's Python)")
    onboard.add_argument("--index-url", type=_checked(wheelhouse.index_url), metavar="URL",
                         help="the node installs from this package index instead of wheels carried over; the "
                         "wheelhouse's sha256s still hold, so it must serve those very files")
    onboard.add_argument("--unit", metavar="FILE", help=f"the agent's systemd unit to fill in and install (default: the {UNIT_NAME} llmgw ships, "
                         "as contrib/ has it)")
    onboard.add_argument("--parallel", type=_parallel, default=1, metavar="N", help="onboard N hosts at a time (default 1)")
    onboard.add_argument("--wait", type=float, default=REGISTER_TIMEOUT_S, metavar="SECONDS",
                         help=f"how long to wait for the node to register (default {REGISTER_TIMEOUT_S:.0f})")
    _where(onboard)
    onboard.set_defaults(func=run(cmd_onboard))

    from llmgw.ctl.offboard import add_parser as add_offboard

    add_offboard(sub, run)
    wheelhouse.add_parser(sub)

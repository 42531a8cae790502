"""`llmgw ctl offboard NODE`: a node taken away — checked first, then drained, its agent removed over ssh, its certificate revoked.

Everything that can be known without changing anything is asked first, in
the ``check`` step: that NODE is a node's name (:func:`llmgw.pki.node_name_problem`),
and that the CA (``--ca-dir``, or the control plane's ``pki.ca_dir``) holds
node NODE's certificate and would revoke it.  A name whose certificate is
the server's, an operator's, a router worker's or no one's is refused there,
before the fleet is drained or a host reached over ssh: ``ctl offboard
llmgw-server`` must not remove an llmgw install from the server's machine
first and find out afterwards.
"""

from __future__ import annotations

import json
import sys

from llmgw.answers import DrainAnswer, RevocableNode, RevokedNode
from llmgw.ctl.layout import Layout
from llmgw.ctl.onboard import Run, _checked, _in_thread, _where, check_node_id, fleet_node, read_answer
from llmgw.ctl.ssh import Refusal, Ssh, StepFailed, ssh_target
from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.states import NodeState


async def cmd_offboard(session, args) -> int:
    """Check that NODE is a node the CA would revoke, then drain it, stop and remove its agent over ssh, and revoke it."""
    from autobahn.wamp.exception import ApplicationError

    out = sys.stderr if args.json else sys.stdout
    check_node_id(args.node, "node")
    run = Run(args.host or args.node, out, node_id=args.node)
    layout = Layout(args.prefix, args.config_dir, args.state_dir, args.unit_dir).checked().for_node(args.node)

    async def check():
        if args.ca_dir is not None:
            from llmgw.pki.nodes import node_to_revoke

            try:
                cert = node_to_revoke(args.ca_dir, args.node)
            except LlmgwError as e:
                raise Refusal(f"{e}; nothing was drained, removed or revoked") from None
            return f"node {args.node}'s certificate, serial {cert.serial_number:x}, is in {args.ca_dir}", None
        try:
            answer = await session.call(uris.CP_REVOKE_NODE, args.node, check=True)
        except ApplicationError as e:
            raise Refusal(f"{e.args[0] if e.args else e.error}; nothing was drained, removed or revoked") from None
        try:
            revocable = read_answer(RevocableNode, answer, uris.CP_REVOKE_NODE)
        except Refusal as e:
            raise Refusal(f"{e}; nothing was drained, removed or revoked") from None
        return f"node {args.node}'s certificate, serial {revocable.serial}, is the control plane's to revoke", None

    async def drain():
        view = await fleet_node(session, args.node)
        if view is None or view.state != NodeState.READY:
            return "not connected; nothing to drain", None
        try:
            answer = read_answer(DrainAnswer, await session.call(uris.CP_DRAIN, args.node), uris.CP_DRAIN)
        except ApplicationError as e:
            raise Refusal(f"drain: {e.args[0] if e.args else e.error}") from None
        except Refusal as e:
            raise Refusal(f"drain: {e}") from None
        return f"cordoned, {len(answer.stopped or [])} shard(s) stopped", None

    async def remove():
        if args.unreachable:
            return "skipped (--unreachable): whatever is on the node stays there", None
        answer = await _in_thread(Ssh(run.target, args.ssh_config, args.python).run, "remove", layout.request())
        run.changed.extend(answer["changed"])
        done = f"removed {', '.join(answer['changed'])}" if answer["changed"] else "no agent was installed"
        return f"{answer['stopped']}; {done}", None

    async def revoke():
        if args.ca_dir is not None:
            from llmgw.pki.nodes import revoke_node as revoke_here

            try:
                done = revoke_here(args.ca_dir, args.node)
            except LlmgwError as e:
                raise Refusal(str(e)) from None
            return (f"serial {done.revocation.serial:x} in {done.path}; copy it to the server and run "
                    "`llmgw ctl reload`"), None
        try:
            answer = await session.call(uris.CP_REVOKE_NODE, args.node)
        except ApplicationError as e:
            raise Refusal(e.args[0] if e.args else e.error) from None
        done = read_answer(RevokedNode, answer, uris.CP_REVOKE_NODE)
        what = "was already revoked" if done.already else "revoked"
        return f"serial {done.serial} {what}; {done.hub or 'the hub refuses it from now on'}", None

    try:
        for name, work in (("check", check), ("drain", drain), ("remove", remove), ("revoke", revoke)):
            await run.step(name, work)
        run.result = "offboarded"
    except (Refusal, StepFailed) as e:
        run.result, run.reason = "failed", str(e)
    if args.json:
        json.dump(run.summary(), sys.stdout, indent=2)
        print()
    return 0 if run.result == "offboarded" else 1


def add_parser(sub, run) -> None:
    """``ctl offboard``; *run* wraps the command with its session to the hub."""
    offboard = sub.add_parser("offboard", help="drain a node, remove its agent over ssh and revoke its certificate")
    offboard.add_argument("node", metavar="NODE", type=_checked(check_node_id, "node"),
                          help="the node's id, its short host name")
    offboard.add_argument("--host", metavar="[USER@]HOST", type=_checked(ssh_target),
                          help="how ssh reaches it (default: NODE)")
    offboard.add_argument("--unreachable", action="store_true", help="the machine is gone: drain and revoke only")
    _where(offboard)
    offboard.set_defaults(func=run(cmd_offboard))

"""The answers to operators' commands (``llmgw.answers``): each read back as its record, an odd one refused in words.

Every reader of an answer decodes it with ``from_wire`` and reads its
fields: ctl, the dashboard and the admin page for the node verbs and a
reload; ctl's onboarding and offboarding for ``llmgw.cp.onboarding``,
``sign_node`` and ``revoke_node``.  An answer that does not fit is refused,
naming the field, rather than read by key and failing on a ``KeyError`` or
printing what a hostile server put there.  The wire form is the one older
readers read by key.
"""

from __future__ import annotations

import argparse
import json

import attrs
import pytest
import pytest_twisted
from twisted.internet import defer

from llmgw import answers
from llmgw.answers import (NODE_SHARDS, CordonAnswer, DrainAnswer, Onboarding, ReloadAnswer, RevocableNode, RevokedNode,
                           SignableNode, SignedNode)
from llmgw.ctl.ssh import Refusal
from llmgw.errors import LlmgwError
from llmgw.link import uris
from llmgw.records import PROSE
from llmgw.text import printable
from llmgw.wire import bounds_of, from_wire, to_wire
from tests.test_wire_bounds import leaves

ODD_ANSWERS = [
    (CordonAnswer, {"node": 5, "cordoned": True}, "CordonAnswer.node: expected str, got int 5"),
    (CordonAnswer, {"node": "n1\x1b[2J", "cordoned": True},
     "CordonAnswer.node: control character U+001B at 2, which a name may not hold"),
    (CordonAnswer, {"node": "n1"}, "CordonAnswer.cordoned: missing"),
    (CordonAnswer, {"node": "n1", "cordoned": "yes"}, "CordonAnswer.cordoned: expected bool, got str 'yes'"),
    (DrainAnswer, {"node": "n1", "cordoned": True, "stopped": "echo/0/0"},
     "DrainAnswer.stopped: expected a list, got str 'echo/0/0'"),
    (DrainAnswer, {"node": "n1", "cordoned": True, "stopped": ["echo/0/0"] * (NODE_SHARDS + 1)},
     f"DrainAnswer.stopped: {NODE_SHARDS + 1} entries, more than the {NODE_SHARDS} it may have"),
    (ReloadAnswer, {"changes": "all of them"}, "ReloadAnswer.changes: expected a list, got str 'all of them'"),
    (ReloadAnswer, {"changes": [1]}, "ReloadAnswer.changes[0]: expected str, got int 1"),
    (ReloadAnswer, ["a change"], "ReloadAnswer: expected a mapping, got list ['a change']"),
]


@pytest.mark.parametrize("kind, answer, words", ODD_ANSWERS)
def test_an_odd_answer_to_a_node_verb_or_a_reload_is_refused_in_words_by_ctl_the_dashboard_and_the_admin_page(
        kind, answer, words):
    from llmgw.admin import source
    from llmgw.admin.site import SourceError
    from llmgw.ctl.main import decode
    from llmgw.tui import backend

    with pytest.raises(LlmgwError) as ctl:
        decode(kind, answer, "llmgw.cp.drain")
    assert str(ctl.value) == (f"llmgw.cp.drain answered something this ctl cannot read ({printable(words)}); is the "
                              "server a much older or newer llmgw?")
    with pytest.raises(backend.ActionFailed) as dashboard:
        backend._decode(kind, answer, "llmgw.cp.drain")
    assert str(dashboard.value) == f"llmgw.cp.drain answered something this dashboard cannot read: {words}"
    with pytest.raises(SourceError) as page:
        source._decode(kind, answer)
    assert str(page.value) == f"the control plane answered something this page cannot read ({words})"


def test_a_reloads_words_are_kept_as_sent_and_printed_escaped(capsys):
    from llmgw.ctl import tables
    from llmgw.ctl.main import _print, decode

    answer = decode(ReloadAnswer, {"changes": ["models.echo: \x1b[2Jgone", "x" * 5000], "newer": 1}, "llmgw.cp.reload")
    assert answer.changes[0] == "models.echo: \x1b[2Jgone" and len(answer.changes[1]) <= PROSE  # words: cut, not refused
    _print(argparse.Namespace(json=False), answer, tables.reload_text)
    printed = capsys.readouterr().out
    assert printed.startswith("reloaded: models.echo: \\x1b[2Jgone; xxx") and "\x1b" not in printed


PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
#: Each onboarding answer as llmgw.control.identity has sent it since ctl onboard began, key for key.
SENT = [
    (Onboarding("0.9.0", True, PEM), {"version": "0.9.0", "signs": True, "ca": PEM}),
    (SignableNode("edge1", "1f"), {"node": "edge1", "held": "1f"}),
    (SignableNode("edge1", None), {"node": "edge1", "held": None}),
    (SignedNode(PEM, PEM, "1f", "2027-12-06T19:00:00+00:00"),
     {"certificate": PEM, "ca": PEM, "serial": "1f", "not_after": "2027-12-06T19:00:00+00:00"}),
    (RevocableNode("edge1", "1f"), {"node": "edge1", "serial": "1f"}),
    (RevokedNode("edge1", "1f", False, "revocation list reread"),
     {"node": "edge1", "serial": "1f", "already": False, "hub": "revocation list reread"}),
    (CordonAnswer("n1", False), {"node": "n1", "cordoned": False}),
    (DrainAnswer("n1", True, ["echo/0/0"]), {"node": "n1", "cordoned": True, "stopped": ["echo/0/0"]}),
    (ReloadAnswer(["a"]), {"changes": ["a"]}),
]


@pytest.mark.parametrize("record, wire", SENT)
def test_the_answers_wire_form_is_the_one_older_readers_read_by_key_and_reads_back_the_same(record, wire):
    assert to_wire(record) == wire
    assert list(to_wire(record)) == list(wire)
    assert from_wire(type(record), wire) == record


#: Records whose fields are not yet all bounded: the per-node maps of ``ctl weights`` (a debt; it may only shrink).
UNBOUNDED = {"WeightsAnswer"}


def test_every_field_of_an_answer_has_its_bounds_beside_it():
    unbounded = set()
    for name, cls in vars(answers).items():
        if isinstance(cls, type) and attrs.has(cls) and cls.__module__ == answers.__name__:
            attrs.resolve_types(cls)
            unbounded |= {name for f in attrs.fields(cls)
                          if leaves(f.type) & {int, float, str, list, dict} and bounds_of(f) is None}
    assert unbounded == UNBOUNDED, "a record with a field unbounded, or one listed that is bounded now"


# -- onboarding's answers, as ctl onboard and offboard read them --


class Server:
    """A control plane that answers each procedure from ``said`` (by URI, and by URI and ``check``)."""

    def __init__(self, **said):
        self.said = said

    def call(self, uri, *args, **kwargs):
        key = uri.removeprefix(uris.CP) + ("_check" if kwargs.get("check") else "")
        return defer.succeed(self.said[key])


def cannot_read(uri: str, words: str) -> str:
    return f"{uri} answered something this ctl cannot read ({printable(words)}); is the server a much older or newer llmgw?"


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("answer, words", [
    ({"version": "0.9.0", "signs": "yes", "ca": PEM}, "Onboarding.signs: expected bool, got str 'yes'"),
    ({"version": "0.9.0\x1b]0;owned\x07", "signs": True, "ca": PEM},
     "Onboarding.version: control character U+001B at 5, which a name may not hold"),
    ({"version": "0.9.0", "signs": True}, "Onboarding.ca: missing"),
    ({"version": "0.9.0", "signs": True, "ca": "x" * (answers.PEM + 1)},
     f"Onboarding.ca: {answers.PEM + 1} characters, more than the {answers.PEM} it may have"),
    (["0.9.0"], "Onboarding: expected a mapping, got list ['0.9.0']"),
])
async def test_an_odd_onboarding_answer_is_refused_before_any_host_is_reached(answer, words):
    from llmgw.ctl.onboard import cmd_onboard

    args = argparse.Namespace(json=False, node_hub="wss://server.example:8443", hosts=["edge1"], name=[])
    with pytest.raises(Refusal) as refused:
        await cmd_onboard(Server(onboarding=answer), args)
    assert str(refused.value) == cannot_read(uris.CP_ONBOARDING, words)


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("request_pem, answer, words", [
    (None, {"node": "edge1\x1b[2J", "held": None}, "SignableNode.node: control character U+001B at 5, which a name may not hold"),
    (None, {"node": "edge1", "held": 31}, "SignableNode.held: expected str, got int 31"),
    (None, "yes", "SignableNode: expected a mapping, got str 'yes'"),
    (PEM, {"certificate": PEM, "ca": PEM, "serial": "1f"}, "SignedNode.not_after: missing"),
    (PEM, {"certificate": ["a"], "ca": PEM, "serial": "1f", "not_after": "2027"},
     "SignedNode.certificate: expected str, got list ['a']"),
    (PEM, {"certificate": PEM, "ca": PEM, "serial": "1f\u202e", "not_after": "2027"},
     "SignedNode.serial: unprintable character U+202E at 2, which a name may not hold"),
])
async def test_an_odd_answer_to_signing_is_refused_in_words(request_pem, answer, words):
    from llmgw.ctl.onboard import _sign

    args = argparse.Namespace(ca_dir=None, replace=False)
    server = Server(sign_node_check=answer) if request_pem is None else Server(sign_node=answer)
    with pytest.raises(Refusal) as refused:
        await _sign(server, args, "edge1", request_pem)
    assert str(refused.value) == cannot_read(uris.CP_SIGN_NODE, words)


@pytest_twisted.ensureDeferred
async def test_a_signed_certificate_is_read_from_its_record():
    from llmgw.ctl.onboard import _sign

    args = argparse.Namespace(ca_dir=None, replace=False)
    server = Server(sign_node_check=to_wire(SignableNode("edge1", None)),
                    sign_node={**to_wire(SignedNode(PEM, PEM, "1f", "2027")), "newer": 1})
    assert await _sign(server, args, "edge1", None) is None
    assert await _sign(server, args, "edge1", PEM) == (PEM, "1f", "control plane")


def offboard_args(**given) -> argparse.Namespace:
    from llmgw.ctl.layout import UNIT_CONFIG_DIR, UNIT_PREFIX

    return argparse.Namespace(**{"json": True, "node": "edge1", "host": None, "prefix": UNIT_PREFIX,
                                 "config_dir": UNIT_CONFIG_DIR, "state_dir": None, "unit_dir": "/etc/systemd/system",
                                 "ca_dir": None, "unreachable": True, "ssh_config": None, "python": None, **given})


async def offboarded(server: Server, capsys) -> dict:
    from llmgw.ctl.offboard import cmd_offboard

    code = await cmd_offboard(server, offboard_args())
    summary = json.loads(capsys.readouterr().out)
    assert code == (0 if summary["result"] == "offboarded" else 1)
    return summary


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("answer, words", [
    ({"node": "edge1", "serial": 31}, "RevocableNode.serial: expected str, got int 31"),
    ({"node": "edge1"}, "RevocableNode.serial: missing"),
    ({"node": "edge1", "serial": "\x1b[2J"}, "RevocableNode.serial: control character U+001B at 0, which a name may not hold"),
])
async def test_an_odd_answer_to_the_revocation_check_stops_offboarding_before_it_drains(answer, words, capsys):
    summary = await offboarded(Server(revoke_node_check=answer), capsys)
    assert summary["result"] == "failed" and [s["step"] for s in summary["steps"]] == ["check"]
    assert summary["reason"] == cannot_read(uris.CP_REVOKE_NODE, words) + "; nothing was drained, removed or revoked"


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("answer, words", [
    ({"node": "edge1", "serial": "1f", "already": "no"}, "RevokedNode.already: expected bool, got str 'no'"),
    ({"node": "edge1", "serial": "1f"}, "RevokedNode.already: missing"),
    ({"node": "edge1", "serial": "1f", "already": False, "hub": 5}, "RevokedNode.hub: expected str, got int 5"),
])
async def test_an_odd_answer_to_revoking_is_refused_in_words(answer, words, capsys):
    summary = await offboarded(Server(revoke_node_check={"node": "edge1", "serial": "1f"}, node=None,
                                      revoke_node=answer), capsys)
    assert summary["result"] == "failed" and [s["step"] for s in summary["steps"]] == ["check", "drain", "remove",
                                                                                      "revoke"]
    assert summary["reason"] == cannot_read(uris.CP_REVOKE_NODE, words)


@pytest_twisted.ensureDeferred
async def test_offboarding_reads_the_revocation_from_its_record_and_says_what_the_hub_did(capsys):
    summary = await offboarded(Server(revoke_node_check={"node": "edge1", "serial": "1f"}, node=None,
                                      revoke_node={"node": "edge1", "serial": "1f", "already": True, "hub": None}), capsys)
    assert summary["result"] == "offboarded"
    assert summary["steps"][0]["said"] == "node edge1's certificate, serial 1f, is the control plane's to revoke"
    assert summary["steps"][-1]["said"] == "serial 1f was already revoked; the hub refuses it from now on"

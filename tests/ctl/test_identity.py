"""The control plane's signing and revoking for onboarding (llmgw.control.identity), called as the hub would."""

from __future__ import annotations

import shutil

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.request import Registration
from autobahn.wamp.types import CallDetails
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.logger import globalLogPublisher

from llmgw import __version__, pki
from llmgw.control.identity import Identity
from llmgw.link import authz, uris
from llmgw.roles import ROLE_NODE, ROLE_OPERATOR, ROLE_ROUTER


def details(authid: str = "alice", role: str = ROLE_OPERATOR) -> CallDetails:
    return CallDetails(Registration(None, 1, uris.CP_SIGN_NODE, None), caller=1, caller_authid=authid, caller_authrole=role)


def request(cn: str, key=None) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture
def ca(tmp_path, pki):
    shutil.copytree(pki, tmp_path / "ca")
    return tmp_path / "ca"


@pytest.fixture
def identity(ca):
    reread = []
    made = Identity(lambda: str(ca), lambda: reread.append(1) or "revocation list reread",
                    lambda: str(ca / "crl.pem"), lambda: str(ca / "ca.crt"))
    made.reread = reread
    return made


@pytest.fixture
def logged():
    events = []
    globalLogPublisher.addObserver(events.append)
    yield lambda: " ".join(e.get("log_format", "").format(**e) for e in events if "operator" in e)
    globalLogPublisher.removeObserver(events.append)


def test_only_operators_may_sign_and_nodes_cannot_even_call_it(identity):
    with pytest.raises(ApplicationError, match="node07 is not an operator; only operators onboard nodes"):
        identity.sign_node("node07", request("node07"), details=details("node07", ROLE_NODE))
    for uri in (uris.CP_SIGN_NODE, uris.CP_REVOKE_NODE, uris.CP_ONBOARDING):
        assert authz.refusal(ROLE_NODE, "node07", authz.CALL, uri) is not None
        assert authz.refusal(ROLE_ROUTER, "r1", authz.CALL, uri) is not None
        assert authz.refusal(ROLE_OPERATOR, "alice", authz.CALL, uri) is None


def test_sign_answers_the_certificate_for_the_nodes_key_and_logs_the_operator(identity, ca, logged):
    key = ec.generate_private_key(ec.SECP256R1())
    answer = identity.sign_node("edge1", request("edge1", key), details=details("alice"))
    cert = x509.load_pem_x509_certificate(answer["certificate"].encode())
    assert pki.identity_of(cert).name == "edge1" and pki.identity_of(cert).role == "node"
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert answer["ca"] == (ca / "ca.crt").read_text()
    assert "PRIVATE KEY" not in str(answer)
    assert "alice had node edge1's certificate signed" in logged()
    # The same key again renews; another key is another machine, and takes --replace.
    renewed = identity.sign_node("edge1", request("edge1", key), details=details())
    assert renewed["serial"] != answer["serial"] and identity.reread == []
    with pytest.raises(ApplicationError, match="edge1 already has a certificate .* takes --replace"):
        identity.sign_node("edge1", request("edge1"), details=details())
    identity.sign_node("edge1", request("edge1"), True, details=details("bob"))
    assert "bob replaced node edge1: revoked serial" in logged()
    assert identity.reread == [1]
    assert int(renewed["serial"], 16) in pki.read_revocations(ca / "crl.pem", x509.load_pem_x509_certificate(
        (ca / "ca.crt").read_bytes())).entries


def test_sign_refuses_a_request_for_another_name_a_dotted_id_and_no_ca(identity, ca):
    with pytest.raises(ApplicationError, match="the certificate request is for 'edge2', not 'edge1'"):
        identity.sign_node("edge1", request("edge2"), details=details())
    with pytest.raises(ApplicationError, match="is not a single DNS label"):
        identity.sign_node("edge1.example.org", request("edge1.example.org"), details=details())
    with pytest.raises(ApplicationError, match="at most 16384 bytes"):
        identity.sign_node("edge1", "x" * 20000, details=details())
    none = Identity(lambda: None, lambda: None, lambda: None, lambda: str(ca / "ca.crt"))
    assert none.onboarding(details=details()) == {"version": __version__, "signs": False,
                                                  "ca": (ca / "ca.crt").read_text()}
    with pytest.raises(ApplicationError, match=r"keeps no CA \(pki.ca_dir is not set in server.yaml\); sign "
                                               r"edge1's request there with `llmgw pki sign"):
        none.sign_node("edge1", request("edge1"), details=details())


def test_revoke_lists_the_nodes_certificate_and_has_the_hub_read_it(identity, ca, logged):
    identity.sign_node("edge1", request("edge1"), details=details())
    answer = identity.revoke_node("edge1", details=details("alice"))
    assert answer["already"] is False and answer["hub"] == "revocation list reread"
    assert "alice revoked node edge1's certificate" in logged()
    assert identity.revoke_node("edge1", details=details())["already"] is True
    with pytest.raises(ApplicationError, match="has no certificate edge9.crt to revoke"):
        identity.revoke_node("edge9", details=details())
    # tls.crl names another file: the CA's list is put there; one the server cannot write refuses.
    hub = ca.parent / "hub" / "crl.pem"
    hub.parent.mkdir()
    elsewhere = Identity(lambda: str(ca), lambda: None, lambda: str(hub), lambda: str(ca / "ca.crt"))
    elsewhere.revoke_node("edge1", details=details())
    assert hub.read_bytes() == (ca / "crl.pem").read_bytes()
    gone = Identity(lambda: str(ca), lambda: None, lambda: str(ca.parent / "gone" / "crl.pem"), lambda: str(ca / "ca.crt"))
    with pytest.raises(ApplicationError, match=r"cannot write the hub's revocation list .*gone/crl.pem .* set tls.crl"):
        gone.revoke_node("edge1", details=details())


def test_pki_ca_dir_in_server_yaml_is_a_path_or_absent(tmp_path, pki):
    from llmgw.config.server import load_server_config
    from llmgw.errors import ConfigError

    base = f'listen: {{link: "ssl:7443"}}\ntls: {{ca: {pki}/ca.crt, cert: {pki}/llmgw-server.crt, key: {pki}/llmgw-server.key}}\n'
    path = tmp_path / "server.yaml"
    path.write_text(base)
    assert load_server_config(path).pki.ca_dir is None
    path.write_text(base + f"pki: {{ca_dir: {pki}}}\n")
    assert load_server_config(path).pki.ca_dir == str(pki)
    # Relative, it is read from server.yaml's directory, as tls.* are (tests/config/test_relative_paths.py).
    path.write_text(base + "pki: {ca_dir: ''}\n")
    with pytest.raises(ConfigError, match=r"pki.ca_dir: empty path; give the directory's path, or remove the key"):
        load_server_config(path)


def documented_layout(tmp_path, pki_dir):
    """docs/onboarding.rst's server: tls.ca at /etc/llmgw/ca.crt, the CA in pki.ca_dir /etc/llmgw/pki, no tls.crl."""
    from llmgw.tlsfiles import TLSFiles

    etc = tmp_path / "etc-llmgw"
    shutil.copytree(pki_dir, etc / "pki")
    shutil.copy(etc / "pki" / "ca.crt", etc / "ca.crt")
    files = TLSFiles(str(etc / "ca.crt"), str(etc / "pki" / "llmgw-server.crt"), str(etc / "pki" / "llmgw-server.key"))
    made = Identity(lambda: str(etc / "pki"), lambda: None, files.revocation_list, lambda: files.ca)
    return made, files


def test_revoke_in_the_documented_layout_writes_the_list_the_hub_reads(tmp_path, pki):
    from llmgw.link.tls import load_revocations

    identity, files = documented_layout(tmp_path, pki)
    assert files.revocation_list() is None
    signed = identity.sign_node("edge1", request("edge1"), details=details())
    answer = identity.revoke_node("edge1", details=details())
    # The hub reads crl.pem beside tls.ca; that is where the node's serial now is.
    assert files.revocation_list() == str(tmp_path / "etc-llmgw" / "crl.pem")
    assert load_revocations(files).revoked(int(signed["serial"], 16)) is not None
    assert "not" not in (answer["hub"] or "")
    # A second node: the hub's list and the CA's stay one list.
    second = identity.sign_node("edge2", request("edge2"), details=details())
    identity.revoke_node("edge2", details=details())
    assert set(load_revocations(files).entries) == {int(signed["serial"], 16), int(second["serial"], 16)}


def test_revoke_refuses_to_drop_serials_only_the_hubs_list_has(tmp_path, pki):
    identity, files = documented_layout(tmp_path, pki)
    # The hub's list was written by hand from another copy of the CA's directory.
    other = tmp_path / "copy"
    shutil.copytree(tmp_path / "etc-llmgw" / "pki", other)
    from llmgw.pki import issue, revoke

    issue(other, "edge9", "node")
    revoke(other, "edge9")
    shutil.copy(other / "crl.pem", tmp_path / "etc-llmgw" / "crl.pem")
    identity.sign_node("edge1", request("edge1"), details=details())
    with pytest.raises(ApplicationError, match=r"crl.pem revokes 1 certificate\(s\) the CA's list .* does not"):
        identity.revoke_node("edge1", details=details())


def ca_dir_sign(ca, node_id: str, csr: str, replace: bool = False) -> dict:
    """`ctl onboard --ca-dir`'s signing (no session is used on that path), run to its end."""
    import argparse

    from llmgw.ctl.onboard import _sign

    coro = _sign(None, argparse.Namespace(ca_dir=str(ca), replace=replace), node_id, csr)
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    return dict(zip(("certificate", "serial", "by"), done.value.value))


def test_ca_dir_signing_takes_a_held_name_only_with_replace_which_revokes_the_old(ca):
    from llmgw.ctl.ssh import Refusal

    key = ec.generate_private_key(ec.SECP256R1())
    first = ca_dir_sign(ca, "edge1", request("edge1", key))
    assert ca_dir_sign(ca, "edge1", request("edge1", key))["serial"] != first["serial"]  # the same key renews
    renewed = x509.load_pem_x509_certificate((ca / "edge1.crt").read_bytes())
    with pytest.raises(Refusal, match="edge1 already has a certificate .* takes --replace"):
        ca_dir_sign(ca, "edge1", request("edge1"))
    assert x509.load_pem_x509_certificate((ca / "edge1.crt").read_bytes()) == renewed
    replaced = ca_dir_sign(ca, "edge1", request("edge1"), replace=True)
    assert f"serial {renewed.serial_number:x} revoked in {ca / 'crl.pem'}" in replaced["by"]
    listed = pki.read_revocations(ca / "crl.pem", x509.load_pem_x509_certificate((ca / "ca.crt").read_bytes()))
    assert listed.revoked(renewed.serial_number) is not None and listed.revoked(int(replaced["serial"], 16)) is None


def test_an_offboarded_name_is_signed_again_for_a_new_key_without_replace(identity, ca):
    old = identity.sign_node("edge1", request("edge1"), details=details())
    identity.revoke_node("edge1", details=details())
    # Offboarding deleted the machine's key; its certificate is revoked, so nothing is taken.
    again = identity.sign_node("edge1", request("edge1"), details=details())
    assert again["serial"] != old["serial"] and identity.reread == [1]
    # Its own certificate is not revoked: another key takes --replace again.
    with pytest.raises(ApplicationError, match="takes --replace"):
        identity.sign_node("edge1", request("edge1"), details=details())
    identity.revoke_node("edge1", details=details())
    assert ca_dir_sign(ca, "edge1", request("edge1"))["by"] == f"CA in {ca}"


def test_an_offboarded_node_is_forgotten_by_the_fleet_and_no_lost_alert_stays(ca):
    from prometheus_client import CollectorRegistry, generate_latest
    from twisted.internet.task import Clock

    from llmgw.control.collector import FleetCollector
    from llmgw.control.fleet import Fleet
    from llmgw.records import Inventory
    from llmgw.states import NodeState

    clock, events = Clock(), []
    fleet = Fleet(clock, lambda kind, ident, event: events.append((kind, ident, event)), 15, 60)
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet, clock))
    identity = Identity(lambda: str(ca), lambda: None, lambda: str(ca / "crl.pem"), lambda: str(ca / "ca.crt"),
                        forget=fleet.forget_node)
    identity.sign_node("edge1", request("edge1"), details=details())
    fleet.register("edge1", 7, Inventory(node_id="edge1", address="10.0.0.5"))
    fleet.register("edge2", 8, Inventory(node_id="edge2", address="10.0.0.6"))
    clock.advance(61)
    fleet.check()
    assert fleet.nodes["edge1"].state == NodeState.LOST
    assert [v.id for v in fleet.views()] == ["edge1", "edge2"]  # listed once: the paged order is built
    assert 'llmgw_node_state{node="edge1",state="lost"} 1.0' in generate_latest(registry).decode()
    identity.revoke_node("edge1", details=details())
    assert "edge1" not in fleet.nodes and "edge2" in fleet.nodes
    # The listing (ctl nodes, paged in id order) forgets it too.
    assert [v.id for v in fleet.views()] == ["edge2"]
    assert 'node="edge1"' not in generate_latest(registry).decode()
    assert (events[-1][1], events[-1][2].change) == ("edge1", "forgotten")
    assert fleet.forget_node("edge1") is False
    # Onboarded again, it registers as a new node.
    fleet.register("edge1", 9, Inventory(node_id="edge1", address="10.0.0.7"))
    assert fleet.nodes["edge1"].state == NodeState.READY


def test_asked_to_check_the_control_plane_says_what_it_would_refuse_and_changes_nothing(identity, ca):
    # ctl offboard and ctl onboard ask this before they drain, remove or install anything.
    before = sorted((p.name, p.read_bytes()) for p in ca.iterdir())
    for name, role in (("llmgw-server", "server"), ("alice", "operator"), ("r1", "router")):
        for call in (lambda: identity.revoke_node(name, check=True, details=details()),
                     lambda: identity.sign_node(name, check=True, details=details()),
                     lambda: identity.sign_node(name, check=True, replace=True, details=details())):
            with pytest.raises(ApplicationError, match=f"is the {role} certificate of {name}, not a node's"):
                call()
    with pytest.raises(ApplicationError, match="has no certificate edge9.crt to revoke"):
        identity.revoke_node("edge9", check=True, details=details())
    with pytest.raises(ApplicationError, match="not a usable certificate name"):
        identity.revoke_node("node_", check=True, details=details())
    serial = x509.load_pem_x509_certificate((ca / "node01.crt").read_bytes()).serial_number
    assert identity.revoke_node("node01", check=True, details=details()) == {"node": "node01", "serial": f"{serial:x}"}
    assert identity.sign_node("node01", check=True, details=details()) == {"node": "node01", "held": f"{serial:x}"}
    assert identity.sign_node("edge9", check=True, details=details()) == {"node": "edge9", "held": None}
    assert sorted((p.name, p.read_bytes()) for p in ca.iterdir()) == before and identity.reread == []
    with pytest.raises(ApplicationError, match="node07 is not an operator"):
        identity.revoke_node("node01", check=True, details=details("node07", ROLE_NODE))

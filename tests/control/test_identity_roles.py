"""The control plane's CA (llmgw.control.identity) acts on node certificates only, and says so in llmgw's words.

Before, ``llmgw.cp.revoke_node(NAME)`` revoked whatever NAME.crt was in
``pki.ca_dir`` (an operator's, a router worker's), and
``llmgw.cp.sign_node(NAME, CSR, replace=True)`` overwrote the server's own
certificate file with a node's: the next server restart failed.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.request import Registration
from autobahn.wamp.types import CallDetails
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmgw.control.identity import Identity
from llmgw.link import uris
from llmgw.roles import ROLE_OPERATOR
from tests.support.cluster import Cluster


def details() -> CallDetails:
    return CallDetails(Registration(None, 1, uris.CP_SIGN_NODE, None), caller=1, caller_authid="alice",
                       caller_authrole=ROLE_OPERATOR)


def request(cn: str) -> str:
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])).sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def snapshot(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def ca(tmp_path, pki):
    shutil.copytree(pki, tmp_path / "ca")
    return tmp_path / "ca"


@pytest.mark.parametrize("name, role", [("llmgw-server", "server"), ("alice", "operator"), ("r1", "router")])
def test_the_control_plane_refuses_to_sign_over_or_revoke_another_roles_certificate(ca, name, role) -> None:
    reread, forgotten = [], []
    identity = Identity(lambda: str(ca), lambda: reread.append(1), lambda: str(ca / "crl.pem"),
                        lambda: str(ca / "ca.crt"), forget=forgotten.append)
    before = snapshot(ca)
    said = f"{ca / name}.crt is the {role} certificate of {name}, not a node's"
    for call in (lambda: identity.sign_node(name, request(name), True, details=details()),
                 lambda: identity.revoke_node(name, details=details())):
        with pytest.raises(ApplicationError) as refused:
            call()
        assert refused.value.error == uris.ERROR_REFUSED and refused.value.args[0].startswith(said)
    assert snapshot(ca) == before and reread == [] and forgotten == []


def test_a_dotted_node_id_is_refused_with_the_short_name_to_use(ca) -> None:
    identity = Identity(lambda: str(ca), lambda: None, lambda: str(ca / "crl.pem"), lambda: str(ca / "ca.crt"))
    with pytest.raises(ApplicationError) as dotted:
        identity.sign_node("edge1.example.org", request("edge1.example.org"), details=details())
    assert re.fullmatch("node id 'edge1.example.org' is not a single DNS label, .*: use 'edge1', its short host name",
                        dotted.value.args[0])
    with pytest.raises(ApplicationError) as newline:
        identity.revoke_node("alice\n", details=details())
    assert newline.value.args[0].startswith("node id 'alice\\n' is not a usable certificate name")


@pytest.mark.integration
def test_ctl_offboard_unreachable_of_an_operators_name_is_refused_and_revokes_nothing(tmp_path, pki) -> None:
    fleet = Cluster(tmp_path, pki)
    path = fleet.write_server_config()
    path.write_text(path.read_text() + f"pki: {{ca_dir: {fleet.pki}}}\n")
    fleet.start_server()
    try:
        before = snapshot(fleet.pki)
        out = fleet.ctl("offboard", "alice", "--unreachable", "--json", timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        result = json.loads(out.stdout)
        assert result["result"] == "failed"
        assert result["reason"].startswith(f"{fleet.pki}/alice.crt is the operator certificate of alice, not a node's;")
        assert "Traceback" not in out.stderr and "llmgw.error." not in result["reason"]
        assert snapshot(fleet.pki) == before
        # Signing here with --ca-dir: the same rule, the same words.
        out = fleet.ctl("offboard", "r1", "--unreachable", "--ca-dir", str(fleet.pki), "--json", timeout=60)
        assert out.returncode == 1, out.stdout + out.stderr
        assert json.loads(out.stdout)["reason"].startswith(
            f"{fleet.pki}/r1.crt is the router certificate of r1, not a node's;")
        assert snapshot(fleet.pki) == before
        # alice's certificate still opens a session: ctl works with it.
        assert fleet.ctl("nodes", "--json").returncode == 0
    finally:
        fleet.stop()


"""A node's id is its short host name everywhere: the agent derives it, ``llmgw pki`` signs it, the hub admits it, by one rule.

Before, the rule was written twice (the hub's pattern, and ``llmgw pki``'s
own test for dots and length), an agent configured with a fully qualified
node_id started and was then refused at every reconnection, and a dotted
name was refused without saying which short name to use.
"""

from __future__ import annotations

import types

import pytest
import pytest_twisted
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor

from llmgw import pki
from llmgw.agent.nodeid import node_id_for
from llmgw.errors import ConfigError, PKIError
from llmgw.link import authz
from llmgw.link.client import connect_once
from llmgw.pki.subject import node_name_problem
from tests.link.test_tls_revocation import ca, files, joined, start_hub  # noqa: F401 (ca: a fixture)
from tests.support.cluster import Cluster
from tests.support.wait import wait_for


@given(st.one_of(st.text(max_size=80), st.from_regex(r"[A-Za-z0-9._\n-]{0,70}", fullmatch=True)))
def test_every_node_name_pki_signs_the_hub_admits_and_every_other_is_refused_saying_why(name: str) -> None:
    problem = node_name_problem(name)
    if problem is None:
        assert authz.session_refusal("node", name) is None and pki.name_problem(name) is None
    else:
        assert problem and "\n" not in problem.replace("\\n", "")
        with pytest.raises(PKIError):
            pki.authority._check_holder(name, "node")


def test_a_trailing_newline_is_no_node_id_on_the_link() -> None:
    assert not authz.is_node_id("node01\n") and authz.session_refusal("node", "node01\n") is not None
    assert authz.is_node_id("node01") and not authz.is_node_id(None)


def agent_config(tmp_path, node_id: str | None, cn: str):
    pki.init_ca(tmp_path / "ca")
    cert = tmp_path / "node.crt"
    cert.write_bytes(signed_past_the_checks(tmp_path / "ca", cn, ec.generate_private_key(ec.SECP256R1())))
    return types.SimpleNamespace(node_id=node_id, tls=types.SimpleNamespace(cert=str(cert)))


def test_the_agent_takes_the_first_label_of_a_fully_qualified_host_name(tmp_path) -> None:
    config = agent_config(tmp_path, None, "node05")
    assert node_id_for(config, hostname=lambda: "node05.example.org") == "node05"
    assert node_id_for(config, hostname=lambda: "node05") == "node05"


def test_the_agent_refuses_a_fully_qualified_node_id_naming_the_short_one(tmp_path) -> None:
    config = agent_config(tmp_path, "node05.example.org", "node05.example.org")
    with pytest.raises(ConfigError, match="^node_id in the agent configuration: 'node05.example.org' is not a single "
                                          "DNS label, .*: use 'node05', its short host name$"):
        node_id_for(config, hostname=lambda: "elsewhere")


def test_the_agent_refuses_a_host_name_that_gives_no_node_id(tmp_path) -> None:
    config = agent_config(tmp_path, None, "node05")
    with pytest.raises(ConfigError, match="^this host's name '-x.example.org' gives no usable node id: .*Set node_id "
                                          "in the agent configuration"):
        node_id_for(config, hostname=lambda: "-x.example.org")


@pytest.mark.integration
def test_an_agent_with_a_fully_qualified_node_id_stops_at_start_saying_which_to_use(tmp_path, pki) -> None:  # noqa: F811
    fleet = Cluster(tmp_path, pki)
    # A certificate for the dotted name, as an older llmgw or openssl could make it.
    key = ec.generate_private_key(ec.SECP256R1())
    cert = signed_past_the_checks(fleet.pki, "node07.example.org", key)
    (fleet.pki / "node07.example.org.crt").write_bytes(cert)
    (fleet.pki / "node07.example.org.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    agent = fleet.start_agent("node07.example.org")
    try:
        wait_for(lambda: not agent.running(), 30, "the agent to stop at start", detail=fleet.logs)
        assert "node_id in the agent configuration: 'node07.example.org' is not a single DNS label" in agent.output()
        assert "use 'node07', its short host name" in agent.output()
    finally:
        fleet.stop()


def signed_past_the_checks(directory, cn: str, key) -> bytes:
    """A node certificate for *cn* from the CA in *directory*, signed without ``llmgw pki``'s checks."""
    made = pki.authority._certificate(*pki.authority._load_ca(directory), cn, "node", key.public_key(), [], 30)
    return made.public_bytes(serialization.Encoding.PEM)


@pytest_twisted.ensureDeferred
async def test_the_longest_node_name_pki_signs_joins_the_hub(ca) -> None:  # noqa: F811
    name = "n" + "-_" * 30 + "x1"
    assert len(name) == pki.MAX_LABEL
    pki.issue(ca, name, "node")
    with pytest.raises(PKIError, match="not a single DNS label"):
        pki.issue(ca, name + "2", "node")
    hub = await start_hub(ca)
    try:
        session = await connect_once(reactor, hub.address, files(ca, name), timeout=5)
        assert joined(hub) == [name]
        session.leave()
    finally:
        await hub.port.stopListening()

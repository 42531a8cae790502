"""The link's TLS files that do not load say which file is wrong and how, in llmgw's words, not OpenSSL's.

Before, a key that did not fit its certificate was "[('DECODER routines', '', 'unsupported')]"
or "[('X509 certificate routines', '', 'key values mismatch')]".
"""

from __future__ import annotations

import shutil

import pytest
from cryptography.hazmat.primitives import serialization

from llmgw.errors import PKIError
from llmgw.link.tls import certificate_common_name, client_options, server_options
from llmgw.tlsfiles import TLSFiles

OPENSSL = ("routines", "[(", "unsupported", "mismatch", "Error")


@pytest.fixture
def own(pki, tmp_path):
    for name in ("ca.crt", "node01.crt", "node01.key", "node02.key", "llmgw-server.crt", "llmgw-server.key"):
        shutil.copy(pki / name, tmp_path / name)
    return tmp_path


def _encrypted(path) -> None:
    key = serialization.load_pem_private_key(path.read_bytes(), None)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"secret")))


CASES = {
    "a certificate that is not PEM": (lambda d: (d / "node01.crt").write_text("not a certificate\n"),
                                      "node01.crt is not a PEM certificate; write the certificate and its key "
                                      "with `llmgw pki issue`"),
    "a key that is not PEM": (lambda d: (d / "node01.key").write_text("not a key\n"),
                              "node01.key is not a PEM private key"),
    "an encrypted key": (lambda d: _encrypted(d / "node01.key"),
                         "node01.key is encrypted, and llmgw reads a key without a passphrase"),
    "another certificate's key": (lambda d: shutil.copy(d / "node02.key", d / "node01.key"),
                                  "node01.key is not the key of"),
    "a CA file that is not PEM": (lambda d: (d / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n"),
                                  "ca.crt is not a PEM certificate; it is the cluster CA's ca.crt"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tls_files_that_do_not_load_say_which_and_why(own, case):
    spoil, says = CASES[case]
    spoil(own)
    files = TLSFiles(str(own / "ca.crt"), str(own / "node01.crt"), str(own / "node01.key"))
    with pytest.raises(PKIError) as refused:
        client_options(files, "127.0.0.1")
    assert says in str(refused.value)
    for internal in OPENSSL:
        assert internal not in str(refused.value)


def test_the_hub_s_own_files_say_the_same(own):
    shutil.copy(own / "node01.key", own / "llmgw-server.key")
    with pytest.raises(PKIError, match="llmgw-server.key is not the key of .*llmgw-server.crt"):
        server_options(TLSFiles(str(own / "ca.crt"), str(own / "llmgw-server.crt"), str(own / "llmgw-server.key")))


def test_an_agent_s_certificate_that_is_not_pem_is_a_sentence(own):
    (own / "node01.crt").write_text("not a certificate\n")
    with pytest.raises(PKIError, match="node01.crt is not a PEM certificate"):
        certificate_common_name(str(own / "node01.crt"))

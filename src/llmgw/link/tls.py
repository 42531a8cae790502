"""TLS contexts for both ends of the link, from the cluster CA's files.

The hub requires a client certificate signed by the cluster CA; clients check
the hub's certificate against the same CA and the hub's name or address.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from twisted.internet import ssl

from llmgw.errors import PKIError
from llmgw.tlsfiles import TLSFiles


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise PKIError(f"{path}: cannot read the {what}: {e.strerror}") from None


def _private_certificate(files: TLSFiles) -> ssl.PrivateCertificate:
    cert = _read(files.cert, "certificate")
    key = _read(files.key, "private key")
    try:
        return ssl.PrivateCertificate.loadPEM(cert + b"\n" + key)
    except Exception as e:
        raise PKIError(
            f"{files.cert} and {files.key} do not load as a certificate and its key: {e}"
        ) from None


def _ca(files: TLSFiles) -> ssl.Certificate:
    try:
        return ssl.Certificate.loadPEM(_read(files.ca, "CA certificate"))
    except PKIError:
        raise
    except Exception as e:
        raise PKIError(f"{files.ca} is not a PEM certificate: {e}") from None


def server_options(files: TLSFiles) -> ssl.CertificateOptions:
    """Options for the hub's listener: present our certificate, require theirs."""
    mine = _private_certificate(files)
    return ssl.CertificateOptions(
        privateKey=mine.privateKey.original,
        certificate=mine.original,
        verify=True,
        caCerts=[_ca(files).original],
        requireCertificate=True,
        raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
    )


def client_options(files: TLSFiles, hub_host: str):
    """Options for dialling the hub: check it against the CA and its name."""
    return ssl.optionsForClientTLS(
        hub_host,
        trustRoot=_ca(files),
        clientCertificate=_private_certificate(files),
    )


def certificate_common_name(path: str) -> str | None:
    """The CN of the certificate in *path*, to check an agent's id before dialling."""
    cert = x509.load_pem_x509_certificate(_read(path, "certificate"))
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else None

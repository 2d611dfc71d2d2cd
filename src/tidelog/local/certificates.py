"""A throwaway certificate authority for local clusters: ``tidelog dev-cluster --tls`` and TLS tests.

:func:`make_dev_certificates` writes, under one directory, a CA and two certificates it signs:

- ``ca.pem`` — the CA certificate: what brokers (``tls_ca``, ``tls_client_ca``) and clients (``--tls-ca``) trust;
- ``broker.pem``/``broker.key`` — the brokers' certificate, for ``localhost`` and ``127.0.0.1`` (and any other
  names given), usable both to serve and to dial other brokers (mutual TLS between brokers);
- ``client.pem``/``client.key`` — a client certificate whose subject CN is ``client``: the principal
  ``client``, allowed nothing until ACLs grant it something;
- ``admin.pem``/``admin.key`` — a client certificate whose subject CN is ``admin``: the principal a local
  cluster with TLS makes its super user (``super_users = admin``).

Keys are ECDSA P-256, certificates valid for ``days`` days. This is for trying the secure setup on one machine:
the CA's key is written beside the certificates (``ca.key``), unprotected. A real deployment has its own CA
(docs/security.md says how to set one up for three hosts).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DevCertificates", "make_dev_certificates"]


@dataclass(frozen=True, slots=True)
class DevCertificates:
    """Where :func:`make_dev_certificates` wrote each file."""

    ca: Path
    broker_cert: Path
    broker_key: Path
    client_cert: Path
    client_key: Path
    admin_cert: Path
    admin_key: Path


def make_dev_certificates(
    directory: Path, *, hosts: Sequence[str] = ("localhost", "127.0.0.1"), days: int = 30
) -> DevCertificates:
    """Write a new CA and a broker and a client certificate signed by it under ``directory`` (see the module)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidelog dev CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(common_name: str, names: Sequence[str]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    files = DevCertificates(
        directory / "ca.pem",
        directory / "broker.pem",
        directory / "broker.key",
        directory / "client.pem",
        directory / "client.key",
        directory / "admin.pem",
        directory / "admin.key",
    )
    _write(files.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(directory / "ca.key", _key_pem(ca_key), private=True)
    broker_pem, broker_key = issue("broker", hosts)
    _write(files.broker_cert, broker_pem)
    _write(files.broker_key, broker_key, private=True)
    client_pem, client_key = issue("client", ())
    _write(files.client_cert, client_pem)
    _write(files.client_key, client_key, private=True)
    admin_pem, admin_key = issue("admin", ())
    _write(files.admin_cert, admin_pem)
    _write(files.admin_key, admin_key, private=True)
    return files


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    pkcs8, no_password = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, no_password)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)

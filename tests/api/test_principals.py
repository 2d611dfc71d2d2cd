"""Principals from verified client certificates: the CN or the first SAN, anonymous without either, and which
names are brokers."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tidelog.api.principals import ANONYMOUS, Principal, PrincipalResolver, principal_name


def cert(leaf: trustme.LeafCert) -> x509.Certificate:
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def self_signed(cn: str | None, *names: x509.GeneralName) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else [])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(key, hashes.SHA256())


def test_cn_and_san() -> None:
    uri = x509.UniformResourceIdentifier("spiffe://example.org/svc")
    leaf = self_signed("alice", uri, x509.DNSName("svc.example.org"))
    assert principal_name(leaf, "cn") == "alice"
    assert principal_name(leaf, "san") == "svc.example.org"  # a DNS name comes first
    assert principal_name(self_signed(None, uri), "san") == "spiffe://example.org/svc"
    assert principal_name(self_signed(None, uri), "cn") is None
    assert principal_name(self_signed("x", x509.RFC822Name("bob@example.org")), "san") == "bob@example.org"
    assert principal_name(self_signed("x"), "san") is None


def test_a_certificate_without_the_name_asked_for_is_anonymous(ca: trustme.CA) -> None:
    no_cn = cert(ca.issue_cert("svc.example.org"))
    resolver = PrincipalResolver("cn", ())
    assert resolver.of_certificate(no_cn) is ANONYMOUS or resolver.of_certificate(no_cn).anonymous
    assert resolver.of_certificate(None) == ANONYMOUS
    assert str(ANONYMOUS) == "ANONYMOUS"


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown principal source 'dn'"):
        PrincipalResolver("dn", ())


def test_brokers_are_the_listed_names_or_else_the_own_certificate(ca: trustme.CA, tmp_path: Path) -> None:
    own = tmp_path / "broker.pem"
    own.write_bytes(ca.issue_cert("localhost", common_name="broker-1").cert_chain_pems[0].bytes())
    alice = cert(ca.issue_cert("a.example.org", common_name="alice"))
    peer = cert(ca.issue_cert("b.example.org", common_name="broker-1"))

    implicit = PrincipalResolver.for_broker("cn", (), own)
    assert implicit.of_certificate(peer) == Principal("broker-1", broker=True)
    assert implicit.of_certificate(alice) == Principal("alice", broker=False)

    listed = PrincipalResolver.for_broker("cn", ("broker-2", "alice"), own)
    assert listed.of_certificate(alice).broker  # the setting replaces the own name
    assert not listed.of_certificate(peer).broker

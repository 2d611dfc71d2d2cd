"""Who is at the other end of a connection: one :class:`Principal`, resolved once at the edge.

A principal is a name taken from the client's verified certificate (:mod:`tidelog.api.peer_certificate`), by
the ``tls_principal_from`` setting:

- ``cn`` — the certificate's subject common name (Liftbridge's rule);
- ``san`` — its first subject alternative name: a DNS name, else a URI, else an e-mail address (for CAs that
  issue certificates without a meaningful CN, such as SPIFFE identities).

A connection without a verified certificate (no TLS, ``tls_client_auth = optional`` and none given) is
:data:`ANONYMOUS`: an identity ACLs can name only through ``*``. A certificate that has no name of the kind asked
for is anonymous too (never a principal made up from something else).

**Brokers.** Brokers dial each other with their own ``tls_cert`` (replication, forwarding to the controller), so
a broker is recognised by the name on that certificate: a principal is a broker when its name is in
``broker_principals`` or, when that setting is empty, when it equals the name this broker's own certificate gives
(brokers sharing one certificate, or one name, recognise each other with no setting at all). Broker principals may
do everything, including the replication ops no ACL grants.

The wire server resolves a connection's principal when it accepts it; gRPC gives a certificate per call, so
:meth:`PrincipalResolver.of_grpc` keeps the names of the certificates it has seen (a connection's calls all carry
the same one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from tidelog.api.peer_certificate import wire_peer_certificate

__all__ = [
    "ANONYMOUS",
    "PRINCIPAL_SOURCES",
    "ConnectionIdentity",
    "Principal",
    "PrincipalResolver",
    "UserLookup",
    "principal_name",
]

PRINCIPAL_SOURCES = ("cn", "san")
_CACHE_MAX = 1024  # certificates whose names gRPC calls reuse; beyond it the cache starts over


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated name (``""``: anonymous) and whether it is one of the cluster's brokers."""

    name: str
    broker: bool = False

    @property
    def anonymous(self) -> bool:
        return not self.name

    def __str__(self) -> str:
        return self.name or "ANONYMOUS"


ANONYMOUS = Principal("")

UserLookup = Callable[[str], Awaitable[tuple[bytes, bytes, bytes, int] | None]]
"""A user's SCRAM credentials by name (salt, StoredKey, ServerKey, iterations), None when there is no such user."""


@dataclass(slots=True)
class ConnectionIdentity:
    """Who a wire connection is: its principal (from its certificate, or its SCRAM login), whether it is TLS,
    where logins look users up, and the login exchange in progress (:mod:`tidelog.api.wire.sasl`)."""

    principal: Principal
    tls: bool = False
    users: UserLookup | None = None
    login: Any = None


def principal_name(cert: x509.Certificate, source: str) -> str | None:
    """The name ``source`` (``cn`` or ``san``) takes from ``cert``; None when it has none."""
    if source == "cn":
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        value = names[0].value if names else None
        return value.decode() if isinstance(value, bytes) else value or None
    if source == "san":
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return None
        for kind in (x509.DNSName, x509.UniformResourceIdentifier, x509.RFC822Name):
            found = san.get_values_for_type(kind)
            if found:
                return str(found[0])
        return None
    raise ValueError(f"unknown principal source {source!r}: use one of {', '.join(PRINCIPAL_SOURCES)}")


class PrincipalResolver:
    """Turns verified client certificates into principals, knowing which names are brokers."""

    def __init__(self, source: str, broker_names: Iterable[str]) -> None:
        if source not in PRINCIPAL_SOURCES:
            raise ValueError(f"unknown principal source {source!r}: use one of {', '.join(PRINCIPAL_SOURCES)}")
        self.source = source
        self.broker_names = frozenset(broker_names)
        self._grpc_names: dict[bytes, Principal] = {}

    @classmethod
    def for_broker(cls, source: str, broker_principals: Iterable[str], own_cert: Path | None) -> PrincipalResolver:
        """The resolver of a broker: ``broker_principals``, or when empty the name of its own certificate."""
        names = set(broker_principals)
        if not names and own_cert is not None:
            own = principal_name(x509.load_pem_x509_certificate(own_cert.read_bytes()), source)
            if own:
                names.add(own)
        return cls(source, names)

    def of_certificate(self, cert: x509.Certificate | None) -> Principal:
        name = principal_name(cert, self.source) if cert is not None else None
        if not name:
            return ANONYMOUS
        return Principal(name, name in self.broker_names)

    def of_wire(self, transport: Any) -> Principal:
        """The principal of a wire connection (its transport or stream writer)."""
        return self.of_certificate(wire_peer_certificate(transport))

    def of_grpc(self, context: Any) -> Principal:
        """The principal of a gRPC call (its ``ServicerContext``)."""
        properties = context.auth_context()
        if properties.get("transport_security_type") != [b"ssl"]:
            return ANONYMOUS
        pems = properties.get("x509_pem_cert")
        if not pems:
            return ANONYMOUS
        pem = bytes(pems[0])
        found = self._grpc_names.get(pem)
        if found is None:
            if len(self._grpc_names) >= _CACHE_MAX:
                self._grpc_names.clear()
            found = self._grpc_names[pem] = self.of_certificate(x509.load_pem_x509_certificate(pem))
        return found

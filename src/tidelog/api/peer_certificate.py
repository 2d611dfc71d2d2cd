"""The verified certificate of the client at the other end of a connection, or None: the seam for principals.

Authentication builds on this and nothing else: whoever names a principal from a client certificate (its subject
CN or a SAN) asks here, the same way for both listeners:

- :func:`grpc_peer_certificate` — for a gRPC call, from its ``context.auth_context()``;
- :func:`wire_peer_certificate` — for a wire connection, from its transport's (or stream writer's) ``ssl_object``.

Both return the certificate only when the TLS handshake verified it against ``tls_client_ca``: a listener never
accepts a certificate it could not verify (the handshake fails, see :mod:`tidelog.protocol.tls`), and gRPC reports
a peer certificate only under ``tls_client_auth = required``. None means: no TLS, a client that gave no
certificate (``optional``), or a listener that does not ask (``none``). A None is not an identity: the caller
decides what an anonymous client may do.
"""

from __future__ import annotations

from typing import Any, Protocol

from cryptography import x509

__all__ = ["grpc_peer_certificate", "wire_peer_certificate"]


class _HasExtraInfo(Protocol):
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def wire_peer_certificate(transport: _HasExtraInfo) -> x509.Certificate | None:
    """The verified client certificate of a wire connection (its transport or its ``StreamWriter``), or None."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def grpc_peer_certificate(context: Any) -> x509.Certificate | None:
    """The verified client certificate of the gRPC call ``context`` (a ``ServicerContext``), or None."""
    properties = context.auth_context()
    if properties.get("transport_security_type") != [b"ssl"]:
        return None
    pems = properties.get("x509_pem_cert")
    if not pems:
        return None
    return x509.load_pem_x509_certificate(pems[0])

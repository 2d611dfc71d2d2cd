"""TLS for the wire protocol and gRPC: the contexts both sides build from PEM files, and failures said in words.

One module for every side, because the client, the broker's links to other brokers and the broker's listeners
must agree on what they check:

- :func:`client_context` — what a client (or a broker dialling another broker) uses: the server is verified
  against ``ca`` (the system's CAs when none is given), its certificate must name the host dialled, and
  ``cert``/``key`` are presented when the server asks for a client certificate (mutual TLS). TLS 1.2 at least.
- :func:`server_context` — what a listener uses: its certificate and key, and, by :class:`ClientAuth`, whether a
  client certificate is not asked for, asked for and verified when given (``optional``), or required
  (``required``), each verified against ``client_ca``.
- :class:`TlsFiles` — the files of one side, checked to exist and to load when settings are read, so a typo
  refuses to start instead of failing every connection later.
- :func:`describe_tls_failure` — an ``ssl`` error as one line a person can act on: expired, signed by a CA that is
  not trusted, issued for another host, no certificate given, or plaintext where TLS was expected.

A certificate that fails verification is refused during the handshake: no request is read from such a
connection, so nothing it sent is stored.
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ClientAuth",
    "SslSource",
    "TlsConfigError",
    "TlsFiles",
    "client_context",
    "describe_tls_failure",
    "server_context",
]


SslSource = Callable[[], ssl.SSLContext | None]
"""The context for a connection opened now (None: plaintext). A function, not a context, so that a link opened
after a certificate rotation presents the new certificate (see :mod:`tidelog.api.server_tls`)."""


class TlsConfigError(ValueError):
    """TLS files that cannot be used (missing, unreadable, not PEM, a key that does not match its certificate)."""


class ClientAuth(enum.Enum):
    """Whether a listener asks its clients for a certificate."""

    NONE = "none"  # not asked for: clients are anonymous at the TLS level (SCRAM may name them)
    OPTIONAL = "optional"  # asked for and verified when given; a client without one is let in
    REQUIRED = "required"  # a client without a verified certificate is refused in the handshake


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of one side of a TLS link. ``cert`` and ``key`` go together; ``ca`` is what the peer is verified
    against (for a listener: its clients' CA)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsConfigError("a TLS certificate and its key go together: give both or neither")

    @property
    def empty(self) -> bool:
        return self.ca is None and self.cert is None


def client_context(files: TlsFiles, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A context for dialling a TLS server: verifies it against ``files.ca`` (the system's CAs when None) and
    its host name, and presents ``files.cert`` when the server asks for a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if files.ca is not None:
        _load(lambda: context.load_verify_locations(cafile=str(files.ca)), "CA", files.ca)
    if files.cert is not None and files.key is not None:
        cert, key = files.cert, files.key
        _load(lambda: context.load_cert_chain(str(cert), str(key)), "certificate and key", cert)
    return context


def server_context(cert: Path, key: Path, *, client_ca: Path | None, client_auth: ClientAuth) -> ssl.SSLContext:
    """A listener's context: ``cert`` and ``key``, and client certificates by ``client_auth``, verified against
    ``client_ca`` (required unless ``client_auth`` is NONE)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(lambda: context.load_cert_chain(str(cert), str(key)), "certificate and key", cert)
    if client_auth is ClientAuth.NONE:
        context.verify_mode = ssl.CERT_NONE
        return context
    if client_ca is None:
        raise TlsConfigError(f"client certificates {client_auth.value}: give the CA that signs them (tls_client_ca)")
    ca = client_ca
    _load(lambda: context.load_verify_locations(cafile=str(ca)), "client CA", ca)
    context.verify_mode = ssl.CERT_REQUIRED if client_auth is ClientAuth.REQUIRED else ssl.CERT_OPTIONAL
    return context


def following_context(source: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """A listener's context that follows ``source`` (which changes when certificates are reloaded): the first
    context is the listener's, and each handshake switches to the current one from the SNI callback, which
    OpenSSL calls for every ClientHello (with or without a server name) before the certificate is chosen."""
    front = source()

    def current(connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _front: ssl.SSLContext) -> None:
        connection.context = source()

    front.sni_callback = current
    return front


def _load(action: object, what: str, path: Path) -> None:
    assert callable(action)
    try:
        action()
    except FileNotFoundError:
        raise TlsConfigError(f"TLS {what}: {path} does not exist") from None
    except PermissionError:
        raise TlsConfigError(f"TLS {what}: {path} cannot be read (permission denied)") from None
    except ssl.SSLError as exc:
        raise TlsConfigError(f"TLS {what}: {path} cannot be used ({_reason(exc)})") from None
    except OSError as exc:
        raise TlsConfigError(f"TLS {what}: {path} cannot be read ({exc.strerror or exc})") from None


# X509_V_ERR_* codes OpenSSL reports in SSLCertVerificationError.verify_code.
_VERIFY_REASONS = {
    9: "the peer's certificate is not valid yet",
    10: "the peer's certificate has expired",
    18: "the peer's certificate is self-signed and not trusted",
    19: "the peer's certificate chain ends in a CA that is not trusted",
    20: "the peer's certificate is signed by a CA that is not trusted (check the CA file given)",
    21: "the peer's certificate is signed by a CA that is not trusted (check the CA file given)",
    62: "the peer's certificate is not issued for the host name dialled",
    64: "the peer's certificate is not issued for the IP address dialled",
}

_REASONS = {
    "WRONG_VERSION_NUMBER": "the peer does not speak TLS (a plaintext port?)",
    "HTTP_REQUEST": "the peer sent plaintext (HTTP) to a TLS port",
    "RECORD_LAYER_FAILURE": "the peer does not speak TLS (a plaintext port?)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no client certificate was given, and this listener requires one",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate and none was given",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server refused our client certificate: it has expired",
    "TLSV1_ALERT_UNKNOWN_CA": "the peer refused our certificate: it is signed by a CA the peer does not trust",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the peer refused our certificate",
    "CERTIFICATE_VERIFY_FAILED": "the peer's certificate failed verification",
    "KEY_VALUES_MISMATCH": "the key does not belong to the certificate",
    "NO_START_LINE": "not a PEM file",
    "PEM_LIB": "not a usable PEM file",
}


def describe_tls_failure(exc: BaseException) -> str:
    """``exc`` (an ``ssl`` error or what wraps one) as one line: what was wrong, in the terms of the settings."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = _VERIFY_REASONS.get(exc.verify_code)
        if reason is not None:
            return reason
        return f"the peer's certificate failed verification ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return _reason(exc)
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "the peer closed the connection during the TLS handshake (it refused our certificate, or speaks clear)"
    if isinstance(exc, TimeoutError):
        return "no TLS handshake within the time allowed (a plaintext client waiting for the server?)"
    return str(exc) or type(exc).__name__


def _reason(exc: ssl.SSLError) -> str:
    reason = exc.reason or ""
    return _REASONS.get(reason, reason.replace("_", " ").lower() or str(exc))

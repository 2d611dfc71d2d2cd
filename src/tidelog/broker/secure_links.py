"""How a broker's settings secure the connections it makes: to other brokers, to NATS and to etcd.

The listeners are :mod:`tidelog.api.server_tls` (built by :mod:`tidelog.server`); this module is the other
direction, in one place so that every link a broker opens is secured by the same settings (docs/security.md):

- **other brokers** (replica fetches, forwarded requests, the controller's requests): TLS whenever the broker's
  own listeners use it (``tls_cert``), verified against ``tls_ca`` (else ``tls_client_ca``, else the system's
  CAs) and the host name each broker advertises, presenting ``tls_cert`` as the client certificate. After a
  certificate rotation, new links present the new one (:class:`PeerTls`).
- **NATS**: ``nats_tls_ca``/``nats_tls_cert``/``nats_tls_key`` (or a ``tls://`` URL) ask for TLS, and a server
  that does not use it is refused; one of ``nats_user``/``nats_password``, ``nats_token``, ``nats_creds`` or
  ``nats_nkey_seed`` authenticates. The broker's fast ingest reader speaks plain NATS without credentials of its
  own, so under any of these settings ingest subscribes through nats-py (the broker then gives it no URLs).
- **etcd**: ``etcd_tls_ca``/``etcd_tls_cert``/``etcd_tls_key`` make the gRPC channel TLS; ``etcd_user`` and
  ``etcd_password`` authenticate.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ssl
from pathlib import Path
from typing import Any, Protocol

from tidelog.broker.config import BrokerConfig
from tidelog.metadata.etcd_client import EtcdTls
from tidelog.protocol.tls import TlsConfigError, TlsFiles, client_context

__all__ = ["Listener", "PeerTls", "etcd_tls", "nats_security"]


class Listener(Protocol):
    """What :class:`PeerTls` needs of the listeners' certificates (:class:`tidelog.api.server_tls.ServerTls`)."""

    cert: Path
    key: Path

    @property
    def generation(self) -> int: ...


class PeerTls:
    """The client context for links to other brokers, made again after each reload of the listener files."""

    def __init__(self, cfg: BrokerConfig, listener: Listener) -> None:
        self._ca = cfg.tls_ca or cfg.tls_client_ca
        self._listener = listener
        self._made: tuple[int, ssl.SSLContext] = (listener.generation, self._make())

    def _make(self) -> ssl.SSLContext:
        return client_context(TlsFiles(ca=self._ca, cert=self._listener.cert, key=self._listener.key))

    def __call__(self) -> ssl.SSLContext:
        generation, context = self._made
        if generation != self._listener.generation:
            # The listener took files that the client side cannot use: keep the last good context.
            with contextlib.suppress(TlsConfigError):
                context = self._make()
            self._made = (self._listener.generation, context)
        return context


def nats_security(cfg: BrokerConfig) -> dict[str, Any]:
    """nats-py's connect options for the TLS and authentication settings (empty when none is set)."""
    options: dict[str, Any] = {}
    if cfg.nats_tls:
        options["tls"] = client_context(TlsFiles(ca=cfg.nats_tls_ca, cert=cfg.nats_tls_cert, key=cfg.nats_tls_key))
    if cfg.nats_user is not None:
        options["user"] = cfg.nats_user
        options["password"] = cfg.nats_password
    if cfg.nats_token is not None:
        options["token"] = cfg.nats_token
    if cfg.nats_creds is not None or cfg.nats_nkey_seed is not None:
        _need_nkeys("nats_creds" if cfg.nats_creds is not None else "nats_nkey_seed")
        if cfg.nats_creds is not None:
            options["user_credentials"] = str(_readable(cfg.nats_creds, "nats_creds"))
        if cfg.nats_nkey_seed is not None:
            options["nkeys_seed"] = str(_readable(cfg.nats_nkey_seed, "nats_nkey_seed"))
    return options


def etcd_tls(cfg: BrokerConfig) -> EtcdTls | None:
    """The etcd link's TLS files, read now, or None for a plaintext link."""
    if not cfg.etcd_tls:
        return None
    return EtcdTls.from_files(cfg.etcd_tls_ca, cfg.etcd_tls_cert, cfg.etcd_tls_key)


def _need_nkeys(key: str) -> None:
    if importlib.util.find_spec("nkeys") is None:  # nats-py signs the server's nonce with it
        raise TlsConfigError(f"{key} needs the 'nkeys' package (pip install nkeys), which is not installed")


def _readable(path: Any, key: str) -> Any:
    if not path.is_file():
        raise TlsConfigError(f"{key}: {path} does not exist or is not a file")
    return path

"""Security settings that only work together (TLS files, NATS and etcd credentials): checked as one.

:class:`~tidelog.broker.config.BrokerConfig` calls :func:`check_security` once its values are parsed. A
combination tidelog cannot honour is refused (:class:`~tidelog.broker.config_values.BadConfigValueError`, naming
the key and what it needs), never half applied: a certificate without its key would otherwise leave a listener in
clear, and credentials for an embedded server would be silently unused (docs/security.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidelog.broker.config_values import BadConfigValueError

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig

__all__ = ["authorization_enabled", "check_security"]


def authorization_enabled(config: BrokerConfig) -> bool:
    """Whether requests are checked against the ACLs: ``authz_enabled``, or when auto, client auth required."""
    if config.authz_enabled is not None:
        return config.authz_enabled
    return config.tls_client_auth == "required"


def check_security(config: BrokerConfig) -> None:
    """TLS and credentials settings that only make sense together: refused, never half applied."""

    def refuse(key: str, expected: str) -> None:
        raise BadConfigValueError(key, "the combined configuration", getattr(config, key), expected)

    for cert, key in (
        ("tls_cert", "tls_key"),
        ("nats_tls_cert", "nats_tls_key"),
        ("etcd_tls_cert", "etcd_tls_key"),
    ):
        if (getattr(config, cert) is None) != (getattr(config, key) is None):
            refuse(
                key if getattr(config, key) is None else cert,
                f"set together with {cert if getattr(config, key) is None else key}",
            )
    if config.tls_client_auth != "none" and config.tls_cert is None:
        refuse("tls_client_auth", "'none' unless tls_cert and tls_key are set")
    if config.tls_client_auth != "none" and config.tls_client_ca is None:
        refuse("tls_client_ca", f"a CA file when tls_client_auth is {config.tls_client_auth!r}")
    if config.authz_enabled and config.tls_client_auth == "none":
        refuse(
            "authz_enabled",
            "false or auto unless tls_client_auth is 'optional' or 'required' (brokers and clients are recognised by "
            "their certificates)",
        )
    for user, password in (("nats_user", "nats_password"), ("etcd_user", "etcd_password")):
        if (getattr(config, user) is None) != (getattr(config, password) is None):
            refuse(
                password if getattr(config, password) is None else user,
                f"set together with {user if getattr(config, password) is None else password}",
            )
    nats_auth = [
        k for k in ("nats_user", "nats_token", "nats_creds", "nats_nkey_seed") if getattr(config, k) is not None
    ]
    if len(nats_auth) > 1:
        refuse(nats_auth[1], f"unset: one NATS authentication at a time ({nats_auth[0]} is set)")
    for key in ("nats_tls_ca", "nats_tls_cert", *nats_auth):
        if getattr(config, key) is not None and not config.nats_servers:
            refuse(key, "unset while nats_servers is empty (the embedded nats-server listens on loopback in clear)")
    for key in ("etcd_tls_ca", "etcd_tls_cert", "etcd_user"):
        if getattr(config, key) is not None and not config.etcd_endpoints:
            refuse(key, "unset while etcd_endpoints is empty (the embedded etcd listens on loopback in clear)")
    https = [e for e in config.etcd_endpoints if e.strip().lower().startswith("https://")]
    if https and not config.etcd_tls:
        refuse(
            "etcd_endpoints",
            "http:// endpoints, or https:// ones with etcd_tls_ca (a TLS endpoint is never dialled in clear)",
        )

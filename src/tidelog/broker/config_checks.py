"""Settings checked against each other once every value is parsed: one :func:`check_combined` for them all.

:class:`~tidelog.broker.config.BrokerConfig` checks each value alone with its key's kind; a value can be valid
alone and impossible beside another (a message larger than a segment, two listeners on one port). Such a
combination is refused before the broker starts (:class:`~tidelog.broker.config_values.BadConfigValueError`
naming the key and what it needs, or :class:`~tidelog.broker.config_values.ConfigError`), never found at run time.
The security settings that only work together are :mod:`tidelog.broker.config_security`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from tidelog.broker.config_security import check_security
from tidelog.broker.config_values import BadConfigValueError, ConfigError
from tidelog.broker.encryption import MasterKeyError, load_master_key

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig

__all__ = ["check_combined"]

_COMBINED: Final = "the combined configuration"


def check_combined(config: BrokerConfig) -> None:
    """Refuse settings that contradict each other: sizes, the master key, security, and the listeners' ports."""
    _check_sizes(config)
    try:
        load_master_key(config.encryption_key, config.encryption_key_file)
    except MasterKeyError as exc:
        raise ConfigError(str(exc)) from None
    check_security(config)
    _check_ports(config)
    _check_fronts(config)


def _check_sizes(config: BrokerConfig) -> None:
    # A message must fit in a segment, and a connection's open appends must hold the largest single append.
    if config.max_message_bytes > config.segment_max_bytes:
        raise BadConfigValueError(
            "max_message_bytes",
            _COMBINED,
            config.max_message_bytes,
            f"at most segment_max_bytes ({config.segment_max_bytes})",
        )
    largest_append = min(config.max_append_bytes, config.segment_max_bytes)
    if config.max_open_append_bytes_per_connection < largest_append:
        raise BadConfigValueError(
            "max_open_append_bytes_per_connection",
            _COMBINED,
            config.max_open_append_bytes_per_connection,
            f"at least the largest append, min(max_append_bytes, segment_max_bytes) ({largest_append})",
        )


def _check_ports(config: BrokerConfig) -> None:
    # Port 0 (any free port) never collides: the system picks a different one for each listener.
    if config.port and config.port == config.wire_port:
        raise BadConfigValueError("wire_port", _COMBINED, config.wire_port, "a port other than port")
    if config.http_port and config.http_port in (config.port, config.wire_port):
        raise BadConfigValueError("http_port", _COMBINED, config.http_port, "a port other than port and wire_port")


def _check_fronts(config: BrokerConfig) -> None:
    # A front would see the caller's certificate and the broker only the front's: principals and ACLs need the
    # caller's own connection, so fronts and TLS are refused together rather than authenticating anyone as a front.
    if config.api_front_processes and config.tls_cert is not None:
        raise BadConfigValueError(
            "api_front_processes",
            _COMBINED,
            config.api_front_processes,
            "0 while tls_cert is set (API fronts serve plaintext gRPC only: they cannot pass the caller's "
            "certificate, and so its principal, on to the broker)",
        )

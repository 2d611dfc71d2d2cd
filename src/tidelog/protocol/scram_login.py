"""The client's side of the SCRAM-SHA-256 login on a wire connection (:mod:`tidelog.protocol.auth_messages`).

:func:`scram_login` runs the two round trips on an open connection (over TLS: the broker refuses otherwise) and
checks the broker's signature: a broker that does not hold the user's stored credentials cannot make it, so a
successful login also proves the broker is the cluster's. Raises the broker's error (PERMISSION_DENIED for a wrong
password or an unknown user), or :class:`LoginError` when the broker's own messages do not check out.
"""

from __future__ import annotations

from typing import Protocol

from scramp import ScramClient, ScramException

from tidelog.protocol.auth_messages import (
    SCRAM_SHA_256,
    SaslFinishRequest,
    SaslFinishResponse,
    SaslStartRequest,
    SaslStartResponse,
)
from tidelog.protocol.messages import Header

__all__ = ["LoginError", "scram_login"]


class LoginError(Exception):
    """The broker's side of the exchange did not check out (not the cluster's broker, or a broken exchange)."""


class _Requester(Protocol):
    async def request(self, header: Header, *, timeout: float | None = None) -> object: ...


async def scram_login(connection: _Requester, user: str, password: str, *, timeout: float = 10.0) -> str:
    """Log ``connection`` in as ``user``; the principal the broker now gives it."""
    client = ScramClient([SCRAM_SHA_256], user, password)
    started = await connection.request(SaslStartRequest(SCRAM_SHA_256, client.get_client_first()), timeout=timeout)
    first = getattr(started, "header", None)
    if not isinstance(first, SaslStartResponse):
        raise LoginError(f"unexpected answer to SASL_START: {first!r}")
    try:
        client.set_server_first(first.message)
        final_message = client.get_client_final()
    except ScramException as exc:
        raise LoginError(f"the broker's SCRAM server-first message does not check out: {exc}") from None
    finished = await connection.request(SaslFinishRequest(final_message), timeout=timeout)
    final = getattr(finished, "header", None)
    if not isinstance(final, SaslFinishResponse):
        raise LoginError(f"unexpected answer to SASL_FINISH: {final!r}")
    try:
        client.set_server_final(final.message)
    except ScramException as exc:
        raise LoginError(f"the broker's signature does not check out (not this cluster's broker?): {exc}") from None
    return final.principal

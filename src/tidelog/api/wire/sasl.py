"""The SCRAM-SHA-256 login of a wire connection (SASL_START, SASL_FINISH): a principal for clients without a
certificate.

The exchange is RFC 5802's, with the credentials ``tidelog user add`` keeps in etcd
(:mod:`tidelog.metadata.user_records`): the client proves it knows the password without sending it, and checks
the broker's signature, which only a holder of the stored credentials can make. On success the connection's
principal becomes the user's name, for every request after it (the authorizer reads it per request).

Refused, each with its own one-line error and the connection's principal unchanged:

- a login on a listener without TLS (the requests after a login are not signed: only TLS keeps another party from
  taking the connection over), or on a connection that already has a principal (its certificate's);
- a mechanism other than SCRAM-SHA-256, a client-first message that is not SCRAM's;
- SASL_FINISH without a SASL_START before it — an exchange cut short and resumed, or a client-final message
  replayed from another connection or exchange: each exchange takes one SASL_FINISH, and its proof is bound to
  that exchange's nonces;
- a wrong password, or a user that does not exist: the same PERMISSION_DENIED for both (an unknown user is run
  through the exchange with made-up credentials, so the answer does not tell which).
"""

from __future__ import annotations

import functools
import logging
import secrets
from typing import Any

from scramp import ScramException, ScramMechanism

from tidelog.api.principals import Principal
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.protocol.auth_messages import (
    SCRAM_SHA_256,
    SaslFinishRequest,
    SaslFinishResponse,
    SaslStartRequest,
    SaslStartResponse,
)
from tidelog.protocol.errors import InvalidArgumentError, PermissionDeniedError, UnsupportedError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message

log = logging.getLogger(__name__)

_MECHANISM = ScramMechanism(SCRAM_SHA_256)


class _Login:
    """One exchange in progress: scramp's server and the user it is for."""

    __slots__ = ("server", "user")

    def __init__(self, server: Any, user: str) -> None:
        self.server = server
        self.user = user


@functools.cache
def _decoy() -> tuple[bytes, bytes, bytes, int]:
    """Credentials no password matches, for users that do not exist."""
    salt, stored_key, server_key, count = _MECHANISM.make_auth_info(secrets.token_hex(32), iteration_count=4096)
    return salt, stored_key, server_key, count


def _user_of(client_first: str) -> str:
    fields = client_first.split(",")
    if len(fields) < 4 or not fields[2].startswith("n=") or not fields[2][2:]:
        raise InvalidArgumentError("not a SCRAM client-first message (gs2-header,n=user,r=nonce)")
    return fields[2][2:].replace("=2C", ",").replace("=3D", "=")


async def sasl_start(env: HandlerEnv, correlation_id: int, request: SaslStartRequest, _payload: memoryview) -> Reply:
    identity = env.identity
    if not identity.tls:
        raise InvalidArgumentError("SCRAM login is served only over TLS: this broker's wire port has no TLS")
    if identity.users is None:
        raise UnsupportedError("this broker has no user store for SCRAM logins")
    if not identity.principal.anonymous:
        raise InvalidArgumentError(
            f"this connection is already the principal {identity.principal} (its certificate): log in only on "
            "connections without a client certificate"
        )
    if request.mechanism != SCRAM_SHA_256:
        raise InvalidArgumentError(f"SASL mechanism {request.mechanism!r} is not served: use {SCRAM_SHA_256}")
    identity.login = None
    user = _user_of(request.message)
    info = await identity.users(user) or _decoy()
    server = _MECHANISM.make_server(lambda _name: info)
    try:
        server.set_client_first(request.message)
        first = server.get_server_first()
    except ScramException as exc:
        raise InvalidArgumentError(f"SCRAM client-first message refused: {exc}") from None
    identity.login = _Login(server, user)
    return Reply(encode_message(correlation_id, SaslStartResponse(first)))


async def sasl_finish(env: HandlerEnv, correlation_id: int, request: SaslFinishRequest, _payload: memoryview) -> Reply:
    identity = env.identity
    login, identity.login = identity.login, None  # one SASL_FINISH per exchange: a replay finds none
    if not isinstance(login, _Login):
        raise InvalidArgumentError("SASL_FINISH without a SASL_START on this connection: start the login again")
    try:
        login.server.set_client_final(request.message)
        final = login.server.get_server_final()
    except ScramException:
        log.info("SCRAM login failed for user %r", login.user)
        raise PermissionDeniedError(f"login failed for user {login.user!r}: wrong password or no such user") from None
    identity.principal = Principal(login.user)
    return Reply(encode_message(correlation_id, SaslFinishResponse(final, login.user)))


ROUTES: dict[int, Route] = {
    Op.SASL_START: route(SaslStartRequest, sasl_start),
    Op.SASL_FINISH: route(SaslFinishRequest, sasl_finish),
}

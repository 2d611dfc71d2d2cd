"""Who a gRPC call is: its connection's certificate, or a user name and password sent with the call.

The Liftbridge API has no login message, so a gRPC client without a certificate sends its password with each
call, in the standard HTTP form any gRPC client can add (call metadata, or ``grpc.metadata_call_credentials``)::

    authorization: Basic base64(user ":" password)

It is checked against the same stored SCRAM credentials as the wire protocol's logins
(:class:`~tidelog.api.password_check.PasswordCheck`), and the call's principal becomes the user's name, with the
same ACLs. Refused with UNAUTHENTICATED, before the call does anything, and each with its own one-line message:

- a password on a port without TLS: it would have crossed the network in clear (gRPC clients refuse to send call
  credentials over an insecure channel for the same reason); no setting allows it;
- a password on a connection that has a certificate principal (one call, one principal, as on the wire port);
- ``authorization`` metadata that is not ``Basic`` with base64 ``user:password``, or given twice;
- a wrong password or an unknown user (the same message for both).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tidelog.api.password_check import LoginFailed, PasswordCheck
from tidelog.api.principals import Principal, PrincipalResolver

__all__ = ["AUTHORIZATION_KEY", "CallPrincipals", "CallRefused", "basic_authorization", "user_and_password"]

AUTHORIZATION_KEY = "authorization"
_BASIC = "basic "
_FORM = "send 'authorization: Basic ' + base64(user:password)"


class CallRefused(Exception):
    """A call whose credentials are refused (UNAUTHENTICATED); the message says why."""


def basic_authorization(user: str, password: str) -> tuple[str, str]:
    """The metadata entry a client sends to log in as ``user`` with ``password`` on a gRPC call."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return AUTHORIZATION_KEY, f"Basic {token}"


def user_and_password(value: str) -> tuple[str, str]:
    """The user and password of an ``authorization`` value (``Basic`` and base64 ``user:password``); raises
    :class:`CallRefused` naming what is wrong (shared by the HTTP port's check)."""
    if not value[: len(_BASIC)].lower() == _BASIC:
        raise CallRefused(f"authorization metadata of an unknown scheme: {_FORM}")
    try:
        decoded = base64.b64decode(value[len(_BASIC) :].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise CallRefused(f"authorization metadata is not valid base64 of UTF-8 text: {_FORM}") from None
    user, sep, password = decoded.partition(":")
    if not sep or not user:
        raise CallRefused(f"authorization metadata names no user: {_FORM}")
    return user, password


class CallPrincipals:
    """The principal of each gRPC call (module docstring)."""

    def __init__(self, certificates: PrincipalResolver, passwords: PasswordCheck | None) -> None:
        self._certificates = certificates
        self._passwords = passwords

    async def of(self, context: Any) -> Principal:
        """The principal of the call of ``context`` (its ``ServicerContext``); raises :class:`CallRefused`."""
        values = [value for key, value in context.invocation_metadata() or () if key == AUTHORIZATION_KEY]
        if not values:
            return self._certificates.of_grpc(context)
        if len(values) > 1:
            raise CallRefused(f"authorization metadata given {len(values)} times: give it once")
        value = values[0]
        user, password = user_and_password(value if isinstance(value, str) else value.decode("latin-1"))
        if context.auth_context().get("transport_security_type") != [b"ssl"]:
            raise CallRefused(
                "password logins are served only over TLS: this broker's gRPC port has no TLS (the password "
                "crossed the network in clear: change it)"
            )
        certificate = self._certificates.of_grpc(context)
        if not certificate.anonymous:
            raise CallRefused(
                f"this call's connection is already the principal {certificate} (its certificate): send a "
                "password only on connections without a client certificate"
            )
        if self._passwords is None:
            raise CallRefused("this broker has no user store for password logins")
        try:
            return await self._passwords.principal(user, password)
        except LoginFailed as exc:
            raise CallRefused(str(exc)) from None

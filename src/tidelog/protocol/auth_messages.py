"""Headers of the SCRAM-SHA-256 login on the wire protocol (RFC 5802/7677), for clients without a certificate.

A connection logs in with two round trips, each carrying one SCRAM message as text::

    SASL_START   SaslStartRequest(mechanism, client-first)   SaslStartResponse(server-first)
    SASL_FINISH  SaslFinishRequest(client-final)              SaslFinishResponse(server-final, principal)

The broker answers only over TLS (the exchange proves the password without sending it, but the requests after
it are not signed: without TLS anyone on the path could take the connection over). After SASL_FINISH the
connection's principal is the user's name. Routed by :mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

from tidelog.protocol.messages import Header

__all__ = ["SCRAM_SHA_256", "SaslFinishRequest", "SaslFinishResponse", "SaslStartRequest", "SaslStartResponse"]

SCRAM_SHA_256 = "SCRAM-SHA-256"


class SaslStartRequest(Header, frozen=True):
    mechanism: str
    message: str  # SCRAM client-first-message


class SaslStartResponse(Header, frozen=True):
    message: str  # SCRAM server-first-message


class SaslFinishRequest(Header, frozen=True):
    message: str  # SCRAM client-final-message


class SaslFinishResponse(Header, frozen=True):
    message: str  # SCRAM server-final-message: the client checks the broker's signature in it
    principal: str  # the connection's principal from now on

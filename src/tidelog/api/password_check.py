"""Password logins in one step, for gRPC calls that carry a user name and password (the wire protocol runs the
SCRAM exchange itself, :mod:`tidelog.api.wire.sasl`).

The broker keeps only what SCRAM-SHA-256 lets a server keep (salt, iterations, ``StoredKey``, ``ServerKey``:
:mod:`tidelog.metadata.user_records`), so a password is checked the only way those allow: a whole SCRAM exchange
is played in-process, the client's side with the password given, the server's with the stored credentials. It
succeeds exactly when a SCRAM login over the wire protocol would (same user-name escaping, same SASLprep of the
password). An unknown user is checked against made-up credentials, so the answer and its cost are the same as for
a wrong password.

Each check costs one PBKDF2 run (4096 SHA-256 rounds by default): it runs in a worker thread, at most
:data:`CONCURRENT_CHECKS` at a time (a client trying passwords in a loop cannot take every core), and a success
is remembered for :data:`REMEMBER_SECONDS` under an HMAC of the password with a key made when the broker starts
(the password itself is not kept). Deleting a user or changing their password therefore reaches calls within that
time; failures are not remembered.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import secrets
import time
from typing import Any

from scramp import ScramClient, ScramException, ScramMechanism

from tidelog.api.principals import Principal, UserLookup
from tidelog.metadata.records import Keys
from tidelog.metadata.user_records import get_user
from tidelog.protocol.auth_messages import SCRAM_SHA_256

__all__ = ["CONCURRENT_CHECKS", "REMEMBER_SECONDS", "LoginFailed", "PasswordCheck", "etcd_users", "password_matches"]

REMEMBER_SECONDS = 10.0
"""How long a checked (user, password) stays valid without another PBKDF2 run and etcd read."""
CONCURRENT_CHECKS = 2
_CACHE_MAX = 4096

_MECHANISM = ScramMechanism(SCRAM_SHA_256)


class LoginFailed(Exception):
    """A wrong password or an unknown user (the message does not tell which)."""


@functools.cache
def _decoy() -> tuple[bytes, bytes, bytes, int]:
    """Credentials no password matches, for users that do not exist."""
    salt, stored_key, server_key, count = _MECHANISM.make_auth_info(secrets.token_hex(32), iteration_count=4096)
    return salt, stored_key, server_key, count


def etcd_users(client: Any, keys: Keys) -> UserLookup:
    """The users ``tidelog user add`` keeps in etcd, read at each lookup (a wire login, or a gRPC or HTTP password
    not checked in the last :data:`REMEMBER_SECONDS`): a deleted user logs in no more."""

    async def lookup(name: str) -> tuple[bytes, bytes, bytes, int] | None:
        record = await get_user(client, keys, name)
        return record.auth_info() if record is not None else None

    return lookup


def password_matches(user: str, password: str, info: tuple[bytes, bytes, bytes, int]) -> bool:
    """Whether ``password`` is ``user``'s, given the stored SCRAM credentials ``info`` (one PBKDF2 run)."""
    server = _MECHANISM.make_server(lambda _name: info)
    client = ScramClient([SCRAM_SHA_256], user, password)
    try:
        server.set_client_first(client.get_client_first())
        client.set_server_first(server.get_server_first())
        server.set_client_final(client.get_client_final())
    except ScramException:
        return False
    return True


class PasswordCheck:
    """Checks user names and passwords against the stored credentials (module docstring)."""

    def __init__(self, users: UserLookup, remember: float = REMEMBER_SECONDS) -> None:
        self._users = users
        self._remember = remember
        self._key = secrets.token_bytes(32)
        self._checked: dict[bytes, float] = {}  # HMAC(user, password) -> monotonic time the success expires
        self._slots = asyncio.Semaphore(CONCURRENT_CHECKS)

    def _fingerprint(self, user: str, password: str) -> bytes:
        return hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()

    async def principal(self, user: str, password: str) -> Principal:
        """The principal ``user`` logs in as; raises :class:`LoginFailed`. A user name is never a broker
        principal: brokers are recognised by their certificates only."""
        fingerprint = self._fingerprint(user, password)
        now = time.monotonic()
        expires = self._checked.get(fingerprint)
        if expires is not None and expires > now:
            return Principal(user)
        info = await self._users(user) or _decoy()
        async with self._slots:
            matches = await asyncio.to_thread(password_matches, user, password, info)
        if not matches:
            self._checked.pop(fingerprint, None)
            raise LoginFailed(f"login failed for user {user!r}: wrong password or no such user")
        if len(self._checked) >= _CACHE_MAX:
            self._checked = {key: until for key, until in self._checked.items() if until > now}
            if len(self._checked) >= _CACHE_MAX:
                self._checked.clear()
        self._checked[fingerprint] = time.monotonic() + self._remember
        return Principal(user)

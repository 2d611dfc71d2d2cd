"""SCRAM-SHA-256 users as etcd records (``{prefix}/users/<name>``): only salted, hashed credentials.

A record holds what RFC 5802 lets a server keep: the salt, the iteration count, ``StoredKey`` (the hash of the
client key) and ``ServerKey``. Neither gives the password back nor lets anyone log in with it: a login needs the
client key, which only the password yields. ``tidelog user add`` makes the record from a password
(:func:`make_user`) and writes it; a broker reads one record per login (:func:`get_user`).
"""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec
from scramp import ScramMechanism

from tidelog.metadata.records import Keys

__all__ = [
    "ITERATIONS",
    "USER_RULE",
    "UserRecord",
    "check_user_name",
    "delete_user",
    "get_user",
    "list_users",
    "make_user",
    "put_user",
]

ITERATIONS = 4096
"""PBKDF2 iterations of new credentials (RFC 7677's minimum; raise it for stronger passwords' sake)."""
USER_RULE = "1-128 characters: letters, digits, '.', '_', '@' or '-'"
_USER_RE = re.compile(r"[A-Za-z0-9._@-]{1,128}")
_MECHANISM = ScramMechanism("SCRAM-SHA-256")


class UserRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One user's SCRAM-SHA-256 credentials (base64 in JSON)."""

    name: str
    salt: str
    stored_key: str
    server_key: str
    iterations: int

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What :mod:`scramp`'s server needs: salt, StoredKey, ServerKey, iterations."""
        return (
            base64.b64decode(self.salt),
            base64.b64decode(self.stored_key),
            base64.b64decode(self.server_key),
            self.iterations,
        )


def check_user_name(name: str) -> str:
    if not _USER_RE.fullmatch(name):
        raise ValueError(f"invalid user name {name!r}: use {USER_RULE}")
    return name


def make_user(name: str, password: str, iterations: int = ITERATIONS) -> UserRecord:
    """New credentials for ``name`` (a fresh random salt each time)."""
    if not password:
        raise ValueError("a password cannot be empty")
    salt, stored_key, server_key, count = _MECHANISM.make_auth_info(password, iteration_count=iterations)
    b64 = base64.b64encode
    return UserRecord(check_user_name(name), b64(salt).decode(), b64(stored_key).decode(), b64(server_key).decode(),
                      count)  # fmt: skip


def _key(keys: Keys, name: str) -> bytes:
    return f"{keys.prefix}/users/{name}".encode()


def _prefix(keys: Keys) -> bytes:
    return f"{keys.prefix}/users/".encode()


_decoder = msgspec.json.Decoder(UserRecord)


async def put_user(client: Any, keys: Keys, user: UserRecord) -> None:
    await client.put(_key(keys, user.name), msgspec.json.encode(user))


async def delete_user(client: Any, keys: Keys, name: str) -> bool:
    """Delete ``name``; whether it existed."""
    return bool(await client.delete(_key(keys, name)))


async def get_user(client: Any, keys: Keys, name: str) -> UserRecord | None:
    """The user's record; None when absent (or when its record does not decode: no login with it)."""
    if not _USER_RE.fullmatch(name):
        return None
    found = await client.get(_key(keys, name))
    if found is None:
        return None
    try:
        return _decoder.decode(bytes(found.value))
    except msgspec.MsgspecError:
        return None


async def list_users(client: Any, keys: Keys) -> list[str]:
    prefix = _prefix(keys)
    return sorted(bytes(kv.key)[len(prefix) :].decode() for kv in await client.get_prefix(prefix))

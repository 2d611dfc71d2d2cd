"""ACL entries as etcd records (``{prefix}/acls/<id>``): what they say, how they are written and read.

One entry grants or refuses one operation on resources of one type to one principal (Kafka's ACL shape):

- ``principal`` — a principal's name, or ``*`` for every principal (anonymous clients included);
- ``resource`` — ``stream``, ``group`` or ``cluster`` (the cluster's one resource is named ``cluster``);
- ``pattern`` — ``literal`` (the name exactly; ``*`` is every name) or ``prefixed`` (every name starting with it);
- ``name`` — the resource name or prefix;
- ``operation`` — ``read``, ``write``, ``create``, ``delete``, ``alter``, ``describe`` or ``all``;
- ``permission`` — ``allow`` or ``deny``.

The record's id is a digest of its fields, so adding an entry twice keeps one record and removing names the
entry by its fields. Values are JSON; :func:`decode_acl` refuses anything it does not fully understand (an unknown
field, resource or operation), and the broker's mirror treats such a record as a reason to deny (fail closed,
:mod:`tidelog.metadata.acl_mirror`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import msgspec

from tidelog.metadata.records import Keys

__all__ = [
    "AclEntry",
    "Operation",
    "Pattern",
    "Permission",
    "ResourceType",
    "acl_key",
    "acl_prefix",
    "add_acl",
    "decode_acl",
    "encode_acl",
    "list_acls",
    "remove_acls",
]


class ResourceType(StrEnum):
    STREAM = "stream"
    GROUP = "group"
    CLUSTER = "cluster"


class Operation(StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    ALL = "all"


class Pattern(StrEnum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class Permission(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


CLUSTER_NAME = "cluster"
"""The name of the cluster resource (there is one)."""

IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
"""Allowing one of these on a resource allows describing it too (Kafka's rule): a producer allowed to write a
stream may read its metadata without a second entry."""


class AclEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ACL entry (the module docstring says what each field means)."""

    principal: str
    resource: ResourceType
    name: str
    operation: Operation
    permission: Permission
    pattern: Pattern = Pattern.LITERAL

    def __post_init__(self) -> None:
        if not self.principal:
            raise ValueError("an ACL entry needs a principal (a name, or * for everyone)")
        if not self.name:
            raise ValueError("an ACL entry needs a resource name (a name, a prefix, or * for every name)")
        if self.resource is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise ValueError(f"the cluster resource is named {CLUSTER_NAME!r}, not {self.name!r}")

    def covers_principal(self, principal: str) -> bool:
        return self.principal == "*" or self.principal == principal

    def covers_name(self, name: str) -> bool:
        if self.pattern is Pattern.PREFIXED:
            return name.startswith(self.name)
        return self.name == "*" or self.name == name

    def covers_operation(self, operation: Operation) -> bool:
        if self.operation is Operation.ALL or self.operation is operation:
            return True
        # Implied describe only allows; a deny of write does not deny describe.
        return (
            operation is Operation.DESCRIBE
            and self.permission is Permission.ALLOW
            and self.operation in IMPLIES_DESCRIBE
        )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AclEntry)


def encode_acl(entry: AclEntry) -> bytes:
    return _encoder.encode(entry)


def decode_acl(data: bytes) -> AclEntry:
    """The entry ``data`` holds; ``msgspec.ValidationError``/``msgspec.DecodeError`` or ``ValueError`` when it
    is not one tidelog fully understands."""
    return _decoder.decode(data)


def acl_prefix(keys: Keys) -> bytes:
    return f"{keys.prefix}/acls/".encode()


def acl_key(keys: Keys, entry: AclEntry) -> bytes:
    """The entry's key: a digest of its fields, the same for the same entry on every host."""
    fields = (entry.principal, entry.resource, entry.pattern, entry.name, entry.operation, entry.permission)
    digest = hashlib.sha256("\0".join(fields).encode()).hexdigest()[:32]
    return acl_prefix(keys) + digest.encode()


async def add_acl(client: Any, keys: Keys, entry: AclEntry) -> None:
    await client.put(acl_key(keys, entry), encode_acl(entry))


async def remove_acls(client: Any, keys: Keys, entries: Sequence[AclEntry]) -> int:
    """Delete these entries; how many existed."""
    removed = 0
    for entry in entries:
        if await client.delete(acl_key(keys, entry)):
            removed += 1
    return removed


async def list_acls(client: Any, keys: Keys) -> tuple[list[AclEntry], list[bytes]]:
    """Every entry, and the keys of the records that do not decode (they deny everything but super users)."""
    entries: list[AclEntry] = []
    broken: list[bytes] = []
    for kv in await client.get_prefix(acl_prefix(keys)):
        try:
            entries.append(decode_acl(bytes(kv.value)))
        except (msgspec.MsgspecError, ValueError):
            broken.append(bytes(kv.key))
    return entries, broken

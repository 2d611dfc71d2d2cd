"""ACL records: what they encode to, their keys, and what does not decode (which the mirror fails closed on)."""

from __future__ import annotations

import msgspec
import pytest

from tidelog.metadata.acl_records import (
    AclEntry,
    Operation,
    Pattern,
    Permission,
    ResourceType,
    acl_key,
    decode_acl,
    encode_acl,
)
from tidelog.metadata.namespace import namespace_keys

ENTRY = AclEntry("alice", ResourceType.STREAM, "orders", Operation.READ, Permission.ALLOW, Pattern.PREFIXED)


def test_round_trip_and_a_key_that_is_the_same_for_the_same_entry() -> None:
    assert decode_acl(encode_acl(ENTRY)) == ENTRY
    keys = namespace_keys("prod")
    copy = AclEntry("alice", ResourceType.STREAM, "orders", Operation.READ, Permission.ALLOW, Pattern.PREFIXED)
    assert acl_key(keys, ENTRY) == acl_key(keys, copy)
    assert acl_key(keys, ENTRY).startswith(b"/prod/acls/")
    deny = AclEntry("alice", ResourceType.STREAM, "orders", Operation.READ, Permission.DENY, Pattern.PREFIXED)
    assert acl_key(keys, deny) != acl_key(keys, ENTRY)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b'{"principal":"a","resource":"topic","name":"x","operation":"read","permission":"allow"}',
        b'{"principal":"a","resource":"stream","name":"x","operation":"read","permission":"allow","extra":1}',
        b'{"principal":"a","resource":"stream","name":"x","operation":"read"}',
        b'{"principal":"","resource":"stream","name":"x","operation":"read","permission":"allow"}',
        b'{"principal":"a","resource":"cluster","name":"x","operation":"read","permission":"allow"}',
    ],
)
def test_anything_not_fully_understood_does_not_decode(data: bytes) -> None:
    with pytest.raises((msgspec.MsgspecError, ValueError)):
        decode_acl(data)

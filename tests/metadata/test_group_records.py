"""Group records as etcd holds them: their keys, their encoding, and the questions brokers ask of them."""

from __future__ import annotations

from tidelog.metadata.group_records import (
    GroupMember,
    GroupRecord,
    count_coordinated,
    decode_group,
    encode_group,
    group_key,
    group_prefix,
)
from tidelog.metadata.records import Keys

RECORD = GroupRecord(
    "orders",
    "b1",
    42,
    (GroupMember("c1", ("s", "t"), (("s", (0, 2)), ("t", (1,)))), GroupMember("c2", ("s",), (("s", (1,)),))),
    created_ns=7,
)


def test_records_round_trip_and_live_under_the_groups_prefix() -> None:
    assert decode_group(encode_group(RECORD)) == RECORD
    keys = Keys("/x")
    assert group_prefix(keys) == b"/x/groups/"
    assert group_key(keys, "orders") == b"/x/groups/orders"


def test_who_owns_what() -> None:
    assert RECORD.owner_of("s", 1) == "c2"
    assert RECORD.owner_of("t", 1) == "c1"
    assert RECORD.owner_of("t", 0) is None
    assert RECORD.member_ids == ("c1", "c2")
    member = RECORD.member("c1")
    assert member is not None and sorted(member.partitions()) == [("s", 0), ("s", 2), ("t", 1)]
    assert RECORD.member("c3") is None
    assert count_coordinated({"a": RECORD, "b": RECORD}) == {"b1": 2}

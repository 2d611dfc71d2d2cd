"""SharedMap: an edited copy holds the edit, the original is unchanged, and untouched shards are shared; the
placement load read from one is the same as counted record by record."""

from __future__ import annotations

from tidelog.metadata.placement import PendingPlacements, placement_load
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.shared_map import DELETED, SHARDS, SharedMap
from tidelog.metadata.snapshot import MetadataSnapshot


def test_an_edit_copies_only_the_shards_it_touches() -> None:
    base = SharedMap({("s", i): i for i in range(2_000)})
    edited = base.edit({("s", 7): -7, ("s", 2_000): 2_000, ("s", 8): DELETED, ("none", 0): DELETED})

    assert len(base) == 2_000 and base[("s", 7)] == 7 and ("s", 8) in base and ("s", 2_000) not in base
    assert len(edited) == 2_000 and edited[("s", 7)] == -7 and ("s", 8) not in edited
    assert edited.get(("s", 2_000)) == 2_000 and edited.get(("s", 8)) is None
    assert edited.shares_with(base) >= SHARDS - 3  # three keys changed: at most three shards copied
    assert dict(edited.items()) == {**{("s", i): i for i in range(2_001) if i != 8}, ("s", 7): -7}
    assert sorted(edited.values()) == sorted(dict(edited).values())
    assert edited == dict(edited) and edited != base and base == SharedMap(dict(base))
    assert base.edit({}) is base


def test_the_placement_load_of_a_shared_map_is_counted_again_only_where_it_changed() -> None:
    def record(i: int, replicas: str) -> PartitionRecord:
        return PartitionRecord(f"s{i}", 0, tuple(replicas), replicas[0], tuple(replicas))

    base = SharedMap({(f"s{i}", 0): record(i, "abc"[i % 3 :] + "abc"[: i % 3]) for i in range(1_000)})
    pending = PendingPlacements()
    assert pending.load(MetadataSnapshot(1, {}, base)) == placement_load(base.values())
    edited = base.edit({("s1", 0): record(1, "aa"), ("s1000", 0): record(1_000, "c"), ("s2", 0): DELETED})
    assert pending.load(MetadataSnapshot(2, {}, edited)) == placement_load(edited.values())


def test_a_map_grown_one_key_at_a_time_gets_more_shards() -> None:
    grown: SharedMap[int, int] = SharedMap()
    assert len(grown.shards()) == 1
    for i in range(3_000):
        grown = grown.edit({i: i})
    assert len(grown.shards()) == SHARDS and dict(grown) == {i: i for i in range(3_000)}
    assert grown.edit({5: -5}).shares_with(grown) == SHARDS - 1

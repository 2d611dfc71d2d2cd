"""SharedMap: an edited copy holds the edit, the original is unchanged, and untouched shards are shared."""

from __future__ import annotations

from tidelog.metadata.shared_map import DELETED, SHARDS, SharedMap


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

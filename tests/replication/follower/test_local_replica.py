"""The follower's own copy: its high watermark follows the leader's as far as the log reaches and goes down only
with a cut below it; a cut that changes nothing leaves everything as it was."""

from __future__ import annotations

from pathlib import Path

from tests.replication.helpers import write
from tidelog.clock import ManualClock
from tidelog.replication.follower.local_replica import LocalReplica
from tidelog.testing.replica_leader import open_log


async def test_the_high_watermark_follows_the_leader_as_far_as_the_log_reaches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await write(log, [(1, [b"a", b"b", b"c"])])
    told: list[int] = []
    replica = LocalReplica(log, "s/0", 9, None, told.append, ManualClock())
    assert replica.hw == 3  # a checkpoint above the log end is clamped to it
    replica.advance_hw(2)
    assert replica.hw == 3 and told == []  # never back on the leader's word alone
    await write(log, [(1, [b"d", b"e"])])
    replica.advance_hw(4)
    replica.advance_hw(9)
    assert replica.hw == 5 and told == [4, 5]
    await log.close()


async def test_a_cut_below_the_high_watermark_lowers_it_and_says_so(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await write(log, [(1, [b"a", b"b", b"c", b"d"])])
    told: list[int] = []
    replica = LocalReplica(log, "s/0", 4, None, told.append, ManualClock())
    await replica.truncate(9, "beyond the end: nothing to cut")
    assert log.end_offset == 4 and replica.hw == 4 and told == []
    await replica.truncate(2, "the leader's epoch ends there")
    assert log.end_offset == 2 and replica.hw == 2 and told == [2]
    await replica.reset(7, "the leader's log starts there")
    assert (log.start_offset, log.end_offset) == (7, 7) and told == [2]  # 7 is not below the HW: not lowered
    await log.close()

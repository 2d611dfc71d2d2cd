"""The KIP-101/279 truncation decision, one branch at a time, and whole exchanges against a model leader."""

from __future__ import annotations

from tidelog.replication.follower.truncation import TruncationStep, truncation_step
from tidelog.storage.epoch_cache import UNDEFINED, EpochEndOffset


def end_for(entries: list[tuple[int, int]], log_end: int, epoch: int) -> EpochEndOffset:
    """KIP-279's lookup over ``(epoch, start)`` entries, as the epoch cache answers it."""
    if epoch < 0 or not entries or epoch < entries[0][0] or epoch > entries[-1][0]:
        return UNDEFINED
    if epoch == entries[-1][0]:
        return EpochEndOffset(epoch, log_end)
    floor = max(i for i, (e, _) in enumerate(entries) if e <= epoch)
    return EpochEndOffset(entries[floor][0], entries[floor + 1][1])


def converge(
    follower: list[tuple[int, int]], follower_end: int, leader: list[tuple[int, int]], leader_end: int, hw: int
) -> tuple[int, int]:
    """Run the exchange to its end; (where the follower's log ends, rounds taken)."""
    for rounds in range(1, 100):
        latest = follower[-1][0] if follower else -1
        answer = end_for(leader, leader_end, latest) if latest >= 0 else UNDEFINED
        local = end_for(follower, follower_end, answer.epoch) if answer.epoch >= 0 else UNDEFINED
        step = truncation_step(answer, local, follower_end, hw)
        follower_end = min(follower_end, step.offset)
        follower = [(e, s) for e, s in follower if s < follower_end]
        if step.complete:
            return follower_end, rounds
    raise AssertionError("did not converge")


def test_same_latest_epoch_truncates_to_where_it_ends_on_the_leader() -> None:
    step = truncation_step(EpochEndOffset(3, 10), EpochEndOffset(3, 14), 14, 8)
    assert step[:2] == (10, True)


def test_a_follower_that_is_a_prefix_of_the_leader_keeps_its_log() -> None:
    step = truncation_step(EpochEndOffset(3, 20), EpochEndOffset(3, 14), 14, 8)
    assert step[:2] == (14, True)


def test_an_epoch_the_follower_never_had_drops_its_newer_epochs_and_asks_again() -> None:
    # The follower asked with epoch 3; the leader's largest epoch ≤ 3 is 2, which the follower never had: its
    # largest ≤ 2 is 1, ending at 12 (where its epoch 3 began).
    step = truncation_step(EpochEndOffset(2, 15), EpochEndOffset(1, 12), 16, 4)
    assert step[:2] == (12, False)


def test_when_every_local_epoch_is_newer_the_leaders_end_is_taken() -> None:
    assert truncation_step(EpochEndOffset(1, 5), UNDEFINED, 16, 4)[:2] == (5, True)


def test_an_undefined_answer_falls_back_to_the_known_high_watermark_never_below() -> None:
    step = truncation_step(UNDEFINED, UNDEFINED, 16, 9)
    assert isinstance(step, TruncationStep) and step[:2] == (9, True) and "HW" in step.reason
    assert truncation_step(UNDEFINED, UNDEFINED, 6, 9)[:2] == (6, True)  # an HW above the log end cuts nothing
    assert truncation_step(EpochEndOffset(2, -1), UNDEFINED, 16, 9)[:2] == (9, True)


def test_the_kip_279_walk_back_over_several_epochs() -> None:
    # follower: e0 [0,2) e1 [2,4) e3 [4,6)      leader: e0 [0,2) e2 [2,5) e4 [5,7)
    end, rounds = converge([(0, 0), (1, 2), (3, 4)], 6, [(0, 0), (2, 2), (4, 5)], 7, hw=2)
    assert (end, rounds) == (2, 2)


def test_a_divergent_tail_in_an_older_epoch_is_cut_at_the_leaders_epoch_end() -> None:
    # follower: e0 [0,3) e1 [3,6)  (e1 never replicated)     leader: e0 [0,3) e2 [3,5)
    assert converge([(0, 0), (1, 3)], 6, [(0, 0), (2, 3)], 5, hw=3) == (3, 1)


def test_matching_histories_converge_in_one_round_without_cutting() -> None:
    assert converge([(0, 0), (2, 3)], 4, [(0, 0), (2, 3)], 9, hw=1) == (4, 1)

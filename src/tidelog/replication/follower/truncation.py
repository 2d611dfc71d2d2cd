"""Where a follower truncates its log before copying from a leader: the KIP-101/KIP-279 decision, pure.

A follower's log may end with batches the leader never had: written by a leader that lost its leadership before
they were replicated (they were never committed), or copied from such a leader. Truncating to the high
watermark is not enough (KIP-101): the HW a follower knows lags the leader's, so truncating to it can throw
away committed records, and a divergent tail above it would be kept. Instead the follower asks the leader where
the follower's latest leader epoch ends on the *leader's* log (EPOCH_END_OFFSET) and cuts there.

One round of the exchange (Kafka's ``getOffsetTruncationState``)::

    follower: my latest epoch is F                 leader: the largest epoch ≤ F I know is L, ending at E
    follower: the largest epoch ≤ L I know is L', ending (on my log) at E'
      L' == L        → truncate to min(E, E', my end); done: both logs agree up to there
      L' <  L        → I never had epoch L: truncate to min(E', my end), dropping every epoch above L',
                       and ask again with my new latest epoch (L', or lower)
      I know none    → every epoch I have is above L: truncate to min(E, my end); done
    L undefined      → the leader knows no epoch ≤ F (or none at all): fall back to the HW I know committed

Each new round asks with a strictly smaller epoch, so the exchange ends after at most as many rounds as the
follower has epochs. The caller clamps the result to its log start (a log cannot be cut below it).
"""

from __future__ import annotations

from typing import NamedTuple

from tidelog.storage.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEndOffset


class TruncationStep(NamedTuple):
    """One round's outcome: truncate the log to ``offset`` (at or past its end: keep it as is), then stop when
    ``complete``, or ask the leader again with the log's new latest epoch."""

    offset: int
    complete: bool
    reason: str  # for the log line: why this offset


def truncation_step(
    leader: EpochEndOffset, local: EpochEndOffset, log_end: int, known_high_watermark: int
) -> TruncationStep:
    """Decide one round (see the module docstring).

    ``leader`` is the leader's answer to the follower's latest epoch; ``local`` is the follower's own
    ``end_offset_for_epoch(leader.epoch)`` (ignored when ``leader`` is undefined); ``known_high_watermark`` is
    the highest offset the follower knows committed, the floor of the undefined case.
    """
    if leader.epoch == UNDEFINED_EPOCH or leader.end_offset == UNDEFINED_EPOCH_OFFSET:
        offset = min(known_high_watermark, log_end)
        return TruncationStep(offset, True, f"the leader knows no epoch to match: keeping the known HW {offset}")
    if local.epoch == leader.epoch:
        offset = min(leader.end_offset, local.end_offset, log_end)
        return TruncationStep(offset, True, f"epoch {leader.epoch} ends at {offset} on both logs")
    if local.epoch == UNDEFINED_EPOCH:
        offset = min(leader.end_offset, log_end)
        return TruncationStep(
            offset, True, f"every local epoch is above the leader's epoch {leader.epoch}, which ends at {offset}"
        )
    offset = min(local.end_offset, log_end)
    return TruncationStep(
        offset, False, f"epoch {leader.epoch} is unknown here: dropping local epochs above {local.epoch} from {offset}"
    )

"""Fencing by group epoch: a request made on behalf of a consumer group member acts on a partition only while that
member owns the partition at the group's current epoch.

Three requests carry a member's context (:class:`~tidelog.protocol.messages.GroupContext`: group id, consumer id,
the group epoch the member holds): a commit (SET_CURSOR of the group's cursor), a read (the wire protocol's FETCH,
gRPC ``Subscribe`` with its ``consumer`` field) and a takeover's read of the committed offset (FETCH_CURSOR). The
broker answering them has the group's record in its mirror of etcd, and checks:

- the ids (:func:`~tidelog.metadata.group_records.check_id`), and for a commit that the cursor is the group's
  (its id is the group id): INVALID_ARGUMENT;
- the group exists (UNKNOWN_GROUP), ``epoch`` is its current epoch (STALE_GROUP_EPOCH), the consumer is a member
  (UNKNOWN_MEMBER) and the partition is assigned to it (STALE_GROUP_EPOCH: the partition moved).

A request naming an epoch newer than the mirror's (the coordinator answered from a fresher view a moment ago)
first waits, at most :data:`CATCH_UP` seconds, for the mirror to reach it; if it has not, the request is refused
as UNAVAILABLE (retriable), never answered from the older record.

**Why commits cannot go back.** The check of a commit runs synchronously just before its write is issued, and
the write is registered as under way on its cursor at that moment (:meth:`CursorStore.set
<tidelog.broker.cursors.CursorStore.set>`). A member taking a partition over reads the committed offset with its
own, newer, epoch: the read waits for this broker's mirror to reach that epoch, from which moment every commit at
an older epoch is refused, then for the commits under way on the cursor (those that passed the check before). So
the offset it resumes from is never older than a commit the previous owner was told succeeded, and the previous
owner can never write over what the new owner commits: a committed offset goes back only by an explicit reset.
Checks and registration happen on the one broker that leads the cursor's ``__cursors`` partition; a new leader
rebuilds its cursors from its log after everything it holds is committed, so a commit under way on a deposed
leader is either in that log or was never acknowledged.
"""

from __future__ import annotations

import contextlib

from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.group_records import GroupRecord, check_id
from tidelog.protocol.errors import (
    InvalidArgumentError,
    StaleGroupEpochError,
    UnavailableError,
    UnknownGroupError,
    UnknownMemberError,
)
from tidelog.protocol.messages import GroupContext

CATCH_UP = 2.0
"""Longest a request with an epoch newer than this broker's record of the group waits for the record, seconds."""


def check_context(context: GroupContext) -> None:
    """Refuse malformed ids (INVALID_ARGUMENT)."""
    check_id("groupId", context.group_id)
    if not context.consumer_id:
        raise InvalidArgumentError("consumer id cannot be empty when group id is provided")
    check_id("consumerId", context.consumer_id)


async def record_at(groups: GroupMirror, group_id: str, epoch: int) -> GroupRecord | None:
    """The group's record once this broker's mirror holds ``epoch`` or a newer one, waiting :data:`CATCH_UP`
    seconds at most (then the record as it is, maybe older, or None: no such group)."""
    record = groups.get(group_id)
    if record is None or record.epoch < epoch:

        def arrived(mirror: GroupMirror) -> bool:
            found = mirror.get(group_id)
            return found is not None and found.epoch >= epoch

        with contextlib.suppress(TimeoutError):
            await groups.wait_for(arrived, CATCH_UP)
        record = groups.get(group_id)
    return record


async def record_at_least(groups: GroupMirror, context: GroupContext) -> GroupRecord | None:
    """:func:`record_at` for a member's request; ``UnavailableError`` (retriable: clients try again) when this
    broker's record is still older than the member's epoch after the wait, since answering from it could let a
    commit at an older epoch through."""
    record = await record_at(groups, context.group_id, context.epoch)
    if record is not None and record.epoch < context.epoch:
        raise UnavailableError(
            f"this broker knows consumer group {context.group_id} at epoch {record.epoch}, behind the epoch "
            f"{context.epoch} of consumer {context.consumer_id}; try again"
        )
    return record


def check_owner(record: GroupRecord | None, context: GroupContext, stream: str, partition: int, action: str) -> None:
    """Refuse ``action`` (``"commit"``, ``"read"``) on ``stream``/``partition`` unless the member of ``context``
    owns the partition at the group's current epoch (see the module docstring for the errors)."""
    group, consumer, epoch = context.group_id, context.consumer_id, context.epoch
    if record is None:
        raise UnknownGroupError(f"no such consumer group {group}: consumer {consumer} may not {action} {stream}")
    if epoch != record.epoch:
        raise StaleGroupEpochError(
            f"consumer {consumer} may not {action} {stream}/{partition} at group epoch {epoch}: consumer group "
            f"{group} is at epoch {record.epoch}; fetch the assignments again"
        )
    if record.member(consumer) is None:
        raise UnknownMemberError(
            f"consumer {consumer} is not a member of consumer group {group} (epoch {record.epoch}): it may not "
            f"{action} {stream}/{partition}"
        )
    if record.owner_of(stream, partition) != consumer:
        raise StaleGroupEpochError(
            f"consumer {consumer} is not currently assigned partition {partition} of stream {stream} in consumer "
            f"group {group} (epoch {record.epoch}): it may not {action} it"
        )

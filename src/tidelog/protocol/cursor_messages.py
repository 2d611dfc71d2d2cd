"""Frame headers of the cursor ops: SET_CURSOR and FETCH_CURSOR, a consumer's position kept in the internal stream
``__cursors`` (:mod:`tidelog.broker.cursors`), and LIST_CURSORS, every cursor of one id in one ``__cursors``
partition (what tooling shows of a consumer group's committed offsets).

Partition and offset take any 32- and 64-bit value here: the broker checks them and names what is wrong (a
partition that does not exist, an offset below -1), which a header decoding error could not. Routed by
:mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from tidelog.protocol.messages import (
    INT32_MAX,
    INT64_MAX,
    GroupContext,
    Header,
    Millis,
    Name,
    OffsetOrNone,
    PartitionId,
)

CursorPartition = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
CursorOffset = Annotated[int, msgspec.Meta(ge=-(2**63), le=INT64_MAX)]


class SetCursorRequest(Header, frozen=True):
    """Store ``offset`` (-1: nothing consumed) as cursor ``cursor_id``'s position in ``stream``/``partition``.
    Sent to the leader of the cursor's ``__cursors`` partition (``crc32(key) % partitions``, key
    ``cursor_id,stream,partition``); answered once committed (acks ALL).

    ``group``: a consumer group member committing the group's offset (``cursor_id`` is the group id). Refused,
    nothing stored, unless the member owns the partition at the group's current epoch (a fenced commit)."""

    stream: Name
    partition: CursorPartition
    cursor_id: str
    offset: CursorOffset
    timeout_ms: Millis = 5_000
    group: GroupContext | None = None


class SetCursorResponse(Header, frozen=True):
    pass


class FetchCursorRequest(Header, frozen=True):
    """Read cursor ``cursor_id``'s position in ``stream``/``partition``; sent like :class:`SetCursorRequest`.

    ``group``: a member taking a partition over reads the group's offset at its epoch: the answer waits until the
    broker knows that epoch (from then on commits at older epochs are refused) and until every commit under way
    on the cursor is done, so it is never older than a commit that passed the fence."""

    stream: Name
    partition: CursorPartition
    cursor_id: str
    timeout_ms: Millis = 5_000
    group: GroupContext | None = None


class FetchCursorResponse(Header, frozen=True):
    offset: OffsetOrNone  # -1: never set


class ListCursorsRequest(Header, frozen=True):
    """Every cursor of id ``cursor_id`` held in ``__cursors`` partition ``cursors_partition``; sent to that
    partition's leader (a client asks each partition to find all of them: a cursor's partition follows from its
    whole key, not from the id alone)."""

    cursor_id: str
    cursors_partition: PartitionId
    timeout_ms: Millis = 5_000


class CursorPosition(Header, frozen=True):
    stream: str
    partition: int
    offset: int


class ListCursorsResponse(Header, frozen=True):
    cursors: tuple[CursorPosition, ...]  # sorted by stream and partition

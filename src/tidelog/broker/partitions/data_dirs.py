"""Where a broker keeps partition data on disk, and how it is removed.

Partition data lives at ``<root>/<stream>@<created_ns>/<partition>``: the creation time in the path means a
stream deleted while this broker was down and then created again under the same name never adopts the old
stream's files. This module also checks, once at start, that the open-file limit leaves room beside the
segment files the broker may hold open (:mod:`tidelog.storage.open_files`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import shutil
from pathlib import Path

from tidelog.metadata.records import StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot

log = logging.getLogger(__name__)

OTHER_DESCRIPTORS = 256
"""Descriptors a broker should have at least beside its segment files (sockets, index writes, reads in flight):
the open-file limit is checked against ``max_open_segment_files`` plus this (the default 512 plus this fits the
usual soft limit of 1,024)."""


def partition_path(root: Path, stream: StreamRecord, partition: int) -> Path:
    """The directory of one partition's data."""
    return root / f"{stream.name}@{stream.created_ns}" / str(partition)


async def delete_directory(path: Path) -> None:
    """Delete a partition's directory, and its stream's once empty."""
    await asyncio.to_thread(shutil.rmtree, path, True)
    parent = path.parent
    if parent.exists() and not any(parent.iterdir()):
        parent.rmdir()


def remove_orphans(root: Path, snapshot: MetadataSnapshot, broker_id: str) -> list[Path]:
    """Blocking (a worker thread): delete stream directories of streams that no longer exist, and partition
    directories of partitions that no longer have a replica on ``broker_id`` (deleted, or reassigned away, while
    this broker was down)."""
    if not root.exists():
        return []
    live = {f"{s.name}@{s.created_ns}" for s in snapshot.streams.values()}
    removed = [d for d in root.iterdir() if d.is_dir() and d.name not in live]
    for d in removed:
        shutil.rmtree(d, True)
        log.info("removed data of deleted stream %s", d.name)
    for stream in snapshot.streams.values():  # reassigned away while this broker was down
        for record in snapshot.partitions_of(stream.name):
            moved = partition_path(root, stream, record.id)
            if broker_id not in record.replicas and moved.is_dir():
                shutil.rmtree(moved, True)
                removed.append(moved)
                log.info("removed data of partition %s/%d: it was reassigned away", stream.name, record.id)
    return removed


def check_open_file_limit(segment_files: int) -> None:
    """Warn when the process's open-file limit leaves too little room beside ``segment_files`` segment files (the
    other descriptors a broker holds: docs/operations.md)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < segment_files + OTHER_DESCRIPTORS:
        log.warning(
            "the open-file limit (ulimit -n) is %d: max_open_segment_files = %d leaves fewer than %d descriptors for "
            "connections, index writes and reads in flight; raise the limit or lower the setting",
            soft,
            segment_files,
            OTHER_DESCRIPTORS,
        )

"""Sending a segment file's byte range to a client socket with ``os.sendfile``, under an asyncio transport.

uvloop has no ``loop.sendfile`` and both uvloop and asyncio refuse ``add_writer`` on a descriptor a transport
owns, so the socket is written to directly, in three steps that keep the byte stream in order:

1. wait until the transport's own buffer is *empty* (the frame prefix written just before must leave first):
   the write-buffer limits are dropped to zero for the wait, so ``drain()`` returns only at zero;
2. ``os.sendfile`` from the file to the socket until the range is sent or the socket's buffer is full
   (``EAGAIN``: the socket is non-blocking);
3. when it is full, one chunk is read with ``pread`` and handed to the transport, which waits for writability
   the way it always does; once that chunk has left, back to step 2.

On loopback and LAN the socket buffer (megabytes, autotuned) usually takes a whole fetch response in step 2,
so the bytes never enter Python; a slow reader costs one copied chunk per time its buffer fills.
"""

from __future__ import annotations

import asyncio
import os

from tidelog.storage.log_read import FileRange

FALLBACK_CHUNK = 256 * 1024  # bytes copied through the transport each time the socket buffer is full


class ShortFileError(OSError):
    """The file held fewer bytes than its range promised: the frame cannot be completed, drop the connection."""


async def drain_empty(writer: asyncio.StreamWriter) -> None:
    """Wait until every byte given to ``writer``'s transport has been handed to the kernel."""
    transport = writer.transport
    if not transport.get_write_buffer_size():
        return
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)  # pauses the protocol while anything is buffered
    try:
        await writer.drain()
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


async def send_range(writer: asyncio.StreamWriter, socket_fd: int, file: FileRange) -> None:
    """Send ``file``'s range to the socket ``socket_fd`` that ``writer`` writes to, after what it buffered."""
    await drain_empty(writer)
    position = file.position
    remaining = file.length
    while remaining:
        try:
            sent = os.sendfile(socket_fd, file.fd, position, remaining)
        except BlockingIOError:
            sent = -1
        except InterruptedError:
            continue
        if sent == 0:
            raise ShortFileError(f"{file.path} ended {remaining} bytes before its range")
        if sent > 0:
            position += sent
            remaining -= sent
            continue
        chunk = os.pread(file.fd, min(remaining, FALLBACK_CHUNK), position)
        if not chunk:
            raise ShortFileError(f"{file.path} ended {remaining} bytes before its range")
        writer.write(chunk)
        position += len(chunk)
        remaining -= len(chunk)
        await drain_empty(writer)

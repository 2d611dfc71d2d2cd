"""Encryption at rest: record batches sealed with AES-256-GCM, one seal per batch, under a partition's data keys.

A batch of an encrypted stream is sealed once, on the leader, where it enters the partition (before it is
stored, so followers copy and store the very same ciphertext, and replication carries nothing else). Its records
section — the encoded records, compressed as the batch's codec says — is replaced by::

    key_id      4 bytes   which of the partition's data keys sealed it (an index into the :class:`Keyring`)
    nonce      12 bytes   random, fresh for every seal
    sealed      …         AES-256-GCM of the records section, its 16-byte tag last

and attribute bit 7 (:data:`~tidelog.protocol.records.ENCRYPTED_FLAG`) is set. The header and a transactional
append's registers block stay clear (offsets, timestamps, producer ids and registers are what the broker itself
works with: retention, the time index, idempotence, recovery), and they are the seal's associated data from the
attributes on, so a sealed section cannot be moved to another header. The base offset, length, leader epoch and
CRC are left out of it: the leader assigns the first three after sealing, and the CRC is recomputed over the
sealed bytes, so every CRC check (appends, recovery, replication) works on sealed batches unchanged.

Why per batch: the write and read paths never loop over records in Python (``docs/architecture.md``,
"Performance principles"); a seal per batch costs one AES-GCM pass over bytes already in memory, and one CRC.
Keys are not kept clear for compaction: compaction opens each batch it rewrites and seals the survivors again
under the same key (:mod:`tidelog.storage.compaction`), so no record key or value is ever on disk in clear.

Batches are opened where they leave the broker for a consumer (:func:`open_batches`): the result is an ordinary
batch (bit 7 clear, its CRC recomputed), so clients, Spark and every decoder read it unchanged. Reading an
encrypted partition therefore copies through Python instead of ``os.sendfile``.

Nonces are random (96 bits): the chance that two seals under one key share a nonce stays below 2^-32 for the
first 2^32 batches of a key; ``tidelog stream rotate-key`` starts a new key well before. The keys themselves,
and how they are wrapped by the broker's master key, are :mod:`tidelog.broker.encryption`'s.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tidelog.protocol.records import (
    ATTRIBUTES_POS,
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    ENCRYPTED_FLAG,
    HEADER_SIZE,
    LENGTH_FIELD_END,
    REGISTERS_FLAG,
    REGISTERS_LENGTH,
    BatchHeader,
    iter_batches,
    parse_header,
)
from tidelog.protocol.records.errors import InvalidBatchError
from tidelog.storage.errors import KeyUnavailableError

KEY_ID = struct.Struct(">I")
NONCE_SIZE = 12
TAG_SIZE = 16
SEAL_OVERHEAD = KEY_ID.size + NONCE_SIZE + TAG_SIZE
"""Bytes a seal adds to a batch."""

_ATTRIBUTES = struct.Struct(">h")
_LENGTH = struct.Struct(">i")
_LENGTH_POS = 8

Buffer = bytes | bytearray | memoryview


class Keyring:
    """One partition's data keys by id (their index); the newest seals new batches, every one opens old ones."""

    __slots__ = ("_ciphers", "name")

    def __init__(self, keys: Sequence[bytes], name: str = "") -> None:
        if not keys:
            raise ValueError("a keyring needs at least one data key")
        self._ciphers = [AESGCM(key) for key in keys]
        self.name = name  # the partition's, for error messages

    @property
    def current(self) -> int:
        """The id of the key new batches are sealed with."""
        return len(self._ciphers) - 1

    def cipher(self, key_id: int) -> AESGCM:
        if not 0 <= key_id < len(self._ciphers):
            raise KeyUnavailableError(
                f"{self.name}: a batch was sealed with data key {key_id}, and the partition has keys "
                f"0..{len(self._ciphers) - 1}"
            )
        return self._ciphers[key_id]


def _section_start(data: Buffer, position: int, header: BatchHeader) -> int:
    """Where the batch's records section starts: after the header and its registers block, if any."""
    start = position + HEADER_SIZE
    if header.attributes & REGISTERS_FLAG:
        start += REGISTERS_LENGTH.size + REGISTERS_LENGTH.unpack_from(data, start)[0]
    return start


def _finish(head: bytearray, body: Sequence[Buffer]) -> bytes:
    """Join a batch's head (header and registers block) and body, fixing its length and CRC."""
    length = len(head) + sum(len(part) for part in body) - LENGTH_FIELD_END
    _LENGTH.pack_into(head, _LENGTH_POS, length)
    crc = crc32c.crc32c(memoryview(head)[CRC_START:])
    for part in body:
        crc = crc32c.crc32c(part, crc)
    CRC_FIELD.pack_into(head, CRC_POS, crc)
    return b"".join((head, *body))


def seal_batch(data: Buffer, position: int, header: BatchHeader, keyring: Keyring, key_id: int | None = None) -> bytes:
    """The batch at ``data[position:]`` sealed under ``key_id`` (default: the keyring's current key)."""
    if header.attributes & ENCRYPTED_FLAG:
        raise InvalidBatchError(f"batch at byte {position} is marked encrypted already: only the broker seals batches")
    view = memoryview(data)
    start = _section_start(data, position, header)
    head = bytearray(view[position:start])
    _ATTRIBUTES.pack_into(head, ATTRIBUTES_POS, header.attributes | ENCRYPTED_FLAG)
    key = keyring.current if key_id is None else key_id
    nonce = os.urandom(NONCE_SIZE)
    sealed = keyring.cipher(key).encrypt(nonce, view[start : position + header.size], bytes(head[ATTRIBUTES_POS:]))
    return _finish(head, (KEY_ID.pack(key), nonce, sealed))


def seal_batches(data: Buffer, keyring: Keyring) -> bytes:
    """Every batch of ``data`` sealed under the keyring's current key (the leader's write path)."""
    batches = iter_batches(data, verify=False)
    return b"".join(seal_batch(data, position, header, keyring) for position, header in batches)


def open_batch(data: Buffer, position: int, header: BatchHeader, keyring: Keyring | None) -> bytes:
    """The sealed batch at ``data[position:]`` as the plain batch it was; raises :class:`KeyUnavailableError`
    without the key, or when the seal does not verify (the wrong key, or bytes changed on disk)."""
    view = memoryview(data)
    start = _section_start(data, position, header)
    end = position + header.size
    if end - start < SEAL_OVERHEAD:
        raise KeyUnavailableError(f"batch at offset {header.base_offset} is too short to be sealed")
    if keyring is None:
        raise KeyUnavailableError(
            f"offsets {header.base_offset}..{header.last_offset} are encrypted and this broker has no key for them"
        )
    (key_id,) = KEY_ID.unpack_from(view, start)
    nonce = view[start + KEY_ID.size : start + KEY_ID.size + NONCE_SIZE]
    head = bytearray(view[position:start])
    sealed = view[start + KEY_ID.size + NONCE_SIZE : end]
    try:
        plain = keyring.cipher(key_id).decrypt(nonce, sealed, bytes(head[ATTRIBUTES_POS:]))
    except InvalidTag:
        raise KeyUnavailableError(
            f"{keyring.name}: offsets {header.base_offset}..{header.last_offset} do not open with data key {key_id} "
            "(another master key wrapped it, or the bytes changed on disk)"
        ) from None
    _ATTRIBUTES.pack_into(head, ATTRIBUTES_POS, header.attributes & ~ENCRYPTED_FLAG)
    return _finish(head, (plain,))


def open_batches(data: bytes, keyring: Keyring | None) -> bytes:
    """``data`` (whole batches) with every sealed batch opened; ``data`` itself when none is sealed."""
    out: list[Buffer] = []
    view = memoryview(data)
    sealed = False
    for position, header in iter_batches(data, verify=False):
        if header.attributes & ENCRYPTED_FLAG:
            sealed = True
            out.append(open_batch(data, position, header, keyring))
        else:
            out.append(view[position : position + header.size])
    return b"".join(out) if sealed else data


def is_sealed(data: Buffer, position: int = 0) -> bool:
    """Whether the batch at ``data[position:]`` is sealed."""
    return bool(parse_header(data, position).attributes & ENCRYPTED_FLAG)

"""Batches sealed at rest: round trips, what a seal hides and binds, and compaction of sealed segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.protocol.records import (
    ENCRYPTED_FLAG,
    Codec,
    NewRecord,
    build_batch,
    check_batch,
    iter_batches,
    records_of,
)
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError
from tidelog.storage.compaction import compact_segment_files
from tidelog.storage.encryption import (
    SEAL_OVERHEAD,
    Keyring,
    open_batch,
    open_batches,
    seal_batch,
    seal_batches,
)
from tidelog.storage.errors import KeyUnavailableError

SECRET = b"the-secret-value-0123456789"
NOW = 1_700_000_000 * 1_000_000_000


def keyring(count: int = 1) -> Keyring:
    return Keyring([os.urandom(32) for _ in range(count)], "s/0")


def batch(*values: bytes, key: bytes | None = None, codec: Codec = Codec.NONE, base: int = 0) -> bytes:
    records = [NewRecord(value=v, key=key, timestamp=NOW) for v in values]
    return build_batch(records, timestamp=NOW, codec=codec, base_offset=base)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD, Codec.LZ4])
def test_a_sealed_batch_hides_its_records_and_opens_to_the_original(codec: Codec) -> None:
    ring = keyring()
    plain = batch(SECRET, SECRET + b"!", key=b"the-key", codec=codec)
    sealed = seal_batches(plain, ring)
    header = check_batch(sealed)  # a sealed batch passes the CRC check every replica runs
    assert header.attributes & ENCRYPTED_FLAG
    assert len(sealed) == len(plain) + SEAL_OVERHEAD
    assert SECRET not in sealed and b"the-key" not in sealed
    assert open_batches(sealed, ring) == plain


def test_records_of_a_sealed_batch_are_refused_by_every_decoder() -> None:
    sealed = seal_batches(batch(SECRET), keyring())
    with pytest.raises(CorruptBatchError, match="encrypted"):
        list(records_of(sealed))


def test_several_batches_and_plain_ones_open_together() -> None:
    ring = keyring()
    first, second = batch(b"a", base=0), batch(b"b", base=1)
    mixed = seal_batches(first, ring) + second
    assert open_batches(mixed, ring) == first + second
    assert open_batches(second, ring) is second  # nothing sealed: no copy


def test_old_keys_open_old_batches_after_a_rotation() -> None:
    keys = [os.urandom(32)]
    sealed_old = seal_batches(batch(SECRET), Keyring(keys))
    rotated = Keyring([*keys, os.urandom(32)])
    sealed_new = seal_batches(batch(SECRET, base=1), rotated)
    assert sealed_old[61:65] != sealed_new[61:65]  # different key ids
    assert [r.value for r in records_of(open_batches(sealed_old + sealed_new, rotated))] == [SECRET, SECRET]


def test_a_wrong_key_or_no_key_opens_nothing() -> None:
    sealed = seal_batches(batch(SECRET), keyring())
    header = check_batch(sealed)
    with pytest.raises(KeyUnavailableError, match="do not open"):
        open_batch(sealed, 0, header, keyring())
    with pytest.raises(KeyUnavailableError, match="no key"):
        open_batch(sealed, 0, header, None)


def test_the_seal_binds_the_header() -> None:
    ring = keyring()
    sealed = bytearray(seal_batches(batch(SECRET), ring))
    sealed[30] ^= 1  # inside first_timestamp: covered as associated data
    with pytest.raises(KeyUnavailableError):
        open_batch(sealed, 0, next(h for _, h in iter_batches(sealed, verify=False)), ring)


def test_a_client_batch_marked_encrypted_is_not_sealed_again() -> None:
    ring = keyring()
    sealed = seal_batches(batch(SECRET), ring)
    with pytest.raises(InvalidBatchError):
        seal_batch(sealed, 0, check_batch(sealed), ring)


def test_compaction_of_sealed_segments_keeps_them_sealed(tmp_path: Path) -> None:
    ring = keyring(2)
    path = tmp_path / f"{0:020d}.log"
    batches = [seal_batches(batch(SECRET + b"%d" % i, key=b"the-record-key", base=i), ring) for i in range(5)]
    path.write_bytes(b"".join(batches))
    result = compact_segment_files([path], upto_offset=5, now_ns=NOW, delete_retention_ns=0, keyring=ring)
    assert result.records_removed == 4
    data = path.read_bytes()
    assert SECRET not in data and b"the-record-key" not in data
    header = check_batch(data)
    assert header.attributes & ENCRYPTED_FLAG
    assert [r.value for r in records_of(open_batches(data, ring))] == [SECRET + b"4"]


def test_compaction_without_the_key_refuses_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / f"{0:020d}.log"
    ring = keyring()
    original = b"".join(seal_batches(batch(b"v%d" % i, key=b"k", base=i), ring) for i in range(3))
    path.write_bytes(original)
    with pytest.raises(KeyUnavailableError):
        compact_segment_files([path], upto_offset=3, now_ns=NOW, delete_retention_ns=0)
    assert path.read_bytes() == original

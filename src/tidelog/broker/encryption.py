"""Encryption keys: the broker's master key, the partitions' data keys it wraps, and each log's keyring.

Two levels, as envelope encryption goes:

- The **master key** (``encryption_key``: 32 bytes, base64; or ``encryption_key_file``, a file holding the same
  text; or ``TIDELOG_ENCRYPTION_KEY``) never leaves the broker's memory and is never stored by tidelog. Every
  broker of a cluster that may lead or compact an encrypted partition needs the same one.
- **Data keys**: 32 random bytes per partition, made when the stream is created and on each ``tidelog stream
  rotate-key``. They seal the batches (:mod:`tidelog.storage.encryption`). Each is stored in the partition's
  etcd record (:attr:`~tidelog.metadata.records.PartitionRecord.data_keys`, so every replica finds it), wrapped:
  AES-256-GCM under the master key, with the partition's name and the key's id as associated data, so a wrapped
  key copied to another partition does not open. The newest key seals new batches; older ones stay to open the
  batches they sealed.

A broker without the master key (or with another one) holds no keyring for the partition: it replicates the
sealed bytes as a follower (no key needed to copy them), but as a leader it refuses writes and reads with
ENCRYPTION, and its cleaner does not compact the partition. Nothing is lost or rewritten: a broker with the key
serves it all.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.errors import EncryptionError
from tidelog.storage.encryption import Keyring

log = logging.getLogger(__name__)

KEY_BYTES = 32
_NONCE = 12


class MasterKeyError(ValueError):
    """The configured master key cannot be used: said in one line that never repeats the key itself."""


def decode_master_key(text: str, where: str) -> bytes:
    """The 32 bytes of a base64 master key given in ``where`` (a setting or a file)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MasterKeyError(
            f"{where} is not base64; give 32 random bytes base64-encoded (openssl rand -base64 32)"
        ) from None
    if len(key) != KEY_BYTES:
        raise MasterKeyError(
            f"{where} decodes to {len(key)} bytes; AES-256 needs {KEY_BYTES} (openssl rand -base64 32)"
        )
    return key


def load_master_key(key: str | None, key_file: Path | None) -> bytes | None:
    """The master key from ``encryption_key`` or ``encryption_key_file`` (not both); None when neither is set."""
    if key and key_file is not None:
        raise MasterKeyError("set encryption_key or encryption_key_file, not both")
    if key:
        return decode_master_key(key, "encryption_key")
    if key_file is not None:
        try:
            text = key_file.read_text()
        except OSError as exc:
            raise MasterKeyError(f"cannot read encryption_key_file {key_file}: {exc.strerror or exc}") from None
        return decode_master_key(text, f"encryption_key_file {key_file}")
    return None


def _label(stream: str, partition: int, key_id: int) -> bytes:
    return f"tidelog data key {stream}/{partition}/{key_id}".encode()


class KeyVault:
    """The broker's master key: makes wrapped data keys and turns a partition's wrapped keys into a keyring."""

    def __init__(self, master: bytes | None) -> None:
        self._master = None if master is None else AESGCM(master)
        self._rings: dict[tuple[str, int], tuple[tuple[bytes, ...], Keyring | None]] = {}

    @property
    def has_master_key(self) -> bool:
        return self._master is not None

    def new_data_key(self, stream: str, partition: int, key_id: int) -> bytes:
        """A fresh data key for ``stream/partition``, wrapped, to be stored as key ``key_id``."""
        if self._master is None:
            raise EncryptionError(
                f"stream {stream!r} is encrypted and this broker has no master key: set encryption_key (or "
                "encryption_key_file, or TIDELOG_ENCRYPTION_KEY) on every broker"
            )
        nonce = os.urandom(_NONCE)
        return nonce + self._master.encrypt(nonce, os.urandom(KEY_BYTES), _label(stream, partition, key_id))

    def first_keys(self, stream: str, partition: int) -> tuple[bytes, ...]:
        return (self.new_data_key(stream, partition, 0),)

    def keyring(self, record: PartitionRecord) -> Keyring | None:
        """The keyring of ``record``'s partition; None when it has no data keys or this broker cannot unwrap
        them (logged once per change of its keys)."""
        if not record.data_keys:
            return None
        key = (record.stream, record.id)
        cached = self._rings.get(key)
        if cached is not None and cached[0] == record.data_keys:
            return cached[1]
        ring = self._unwrap(record)
        self._rings[key] = (record.data_keys, ring)
        return ring

    def forget(self, stream: str, partition: int) -> None:
        self._rings.pop((stream, partition), None)

    def _unwrap(self, record: PartitionRecord) -> Keyring | None:
        name = f"{record.stream}/{record.id}"
        if self._master is None:
            log.warning("%s is encrypted and this broker has no master key (encryption_key): it cannot serve it", name)
            return None
        keys = []
        for key_id, wrapped in enumerate(record.data_keys):
            try:
                keys.append(
                    self._master.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _label(record.stream, record.id, key_id))
                )
            except (InvalidTag, ValueError):
                log.error(
                    "%s: data key %d does not unwrap with this broker's master key (another encryption_key wrapped "
                    "it): the partition cannot be served here",
                    name,
                    key_id,
                )
                return None
        return Keyring(keys, name)

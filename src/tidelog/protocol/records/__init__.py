"""The record batch format, in one place: every module of tidelog that reads or writes records imports it from here.

Read in this order:

- :mod:`~tidelog.protocol.records.layout` — the batch and record byte layout, drawn, with its constants (header
  struct, attributes, codecs) and the record types;
- :mod:`~tidelog.protocol.records.varint` — the zig-zag varints records are framed with;
- :mod:`~tidelog.protocol.records.encode` — the canonical encoder: the producer's :class:`BatchBuilder`, whole
  batches, header packing and CRC, compaction's re-encoding, the leader's in-place offset assignment;
- :mod:`~tidelog.protocol.records.ingest` — the same format as the NATS ingest writes it (records stamped one ns
  apart, from precomputed tables; batches framed afterwards in one buffer);
- :mod:`~tidelog.protocol.records.decode` — the canonical decoder: header parse and checks, CRC, iterating
  batches, the registers block, bounded decompression, :func:`decode_records`, the reference for every other
  decoder;
- :mod:`~tidelog.protocol.records.runs` and :mod:`~tidelog.protocol.records.lanes` — the one run machinery the
  fast decoders share: a run of records laid out alike is cut into byte columns, checked column by column, and its
  varints decoded in the lanes of one big int;
- the fast decoders built on it, each with its own output: :mod:`~tidelog.protocol.records.rows` (the consumer's
  rows), :mod:`~tidelog.protocol.records.check` (the produce-time validator's verdict); the Spark source's Arrow
  columns are built in :mod:`tidelog.spark.columns` (Arrow and Spark's schema stay out of this layer) from the same
  machinery.

``tests/protocol/records/test_agreement.py`` checks that every decoder agrees with the canonical one on every
record shape and codec.
"""

from tidelog.protocol.records.check import RUN_CHUNK, CheckedRecords, IrregularRecords, check_records
from tidelog.protocol.records.decode import (
    RecordBatch,
    check_batch,
    crc_ok,
    decode_records,
    iter_batches,
    parse_header,
    record_section,
    records_of,
    registers_block,
)
from tidelog.protocol.records.encode import (
    BatchBuilder,
    EncodedRecords,
    assign_offsets,
    build_batch,
    compress,
    frame,
    pack_header,
    rebuild_batch,
    registers_prefix,
)
from tidelog.protocol.records.layout import (
    ATTRIBUTES_POS,
    CODEC_MASK,
    CONTROL_FLAG,
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    DEFAULT_MAX_UNCOMPRESSED,
    ENCRYPTED_FLAG,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    INT32,
    INT64,
    LEADER_EPOCH_POS,
    LENGTH_FIELD_END,
    MAX_REGISTERS_BLOCK,
    MIN_RECORD_SIZE,
    PREFIX,
    REGISTERS_FLAG,
    REGISTERS_LENGTH,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Codec,
    NewRecord,
    Record,
)
from tidelog.protocol.records.varint import decode_varint, encode_varint

__all__ = [
    "ATTRIBUTES_POS",
    "CODEC_MASK",
    "CONTROL_FLAG",
    "CRC_FIELD",
    "CRC_POS",
    "CRC_START",
    "DEFAULT_MAX_UNCOMPRESSED",
    "ENCRYPTED_FLAG",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_SIZE",
    "INT32",
    "INT64",
    "LEADER_EPOCH_POS",
    "LENGTH_FIELD_END",
    "MAX_REGISTERS_BLOCK",
    "MIN_RECORD_SIZE",
    "PREFIX",
    "REGISTERS_FLAG",
    "REGISTERS_LENGTH",
    "RUN_CHUNK",
    "TRANSACTIONAL_FLAG",
    "BatchBuilder",
    "BatchHeader",
    "CheckedRecords",
    "Codec",
    "EncodedRecords",
    "IrregularRecords",
    "NewRecord",
    "Record",
    "RecordBatch",
    "assign_offsets",
    "build_batch",
    "check_batch",
    "check_records",
    "compress",
    "crc_ok",
    "decode_records",
    "decode_varint",
    "encode_varint",
    "frame",
    "iter_batches",
    "pack_header",
    "parse_header",
    "rebuild_batch",
    "record_section",
    "records_of",
    "registers_block",
    "registers_prefix",
]

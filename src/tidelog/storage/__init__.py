"""The partition commit log.

A partition is one directory of segments. Everything on disk is a sequence of *record batches*
(:mod:`tidelog.protocol.records`): a client batch is appended as it came, offsets are assigned by rewriting only the
batch header's base offset and leader epoch, and reads return whole batches. Python therefore does per-batch
work on the hot path, never per-record work.

Essential types:

- :class:`~tidelog.protocol.records.RecordBatch` — a view over one encoded batch; ``build_batch`` encodes records.
- :class:`~tidelog.storage.log.Log` — one partition: append, read, truncate, roll, retention, compaction.
- :class:`~tidelog.storage.config.LogConfig` — roll, flush, retention and compaction settings of a log.
- :class:`~tidelog.storage.checkpoint.HighWatermarkCheckpoint`, :class:`~tidelog.storage.epoch_cache.LeaderEpochCache`.

Opening a log runs :mod:`tidelog.storage.recovery`: a torn tail is cut (logged), damage with intact batches after
it is not (:mod:`tidelog.storage.recovery_damage`), derived files (indexes, the epoch cache) are rebuilt when damaged.

Errors are drawn in :mod:`tidelog.storage.errors`.
"""

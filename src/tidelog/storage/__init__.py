"""The partition commit log.

A partition is one directory of segments. Everything on disk is a sequence of *record batches*
(:mod:`tidelog.protocol.records`): a client batch is appended as it came, offsets are assigned by rewriting only the
batch header's base offset and leader epoch, and reads return whole batches. Python therefore does per-batch
work on the hot path, never per-record work.

Essential types:

- :class:`~tidelog.protocol.records.RecordBatch` — a view over one encoded batch; ``build_batch`` encodes records.
- :class:`~tidelog.storage.log.Log` — one partition: append, read, truncate, roll, retention, compaction. The one
  import path for it; its operations live in one module per concern (see below).
- :class:`~tidelog.storage.config.LogConfig` — roll, flush, retention and compaction settings of a log.
- :class:`~tidelog.storage.checkpoint.HighWatermarkCheckpoint`, :class:`~tidelog.storage.epoch_cache.LeaderEpochCache`.

Opening a log runs :mod:`tidelog.storage.recovery`: a torn tail is cut (logged), damage with intact batches after
it is not (:mod:`tidelog.storage.recovery_damage`), derived files (indexes, the epoch cache) are rebuilt when damaged.

The log, by concern. :mod:`~tidelog.storage.log` is the facade (open, close, flush); it is one class assembled
from :mod:`~tidelog.storage.log_state` (the shared fields and the lock), :mod:`~tidelog.storage.log_append`
(validation, placement, segment-splitting writes, preallocation use), :mod:`~tidelog.storage.log_sealing` (roll,
background seals, exclusive operations), :mod:`~tidelog.storage.log_read` (reads, lock-free) and
:mod:`~tidelog.storage.log_maintenance` (truncation, retention, compaction, repair, reset, install). The seams
follow the log's lock: appends write without awaiting, reads never take it, maintenance holds it across disk
work; sealing sits between them because a roll happens inside a write and every maintenance operation first
settles pending seals. The parts are mixins of one object, not objects of their own: they share every field, and
an append's path runs per batch. The helpers that were already modules stay beside them:
:mod:`~tidelog.storage.disk_full`, :mod:`~tidelog.storage.damage`, :mod:`~tidelog.storage.damage_repair`,
:mod:`~tidelog.storage.segment_install`, :mod:`~tidelog.storage.preallocation`, :mod:`~tidelog.storage.compaction`.

A log's segments: a :class:`~tidelog.storage.segment.Segment` is one ``.log`` file of whole batches with its
two indexes (:mod:`~tidelog.storage.index`), one object in three modules like the log:
:mod:`~tidelog.storage.segment_state` (what it knows of its file, rebuilt from the batches or loaded from the
index files when opened), :mod:`~tidelog.storage.segment_read` (finding and reading whole batches, each byte's
CRC checked once) and :mod:`~tidelog.storage.segment` (the file's lifecycle, appends, truncation). It writes
through :mod:`~tidelog.storage.file_writes` (byte parts at a position: buffers with ``pwritev``, a transactional
append's spool with ``copy_file_range``), walks its file by batch headers with
:mod:`~tidelog.storage.batch_scan`, and remembers which bytes it has checked in
:mod:`~tidelog.storage.byte_ranges`. Its file's descriptor is one of a bounded set per process
(:mod:`~tidelog.storage.open_files`): an idle segment's is closed and reopened by path when next used.

Hooks the owner of a log installs: a :class:`~tidelog.storage.write_observer.WriteObserver` hears of each write
with its bytes (the leader's replication side answers its followers from it), and the
:class:`~tidelog.storage.flush.FlushMode` chosen at open says where fsyncs run. Storage knows nothing of
replication.

Errors are drawn in :mod:`tidelog.storage.errors`.
"""

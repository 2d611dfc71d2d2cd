"""Transactional appends (Gazette's append, seed 002): records written all or nothing, at one contiguous range of
offsets, optionally only if the log ends at an expected offset and the partition's registers match a selector.

An append streams in chunks, then commits (``docs/design/transactional-appends.md``):

- :mod:`~tidelog.broker.appends.streamed` — an append being streamed, and those a connection has begun: flow
  control, limits, and an outcome decided once.
- :mod:`~tidelog.broker.appends.spool` — where its records wait meanwhile: memory, then an unnamed file.
- :mod:`~tidelog.broker.appends.commit` — the commit on the leader: the write turn, the expectations, the batch.
- :mod:`~tidelog.broker.appends.registers` — the leader's view of its partition's registers.

A commit writes through :meth:`tidelog.broker.partitions.partition.Partition.write`, the leader's write path, as
every producer does; like it, every outcome but success is a value (an
:class:`~tidelog.broker.appends.commit.AppendRefused`) that the protocol edges answer, not an exception.
"""

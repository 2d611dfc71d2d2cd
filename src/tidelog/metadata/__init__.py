"""Metadata: typed stream and partition records kept in etcd, the broker's local mirror of them, and the
controller that creates, places and fails over partitions.

- The data: :mod:`~tidelog.metadata.records` (the records and the keys they live under),
  :mod:`~tidelog.metadata.snapshot` (an immutable view at one revision), :mod:`~tidelog.metadata.mirror` (the
  broker's local copy, kept by a watch) and :mod:`~tidelog.metadata.store` (guarded writes any broker makes).
  :mod:`~tidelog.metadata.lease_session` keeps a broker's registration lease alive;
  :mod:`~tidelog.metadata.producer_ids` hands out idempotent-producer ids.
- The controller: :mod:`~tidelog.metadata.controller_election` elects it;
  :mod:`~tidelog.metadata.controller` runs its tasks (failover, balance) and answers brokers' requests. Its
  decisions are pure functions in :mod:`~tidelog.metadata.controller_plans`, :mod:`~tidelog.metadata.placement`
  and :mod:`~tidelog.metadata.suspension` (fail to safety); its writes go through
  :mod:`~tidelog.metadata.fenced_writer` (a deposed controller cannot write),
  :mod:`~tidelog.metadata.partition_writes` (a compare-and-swap per partition record) and
  :mod:`~tidelog.metadata.stream_creation` (a stream in several transactions, visible whole);
  :mod:`~tidelog.metadata.broker_probe` checks a broker reported unreachable and revokes its lease when nothing
  listens on its port.
"""

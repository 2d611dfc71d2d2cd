"""The partition runtime: every partition this broker holds a replica of, in its role.

- :mod:`~tidelog.broker.partitions.partition` — a partition this broker *leads*: its log, high watermark and
  ISR, writes and reads. Each write runs through the leader's write path,
  :mod:`~tidelog.broker.partitions.write_path` (admit, dedupe, place, durable, committed, answer), which returns
  routable refusals as status values for the protocol edges to answer.
- :mod:`~tidelog.broker.partitions.followed` — a partition this broker *follows*: its log, its fetcher
  (:mod:`tidelog.replication.follower.fetcher`) and reads for ``readISRReplica`` subscribers.
- :mod:`~tidelog.broker.partitions.committed_reads` — what a reader sees of either: committed batches only.
- :mod:`~tidelog.broker.partitions.safety` — fail to safety: a leader that finds evidence of lost records
  suspends appends until an operator confirms the head.
- :mod:`~tidelog.broker.partitions.damaged` and :mod:`~tidelog.broker.partitions.damage_repair` — logs that
  start-up recovery found damaged, who may cut them, and restoring damaged ranges from replicas.
- :mod:`~tidelog.broker.partitions.cleaner` — retention and compaction of every replica, in the background.

Replication's rules (high watermark, ISR tracking, the follower's fetch, idempotence) live below, in
:mod:`tidelog.replication`; this package holds them together with a log per partition.
"""

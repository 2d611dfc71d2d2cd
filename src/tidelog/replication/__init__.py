"""Replication: how a partition's replicas come to hold the same log, and what a replica derives from its log.

Three parts, one per role and one for the state both roles keep:

- :mod:`~tidelog.replication.leader` — the leader's side: how far each follower has copied and whether it keeps
  up (the ISR's evidence), the high watermark and the writes waiting for it, and polling the loop for the
  acknowledgements of a lone acks-ALL write.
- :mod:`~tidelog.replication.follower` — the follower's side: the fetcher that copies a leader's log
  (truncation by leader epoch, fetching, far-horizon catch-up from segment files) and the follower's high
  watermark that ISR-replica readers wait on.
- :mod:`~tidelog.replication.idempotence` — state a replica derives from the batches in its log, so that a
  retried or conditional write is answered the same after a failover: idempotent producers' sequences
  (KIP-98) and the registers of transactional appends. Both are kept in step with the log by whoever writes it
  (the leader's write path, the fetcher) and follow its truncations.

:mod:`~tidelog.replication.hw_checkpoint` is shared by both roles: the high watermark a replica persists, and
starts from after a restart or a role change.

The partition runtime that holds these together with a log per partition is :mod:`tidelog.broker.partitions`.
"""

"""State a replica derives from the batches in its log, so that a retried or conditional write is answered the
same by any leader, after any failover.

- :mod:`~tidelog.replication.idempotence.producer_state` — idempotent producers (KIP-98): which batches each
  producer already wrote, so a retry is answered as a duplicate instead of written twice.
- :mod:`~tidelog.replication.idempotence.producer_snapshot` — snapshots of that state, and rebuilding it from a
  snapshot and the log.
- :mod:`~tidelog.replication.idempotence.producer_sync` — keeping it in step with the log whatever changes the log
  (appends, truncation, installed segments).
- :mod:`~tidelog.replication.idempotence.register_history` — the registers of transactional appends as of each log
  end, and their checkpoint, so a truncated replica goes back to the registers of the data it kept.

They live together, apart from the roles, because both roles keep them: the leader's write path and the
follower's fetcher each record what they append, and a promotion hands the table to the new leader as is.
"""

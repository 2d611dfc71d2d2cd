"""The leader's side of replication, one partition at a time.

- :mod:`~tidelog.replication.leader.follower_progress` — each follower's acknowledged log end and last
  caught-up time: which followers lag and must leave the ISR.
- :mod:`~tidelog.replication.leader.highwater` — the high watermark (the ISR's minimum log end) and the
  acks-ALL writes waiting for it.
- :mod:`~tidelog.replication.leader.ack_poll` — polling the event loop for a moment after a lone acks-ALL
  write, so the followers' acknowledgements are read as soon as they arrive.

Fetches reach the leader through the wire protocol's replica handlers (:mod:`tidelog.api.wire.replica`), which
fence them to the leadership and hand their offsets to the partition
(:meth:`tidelog.broker.partitions.partition.Partition.replica_fetched`).
"""

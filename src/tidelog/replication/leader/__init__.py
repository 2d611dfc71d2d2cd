"""The leader's side of replication, one partition at a time.

- :mod:`~tidelog.replication.leader.fencing` — which requests a leadership answers: a follower of this leader
  epoch only (FENCED_LEADER_EPOCH, NOT_LEADER otherwise).
- :mod:`~tidelog.replication.leader.follower_progress` — each follower's acknowledged log end and last
  caught-up time, and the ISR decisions that follow from them: who lags and must leave the ISR, who may join it.
- :mod:`~tidelog.replication.leader.highwater` — the high watermark (the ISR's minimum log end) and the
  acks-ALL writes waiting for it.
- :mod:`~tidelog.replication.leader.ack_poll` — polling the event loop for a moment after a lone acks-ALL
  write, so the followers' acknowledgements are read as soon as they arrive.

Fetches reach the leader through the wire protocol's replica handlers (:mod:`tidelog.api.wire.replica`); the
partition this broker leads (:class:`tidelog.broker.partitions.partition.Partition`) applies these rules to
them (:meth:`~tidelog.broker.partitions.partition.Partition.fence_follower`,
:meth:`~tidelog.broker.partitions.partition.Partition.replica_fetched`) and asks the controller for the ISR
changes they decide.
"""

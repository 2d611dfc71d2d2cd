"""NATS ingest: a partition leader's subscription to its stream's subject, appending what arrives in batches.

- :mod:`~tidelog.broker.ingest.nats_ingest` — :class:`~tidelog.broker.ingest.nats_ingest.NatsIngest`, one per
  partition led: receive, encode, append, acknowledge (start here: its docstring follows a message through).
- :mod:`~tidelog.broker.ingest.nats_pool` — the few NATS connections a broker's ingests share (one subscription
  per partition led), and per-partition back-pressure that never pauses a shared socket.
- :mod:`~tidelog.broker.ingest.nats_reader`, :mod:`~tidelog.broker.ingest.nats_connection` and
  :mod:`~tidelog.broker.ingest.natsproto` — tidelog's own NATS subscriber: one connection carrying many
  subscriptions, and a parser of the NATS client protocol that sorts each socket read by subscription in one pass.
- :mod:`~tidelog.broker.ingest.nats_client` — nats-py, the way in for URLs the reader does not speak.
- :mod:`~tidelog.broker.ingest.encoder` — a read's messages turned into record batches in one buffer.
- :mod:`~tidelog.broker.ingest.msg_id_window` — ``Nats-Msg-Id`` deduplication.
- :mod:`~tidelog.broker.ingest.runs` — the ingests of every partition led here: started, retried until they
  subscribe, stopped (for the partition manager).

Ingest writes through :meth:`tidelog.broker.partitions.partition.Partition.write`, as every producer does.
"""

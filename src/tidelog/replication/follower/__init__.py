"""The follower's side of replication: copying a leader's log, one fetcher per followed partition, one fetch session
per leader broker.

- :mod:`~tidelog.replication.follower.fetcher` — :class:`~tidelog.replication.follower.fetcher.ReplicaFetcher`,
  the fetcher's state machine (connecting, truncating, fetching, copying, backing off): start here.
- :mod:`~tidelog.replication.follower.session` — :class:`~tidelog.replication.follower.session.FetchSession`: every
  partition followed from one leader broker fetched over one connection by one task (SESSION_FETCH).
- :mod:`~tidelog.replication.follower.session_member` — a fetcher's side of a session: joining it, and appending
  the answers it hands over with the fetcher's own per-partition logic.
- :mod:`~tidelog.replication.follower.fetcher_state` — the fetcher's states and status.
- :mod:`~tidelog.replication.follower.local_replica` — the follower's own copy as the fetcher changes it: cuts,
  the producer state and the follower's high watermark.
- :mod:`~tidelog.replication.follower.leader_link` — a connection to the leader.
- :mod:`~tidelog.replication.follower.truncation` — where a follower cuts its log before copying (KIP-101/279),
  a pure decision.
- :mod:`~tidelog.replication.follower.catch_up` — far-horizon catch-up: copying the leader's sealed segment files.
- :mod:`~tidelog.replication.follower.offset_waiters` — readers waiting for the follower's high watermark.
"""

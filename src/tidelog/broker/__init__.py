"""The broker's runtime, composed by :mod:`tidelog.server` with the API above it.

Read the sub-packages bottom up; each imports only those listed before it (an ``import-linter`` contract) and
the leaf modules of the top (:mod:`~tidelog.broker.peers`, :mod:`~tidelog.broker.translate`):

- :mod:`~tidelog.broker.partitions` — the partition runtime: a partition this broker leads
  (:class:`~tidelog.broker.partitions.partition.Partition`, each write run through the state machine of
  :mod:`~tidelog.broker.partitions.write_path`), one it follows, the reads both serve, fail to safety, damaged
  logs and their repair, and the log cleaner.
- :mod:`~tidelog.broker.ingest` — NATS ingest: a leader's own subscription to its subject, appending what arrives.
- :mod:`~tidelog.broker.appends` — transactional appends: streamed in chunks, committed under expectations and
  registers.

Here, at the top, the process-level pieces: the partition manager (:mod:`~tidelog.broker.manager`, which makes
leaders, followers and ingests match the metadata, so it sits above all three sub-packages), the broker's context
shared by the request handlers, configuration (:mod:`~tidelog.broker.config`, its value kinds and errors in
:mod:`~tidelog.broker.config_values`, its layers and the broker id file in :mod:`~tidelog.broker.config_loading`,
its cross-field checks in :mod:`~tidelog.broker.config_checks`) and its documentation, the links to the
controller and to peer brokers, stream administration, RESET_HEAD, the embedded NATS and etcd of ``tidelog serve``
(:mod:`~tidelog.broker.embedded`), how the broker's own links (to peers, NATS and etcd) are secured
(:mod:`~tidelog.broker.secure_links`) and the one translation of lower layers' exceptions into domain errors
(:mod:`~tidelog.broker.translate`).
"""

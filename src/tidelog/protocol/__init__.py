"""The bottom layer: what every side of tidelog shares to talk to another, and nothing that runs a broker.

It imports nothing of tidelog outside itself, so the client, the broker and its broker-to-broker links all
stand on it. It holds:

- :mod:`~tidelog.protocol.errors` — the error codes and the one error table (:class:`ErrorCode`,
  :data:`~tidelog.protocol.errors.SPECS`: wire number, gRPC status, Liftbridge codes, retriability) and the
  :class:`TidelogError` tree, one class per code; :func:`~tidelog.protocol.errors.from_error_body` turns a
  peer's ``ErrorBody`` back into one. A broker translates its storage exceptions in
  :mod:`tidelog.broker.translate`; this layer knows only its own and generic ones.
- :mod:`~tidelog.protocol.frames` — the wire protocol's frames: the 16-byte prefix, ``encode_frame`` and the
  incremental ``FrameDecoder``. :mod:`~tidelog.protocol.messages` — one msgspec ``Struct`` per op and direction
  for what clients send (and ``Acks``); :mod:`~tidelog.protocol.peer_messages` — the headers brokers send each
  other (control, replica fetches, segment catch-up); :mod:`~tidelog.protocol.message_codec` — the table from
  ``(kind, op)`` to header type and the encoding and decoding of headers.
- :mod:`~tidelog.protocol.connection` — the wire :class:`~tidelog.protocol.connection.Connection`: one TCP
  (optionally TLS) stream with pipelined requests matched by correlation id. The client uses it, and so do
  brokers for their links to each other (replica fetches, peers, the controller link).
- :mod:`~tidelog.protocol.tls` — TLS contexts from PEM files for both sides (what a client and a listener check),
  and TLS failures said in one line.
- :mod:`tidelog.protocol.records` — the record batch format: its layout, the canonical encoder and decoder, the
  varints, the column machinery the fast decoders share (runs of same-shaped records), and those decoders.
- :mod:`~tidelog.protocol.labels` — :class:`~tidelog.protocol.labels.LabelSet` and
  :class:`~tidelog.protocol.labels.LabelSelector`, the partition registers' data model with Gazette's set
  algebra (match, union, subtract) and their encoding; where registers are remembered is replication's concern.
- The Liftbridge side: the ``.proto`` definitions under ``proto/`` and their generated modules in ``_gen/``
  (regenerate with ``python -m tidelog.protocol.gen_proto``), the message envelope
  (:mod:`~tidelog.protocol.envelope`), NATS subject rules (:mod:`~tidelog.protocol.subjects`) and the mapping
  of Liftbridge messages to records and acks (:mod:`~tidelog.protocol.liftbridge`), shared by the gRPC API and
  the broker's NATS ingest.

The small shared utilities :mod:`tidelog.clock` (the injectable clock), :mod:`tidelog.deadline` and the process
launcher :mod:`tidelog.launch` sit at this level too, as independent siblings (import-linter's layers contract
in ``pyproject.toml`` says so and checks it). ``tidelog.ui`` is not a bottom utility: it is empty for now, and
when the observability work fills it, it belongs beside :mod:`tidelog.api` (it serves the broker's HTTP port).
"""

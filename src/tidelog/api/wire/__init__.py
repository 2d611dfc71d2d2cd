"""The tidelog wire protocol: length-prefixed frames on asyncio TCP streams (optionally TLS).

It is the fast path. Produce, fetch, metadata and stream administration from the tidelog client, and later
transactional appends and broker-to-broker replication, all travel as frames: a fixed 16-byte prefix, a small
msgspec-msgpack header, and a raw payload that carries record batches exactly as the storage engine writes and
serves them (never re-encoded, never copied into the frame). Requests carry a correlation id, so a connection
pipelines many requests and matches responses as they come back.

Two layers, each a pure codec with no I/O loop of its own (the nats.py style):

- :mod:`tidelog.api.wire.frames` — the frame layout, ``encode_frame`` (a list of buffers for ``writelines``), the
  incremental ``FrameDecoder`` that enforces ``max_frame_bytes`` before buffering, and ``read_frame`` for an
  ``asyncio.StreamReader``. It knows kinds and op numbers but nothing about what a header means.
- :mod:`tidelog.api.wire.messages` — one frozen msgspec ``Struct`` per op and direction (``ProduceRequest``,
  ``FetchResponse``, ``ErrorBody``…), the table from ``(kind, op)`` to header type, and ``encode_message`` /
  ``decode_header``.

Errors: a frame that breaks the framing raises ``FrameError`` (the byte stream is lost: close the connection);
a well-framed frame whose header does not decode raises ``ProtocolError`` (answer it with an error frame and
carry on). Domain failures travel inside frames as ``ErrorBody`` and become ``TidelogError`` again through
:mod:`tidelog.api.errors`.
"""

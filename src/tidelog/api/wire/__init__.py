"""The tidelog wire protocol: length-prefixed frames on asyncio TCP streams (optionally TLS).

It is the fast path. Produce, fetch, metadata and stream administration from the tidelog client, and later
transactional appends and broker-to-broker replication, all travel as frames: a fixed 16-byte prefix, a small
msgspec-msgpack header, and a raw payload that carries record batches exactly as the storage engine writes and
serves them (never re-encoded, never copied into the frame). Requests carry a correlation id, so a connection
pipelines many requests and matches responses as they come back.

The codecs are :mod:`tidelog.protocol`'s (frames, messages, errors); this package is the broker's side: the
server and its sessions, the handlers of each op, and the admission and zero-copy sending they use. Frames that
break the framing close the connection; a header that does not decode is answered with an error frame.
"""

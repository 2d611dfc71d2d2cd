"""The idempotent producer's part of a batch header, and the limits the client and the broker both keep.

A producer's batches carry its id, its epoch and the sequence of their first record (Kafka's idempotence). The
broker remembers the last :data:`WINDOW` batches of each producer to answer a retry with its original offsets;
the client keeps at most that many batches in flight, so a retry always finds its batch remembered.
"""

from __future__ import annotations

NO_PRODUCER_ID = -1
"""The producer id of a batch from no idempotent producer."""
MAX_SEQUENCE = 2**31 - 1
"""The largest sequence (int32); the sequence after it is 0."""
MAX_PRODUCER_EPOCH = 2**15 - 1
"""The largest producer epoch (the header's int16 field)."""
WINDOW = 5
"""Batches remembered per producer (Kafka's NUM_BATCHES_TO_RETAIN), and the client's most in flight."""

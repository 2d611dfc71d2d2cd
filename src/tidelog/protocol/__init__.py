"""The bottom layer: what a tidelog broker and its clients agree on, byte for byte, and nothing that runs.

:mod:`tidelog.protocol.records` holds the record batch format (its layout, the canonical encoder and decoder, the
varints, the column machinery the fast decoders share, and those decoders); the other modules of this package hold
the wire protocol's pieces. Every other package may import this one; it imports no other part of tidelog.
"""

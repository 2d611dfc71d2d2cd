"""Metadata: typed stream and partition records kept in etcd, the broker's local mirror of them, and the
controller that creates, places and fails over partitions."""

"""The broker process: composition root, partition manager, NATS ingest, configuration and the embedded
NATS and etcd servers of ``tidelog serve``."""

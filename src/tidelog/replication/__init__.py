"""Replication: leader-side ISR and high-watermark tracking with ack waiters, and the follower fetcher."""

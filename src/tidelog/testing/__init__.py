"""Harnesses importable by tests: fakes, fault scenarios on a local cluster (:mod:`tidelog.local`), history checking.

Stand-ins for a broker's parts, for tests that run one real piece against fakes of the rest:
:mod:`~tidelog.testing.fakes` (a partition manager that leads what it is given, a NATS client that delivers on
demand), :mod:`~tidelog.testing.fake_broker` (an in-memory broker for producer tests) and
:mod:`~tidelog.testing.replica_leader` (a real partition leader on a real wire server, for follower tests).
Fault tools: :mod:`~tidelog.testing.faults` (fault scenarios on a real 3-broker cluster, each run inside a
:mod:`~tidelog.testing.fault_run` ``FaultRun`` that loads, settles and checks it) and
:mod:`~tidelog.testing.cas_faults` (compare-and-set appends under faults, checked for linearizability).
The nemesis (:mod:`~tidelog.testing.nemesis`: seeded plans of faults, one at a time, checked by
:mod:`~tidelog.testing.nemesis_check`) draws on the broker faults there and on
:mod:`~tidelog.testing.dependency_faults` (etcd members, NATS), :mod:`~tidelog.testing.lossy_faults` (power
cuts and I/O errors on the FUSE disk of :mod:`~tidelog.testing.lossy_fs` / :mod:`~tidelog.testing.lossy_disk`)
and :mod:`~tidelog.testing.clock_faults` (wall-clock jumps through :mod:`~tidelog.testing.clock_skew`).
History checking: :mod:`~tidelog.testing.history` (a fault run's acks, reads and replicas against the
replication guarantees) and :mod:`~tidelog.testing.queue_checker` (the same kind of history counted in Jepsen's
queue-anomaly vocabulary: lost-write, unseen, inconsistent-offsets, duplicate, nonmonotonic send and poll,
poll-skip, lost-on-node, HW regression).
Fuzzing: :mod:`~tidelog.testing.fuzz_contract` (what a decoder of untrusted bytes may do: one typed error,
bounded memory) and :mod:`~tidelog.testing.fuzz_targets` (every such decoder as a target, with seeds; the
on-disk ones in :mod:`~tidelog.testing.fuzz_disk_targets`), shared by the Hypothesis tests, the corpus replay
and the atheris scripts in ``fuzz/``.
Only tests, benchmarks and the fault tools import this package.
"""

"""Launching child processes that never outlive their parent: the embedded NATS and etcd of ``tidelog serve``,
and every process the test harness and benchmarks start.

- :mod:`~tidelog.launch.process` — :class:`~tidelog.launch.process.ManagedProcess`: start a command, wait on a
  readiness probe (never a fixed sleep), stop it by its PID; the kernel SIGKILLs it if its parent dies
  (``PR_SET_PDEATHSIG``, armed in the child before it runs the command, so no child is reported started
  without it).
- :mod:`~tidelog.launch.probes` — readiness probes (a TCP connect, an HTTP health answer, all of several).
- :mod:`~tidelog.launch.ports` — free loopback ports, chosen up front.

It imports nothing of tidelog: it sits at the bottom beside :mod:`tidelog.protocol`, so the broker
(:mod:`tidelog.broker.embedded`) and :mod:`tidelog.testing` both use it.
"""

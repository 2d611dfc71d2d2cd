"""Consumer groups, as Liftbridge has them: members, a coordinator per group, balanced assignments, epochs.

A group's state is one record in etcd (:mod:`tidelog.metadata.group_records`), mirrored by every broker
(:mod:`tidelog.metadata.group_mirror`). The parts, one concept each:

- :mod:`~tidelog.broker.groups.assignment`: which member consumes which partition (pure, sticky, balanced);
- :mod:`~tidelog.broker.groups.decisions`: what each change (join, leave, failover, a broker or stream gone) makes
  of a group's record, and the refusals (pure);
- :mod:`~tidelog.broker.groups.membership`: the controller writing those changes to etcd, fenced, and failing
  coordinators over (reported by a majority of members, or their broker gone);
- :mod:`~tidelog.broker.groups.coordinator`: the coordinator answering heartbeats with assignments and removing
  members that stop heartbeating;
- :mod:`~tidelog.broker.groups.fencing`: a member's commits and reads act on a partition only while it owns the
  partition at the group's current epoch;
- :mod:`~tidelog.broker.groups.service`: the one entry point of the gRPC and wire handlers (input checks,
  forwarding to the controller, the ``Subscribe`` check).

Committed offsets are not kept here: they are cursors (``SetCursor``/``FetchCursor``, the ``__cursors`` stream),
whose writes by group members are fenced by :mod:`~tidelog.broker.groups.fencing`.
"""

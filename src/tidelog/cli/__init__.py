"""The ``tidelog`` command line, one module per command or concern.

- :mod:`~tidelog.cli.main`: the ``tidelog`` group, ``--debug``, and the one-line error every failure ends in;
- :mod:`~tidelog.cli.common`: what client commands share (broker addresses checked at the edge, running a
  command's coroutine, errors named by their code); :mod:`~tidelog.cli.render`: tables that fit 80 columns and
  ``--output json``;
- the commands: :mod:`~tidelog.cli.streams`, :mod:`~tidelog.cli.publish`, :mod:`~tidelog.cli.subscribe`,
  :mod:`~tidelog.cli.append`, :mod:`~tidelog.cli.partition`, :mod:`~tidelog.cli.groups` and
  :mod:`~tidelog.cli.group_reset` (``group``), :mod:`~tidelog.cli.cluster` (``cluster status``, ``dev-cluster``)
  and :mod:`~tidelog.cli.serve`;
- :mod:`~tidelog.cli.reference`: ``docs/cli.md``, generated from the commands.
"""

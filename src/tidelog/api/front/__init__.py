"""API front processes (``api_front_processes``): child processes that serve the Liftbridge gRPC API for a broker.

Each front listens on the broker's gRPC port beside the others (SO_REUSEPORT: the kernel spreads connections over
them), so the per-message gRPC work of ``PublishAsync`` runs on as many cores as there are fronts. A front
batches ``PublishAsync`` into wire protocol produces sent straight to each partition's leader
(:mod:`~tidelog.api.front.publish`) and hands every other call, ``Subscribe`` included, to the broker's own gRPC
service on a loopback port, bytes unparsed, status and details as the broker answered them
(:mod:`~tidelog.api.front.relay`). Its NATS copies of published messages go out on a publishing connection of its
own (:mod:`~tidelog.api.front.nats_copies`). The process itself is :mod:`~tidelog.api.front.process`; the broker
starts, restarts and stops its fronts with :mod:`~tidelog.api.front.supervisor`."""

# A tidelog broker image. Not built by the test suite (its machine has no container engine); docs/deployment.md
# describes the layout it is for, and compose.yaml runs three of it with an etcd and a NATS cluster.
#
#   docker build -t tidelog .
#   docker run --rm -v tidelog-data:/var/lib/tidelog -p 9292:9292 -p 9293:9293 tidelog
#
# Without TIDELOG_NATS_SERVERS and TIDELOG_ETCD_ENDPOINTS the broker runs its own embedded nats-server and etcd;
# this image carries nats-server (a Python dependency) but not etcd, so give it external etcd endpoints.

# ---- build: install tidelog and its pinned dependencies into a virtual environment ----
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m venv /opt/tidelog && /opt/tidelog/bin/pip install .

# ---- runtime: the same Python, the virtual environment, a non-root user and a data volume ----
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="tidelog" \
      org.opencontainers.image.description="A durable, replicated log for NATS" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tidelog \
    && useradd --system --uid 10001 --gid tidelog --home-dir /var/lib/tidelog --shell /usr/sbin/nologin tidelog \
    && mkdir -p /var/lib/tidelog \
    && chown tidelog:tidelog /var/lib/tidelog
COPY --from=build /opt/tidelog /opt/tidelog
ENV PATH=/opt/tidelog/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TIDELOG_HOST=0.0.0.0 \
    TIDELOG_DATA_DIR=/var/lib/tidelog
USER tidelog:tidelog
WORKDIR /var/lib/tidelog
VOLUME ["/var/lib/tidelog"]
# 9292: Liftbridge gRPC API and the gRPC health service; 9293: the tidelog wire protocol.
EXPOSE 9292 9293
# The broker has no HTTP health endpoint (no /readyz): the check asks its standard gRPC health service whether
# proto.API is SERVING (it reports NOT_SERVING once a shutdown has handed its leaderships off).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; port = os.environ.get('TIDELOG_PORT', '9292'); channel = grpc.insecure_channel(f'127.0.0.1:{port}'); answer = g.HealthStub(channel).Check(h.HealthCheckRequest(service='proto.API'), timeout=4); sys.exit(answer.status != h.HealthCheckResponse.SERVING)"]
# SIGTERM starts a controlled shutdown bounded by shutdown_timeout_ms (15 s by default): give `docker stop` more
# (`--time 45`, or stop_grace_period in compose.yaml).
STOPSIGNAL SIGTERM
ENTRYPOINT ["tidelog"]
CMD ["serve"]

# fleetrl in one image: every role, `fleetrl fleet render --k8s` manifests run it. Built from
# the README's set-up (scripts/setup.sh): Debian's redis-server and python3-venv, then every
# Python dependency in ONE pip command (torch, mujoco and gymnasium-robotics must resolve together
# or mujoco ends up broken). Not built or run by the tests: nothing here reaches a registry.
#   docker build -t fleetrl:latest .
FROM debian:bookworm-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip redis-server util-linux ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/fleetrl
COPY pyproject.toml README.md ./
COPY foundation foundation
COPY sim sim
COPY buffer buffer
COPY learner learner
COPY aggregator aggregator
COPY sampler sampler
COPY deploy_npu deploy_npu
COPY fleet fleet

RUN python3 -m venv /opt/fleetrl/.venv \
 && /opt/fleetrl/.venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check . \
 && useradd --create-home --uid 10001 fleetrl \
 && mkdir -p /run/fleetrl && chown fleetrl /run/fleetrl

# One process per role is the parallelism (fleet/launch/spec.py): no BLAS/OpenMP pools per role.
ENV PATH=/opt/fleetrl/.venv/bin:$PATH \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
    PYTHONUNBUFFERED=1
USER fleetrl
# redis-server's cluster bus is the client port + 10000; the services' ports come from the spec.
EXPOSE 6379 16379
ENTRYPOINT []
CMD ["fleetrl", "--help"]

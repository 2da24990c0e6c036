# nodeagent's image: `docker build .` (with network), or `make image` (offline, with buildah; see
# image/build.sh). Two stages on one base: `build` turns the source into wheels and installs them
# into a virtual environment at /opt/nodeagent; the runtime stage copies only that venv, so no
# pip, compiler, wheel or source tree ships. Both stages must use the same BASE (the venv's
# python is a link to the base's python3).
#
# BASE: any Debian-style image with python3 >= 3.10 and its venv module, e.g. the official
# python slim image (pin it by digest: --build-arg BASE=python:3.12-slim-bookworm@sha256:...) or
# the Debian bookworm base `make image` builds with mmdebstrap (python3 3.11 from Debian).
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS build
# Offline builds put every wheel in image/wheelhouse/ and pass --build-arg PIP_NO_INDEX=true
# (pip reads PIP_* variables); online, pip fetches what the wheelhouse lacks from PyPI.
ARG PIP_NO_INDEX=false
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_FIND_LINKS=/wheelhouse
RUN python3 -m venv /build
COPY image/wheelhouse/ /wheelhouse/
COPY pyproject.toml README.md /src/
COPY nodeagent/ /src/nodeagent/
COPY image/slim.py /src/image/slim.py
# The nodeagent wheel and the wheels of its runtime dependencies, then the venv from those only.
# The venv gets no pip (--without-pip) and no bytecode yet (--no-compile): image/slim.py drops
# what nodeagent never loads (the Kubernetes client's asyncio half and aiohttp, which `pip check`
# would now miss, on purpose, and its typed API classes), then compiles bytecode for the modules
# nodeagent imports, and fails the build when one of them does not import.
RUN /build/bin/pip wheel --wheel-dir /wheels /src \
    && python3 -m venv --without-pip /opt/nodeagent \
    && /build/bin/pip --python /opt/nodeagent/bin/python install \
       --no-index --find-links /wheels --no-compile nodeagent \
    && /opt/nodeagent/bin/python /src/image/slim.py --pip /build/bin/pip

FROM ${BASE}
ARG BASE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="nodeagent" \
      org.opencontainers.image.description="GPU node agent: MIG geometry, MPS, node labels and Prometheus metrics for shared GPUs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE}"
# The NVIDIA container toolkit injects the host driver's user-space part into the container:
# `utility` brings libnvidia-ml and nvidia-smi (NVML: every read, MIG writes), `compute` brings
# nvidia-cuda-mps-control and nvidia-cuda-mps-server (the MPS daemon).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/opt/nodeagent/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root by default: reading GPUs (status, labels, metrics, `run` without MIG or MPS) needs only
# the /dev/nvidia* device files. Root is needed for MIG mode changes and GPU/compute instance
# create/destroy (NVML refuses them to other users), GPU resets, compute-mode changes, starting
# the MPS control daemon (it serves every user's clients), the node-wide MIG writer lock in
# /run/nodeagent and the kubelet's pod-resources socket (root's): the DaemonSet runs as root
# (runAsUser: 0), as does `docker run --user 0`.
# 65532 as distroless's "nonroot"; -K lifts useradd's ceiling for system uids (999).
RUN groupadd --system --gid 65532 nodeagent \
    && useradd --system --no-log-init --uid 65532 --gid 65532 -K SYS_UID_MAX=65532 \
       --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nodeagent
COPY --from=build /opt/nodeagent /opt/nodeagent
USER 65532:65532
EXPOSE 9401
ENTRYPOINT ["nodeagent"]
CMD ["run"]

# One image for every lbc service; the container's command picks the service:
#   python -m learner_svc | replay_svc | bandit_svc | actor_svc,  lbc autoscale,  lbc health ADDR
# Built by `make image` from a wheelhouse of the exact pinned versions (build/image/wheelhouse),
# so the build itself needs no network. VARIANT=gpu puts PyPI's CUDA build of torch in the
# wheelhouse instead of the CPU one (for the learner on the gpu overlay).
ARG BASE=localhost/debian-python:bookworm

FROM ${BASE} AS build
COPY wheelhouse/ /wheelhouse/
RUN python3 -m venv /opt/lbc \
 && /opt/lbc/bin/pip install --no-index --find-links /wheelhouse --no-cache-dir lbc

FROM ${BASE}
COPY --from=build /opt/lbc /opt/lbc
RUN groupadd --gid 10001 lbc \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin lbc
# Pods run with a read-only root filesystem: nothing writes outside /tmp and /data. The environment's
# defaults are lbc.launch's SERVICE_ENV_DEFAULTS (malloc's large blocks on huge pages, and what it frees kept
# for reuse: docs/decisions.md 49, 81).
ENV PATH=/opt/lbc/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    OMP_WAIT_POLICY=PASSIVE \
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4000000000:glibc.malloc.top_pad=268435456 \
    LBC_RUN_DIR=/data/run
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 50052 50053 50060 5555 5556 9101 9102 9103 9110 9120
CMD ["lbc", "--help"]

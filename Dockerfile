# One image for every TxSync service: `txsync <service> ...` (transaction-store,
# sync-coordinator, worker-dispatch, worker, and the CLI).
#
# Built from wheels made on the host (scripts/build_image.sh), so the build itself needs
# no network. BASE_IMAGE defaults to a public slim Python image; machines without
# registry access pass a local Debian base made with debootstrap (txsync-base:bookworm).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# A fixed non-root uid, so that Kubernetes' runAsNonRoot can check it.
RUN useradd --uid 10001 --user-group --home-dir /var/lib/txsync --create-home \
        --shell /usr/sbin/nologin txsync

COPY wheels /tmp/wheels
RUN python3 -m venv /opt/txsync \
    && /opt/txsync/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels 'txsync[server]' \
    && rm -rf /tmp/wheels

ENV PATH=/opt/txsync/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The commit built, for txsync_build_info (last: a new commit rebuilds this layer only).
ARG TXSYNC_BUILD_COMMIT=unknown
ENV TXSYNC_BUILD_COMMIT=${TXSYNC_BUILD_COMMIT}
USER 10001:10001
WORKDIR /var/lib/txsync
ENTRYPOINT ["txsync"]
CMD ["--help"]

# syntax=docker/dockerfile:1
# One image for every capibus service: the entry point is `python -m services`, so
#   docker run IMAGE                        runs every default service in one process (CMD)
#   docker run IMAGE run --only writer      runs chosen ones (services/allinone.py)
#   docker run --entrypoint python IMAGE -m services.writer   runs one, as the chart's split mode
# The chart (deploy/chart/capibus) runs it as uid 10001 with a read-only root file system and
# an emptyDir at /tmp, which is the only place anything is written (helm's homes, downloads).
# tests/unit/test_chart.py checks the invariants below (pinned bases, frozen sync, non-root user,
# helm's version equal to testenv/versions.env).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# uv, the version that wrote uv.lock.
FROM ghcr.io/astral-sh/uv:0.13.9 AS uv

# helm, the release the tests run (testenv/versions.env, HELM_VERSION), checked against the
# checksum published with it.
FROM ${PYTHON_IMAGE} AS helm
ARG HELM_VERSION=v4.2.2
ARG TARGETARCH=amd64
WORKDIR /helm
RUN python - <<PY
import hashlib, tarfile, urllib.request
name = "helm-${HELM_VERSION}-linux-${TARGETARCH}.tar.gz"
base = "https://get.helm.sh/" + name
archive = urllib.request.urlopen(base, timeout=120).read()
expected = urllib.request.urlopen(base + ".sha256sum", timeout=60).read().split()[0].decode()
actual = hashlib.sha256(archive).hexdigest()
if actual != expected:
    raise SystemExit(f"{name}: sha256 {actual}, published {expected}")
open(name, "wb").write(archive)
with tarfile.open(name) as tar:
    member = tar.getmember("linux-${TARGETARCH}/helm")
    member.name = "helm"
    tar.extract(member, ".", filter="data")
PY

# The locked dependencies, then the project, into /app/.venv (the path it keeps at run time).
FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PROJECT_ENVIRONMENT=/app/.venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
# Dependencies first: their layer is reused until uv.lock changes.
RUN uv sync --frozen --no-dev --no-install-project
COPY shared ./shared
COPY services ./services
COPY cli ./cli
COPY testenv ./testenv
COPY standins ./standins
# --no-editable: the project is copied into the environment, so /src is not needed at run time.
RUN uv sync --frozen --no-dev --no-editable

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 capibus \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin capibus
COPY --from=helm /helm/helm /usr/local/bin/helm
COPY --from=build /app/.venv /app/.venv
# Bytecode was compiled at build time; nothing is written beside the code (read-only root).
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080 8443 1470
ENTRYPOINT ["python", "-m", "services"]
CMD ["run", "--all"]

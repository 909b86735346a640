# The ocrvl gateway: `ocrvl serve` on port 8000 as a non-root user. vLLM runs in its own image.
#
#   docker build -t ocrvl-gateway .
#   docker run --rm -p 127.0.0.1:8000:8000 -e OCRVL_BACKENDS=http://vllm:8000 \
#     -e OCRVL_API_KEYS=sk-... ocrvl-gateway
#
# Dependencies are locks/gateway.txt's pins, each checked against its hashes (`make lock` writes
# the lock from pyproject.toml's ranges; the test venv is built from the same pins). Where the
# build cannot reach a package index (a proxy with its own CA, no network), put those wheels in
# wheelhouse/ first (scripts/wheelhouse.sh) and build with `--build-arg PIP_NO_INDEX=1`. Few
# layers on purpose: a storage driver such as vfs copies the whole file system for each one.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: the locked runtime dependencies (no dev group) and the locked setuptools in a
# venv, the project built from its sources with neither an index nor other packages, then the
# venv's own pip and setuptools removed. No .pyc files (--no-compile): 20 MB less image, and a
# read-only root file system could not keep them anyway; the gateway compiles what it imports
# at each start (its imports take 1.0 s instead of 0.5 s, measured on the CI machine).
FROM ${PYTHON_IMAGE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS=/src/wheelhouse
# .dockerignore lets in pyproject.toml, README.md, app/, locks/ and wheelhouse/ only.
COPY . /src
RUN python -m venv /opt/ocrvl \
    && /opt/ocrvl/bin/pip install --no-compile --require-hashes \
        -r /src/locks/gateway.txt -r /src/locks/build.txt \
    && /opt/ocrvl/bin/pip install --no-compile --no-deps --no-build-isolation /src \
    && /opt/ocrvl/bin/pip uninstall --yes pip setuptools

# Runtime stage: the venv only; no compiler, no pip (the base image's own is removed too), no
# sources, no tests. /data is the job store's folder (OCRVL_DATA_DIR in compose): a fresh named
# volume mounted there takes its owner, the gateway's user.
FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ocrvl \
    && rm -rf /usr/local/bin/pip* /usr/local/lib/python3*/site-packages/pip \
        /usr/local/lib/python3*/site-packages/pip-* /usr/local/lib/python3*/ensurepip \
        /usr/lib/python3*/ensurepip /usr/share/python-wheels \
    && mkdir /data && chown 10001:10001 /data
COPY --from=build /opt/ocrvl /opt/ocrvl
ENV PATH=/opt/ocrvl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OCRVL_HOST=0.0.0.0 \
    OCRVL_PORT=8000
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
# Liveness only (/health never waits on a backend); /ready tells whether a backend is healthy.
HEALTHCHECK --interval=5s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('OCRVL_PORT', '8000')}/health\", timeout=4)"]
STOPSIGNAL SIGTERM
CMD ["ocrvl", "serve"]

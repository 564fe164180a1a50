# Two commands: `make serve` (build everything, then tritonserver in the foreground) and `make test`.
# Every target is idempotent: the virtualenv is reinstalled only when pyproject.toml changes (stamp
# named by its hash), and each build step is cached by its own script.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)

# Empty = deployment.yaml's `server:` ports (8000 / 8001 / 8002). Override: make serve HTTP_PORT=9000
HTTP_PORT ?=
GRPC_PORT ?=
METRICS_PORT ?=
# Address Triton's endpoints (and make openai) bind; empty = every interface (0.0.0.0). make serve HOST=127.0.0.1
HOST ?=
# Extra tritonserver arguments, e.g. make serve SERVE_ARGS="--model-config-name trtllm"
SERVE_ARGS ?=
PYTEST_ARGS ?=

.PHONY: all serve build demo test venv configs check-configs clean distclean bench bench-peers bench-quant bench-real bench-serving

all: build

venv: $(VENV_STAMP)

# torch goes first and alone: its pinned CPU wheel lies on local disk, while a resolver left to pick
# torch on its own can pull gigabytes of CUDA wheels. nvidia-pytriton is installed --no-deps: we only
# need its tritonserver binary and Python backend, and its dependency pins clash with ours.
$(VENV_STAMP): pyproject.toml
	@echo "==> [venv] preparing $(VENV) (first run or pyproject.toml changed)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar off "torch==2.13.0"
	$(PY) -m pip install --progress-bar off --no-deps "nvidia-pytriton==0.7.0"
	$(PY) -m pip install --progress-bar off -e ".[test]"
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "==> [venv] ready"

build: venv
	@echo "==> [build] kernels, default model, classical models, configs"
	$(PY) build_scripts/build_all.py

# The demo toy (a 5M-parameter Llama trained here in ~2 minutes), its LoRA adapter and INT4 AWQ variant: profile
# int4's default (docs/engine.md, "The demo toy"). `make test` builds the untrained test toy instead (seconds).
demo: venv
	$(PY) build_scripts/build_all.py --demo

configs: venv
	$(PY) build_scripts/render_configs.py

check-configs: venv
	$(PY) build_scripts/render_configs.py --check

serve: build
	@echo "==> [serve] tritonserver in the foreground (Ctrl-C stops)"
	$(PY) -m tritonllm.serving.launcher \
		$(if $(HTTP_PORT),--http-port $(HTTP_PORT)) \
		$(if $(GRPC_PORT),--grpc-port $(GRPC_PORT)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT)) \
		$(if $(HOST),--host $(HOST)) \
		$(if $(SERVE_ARGS),-- $(SERVE_ARGS))

# NVIDIA Dynamo (issue 16) in its own venv layered over ours (a .pth line: torch, transformers and this
# package come from $(VENV)). ai-dynamo is installed --no-deps: its `aisimulate` dependency is a PyPI
# placeholder that downloads from NVIDIA's own index; the other dependencies it lists are pinned here.
# NIXL (KV handoff of disaggregated prefill / decode, through dynamo.nixl_connect) also --no-deps: its wheel
# lists torch, which would pull a CUDA torch; its UCX moves CPU memory without any GPU. The meta package
# picks nixl_cu13 when it sees CUDA 13 bindings (cuda-python, in the serving venv), so that is the one installed.
DYNAMO_VENV := build/dynamo-venv
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed-1.6.1-nixl1.5.1
NIXL_PKGS := "nixl==1.5.1" "nixl-cu13==1.5.1"
DYNAMO_DEPS := "msgspec>=0.19.0" "pyzmq>=26.0.0" "redis>=6.2.0,<9.0.0" "zstandard>=0.23,<1.0" "uvloop>=0.21.0" \
	"prometheus-client>=0.23.1,<1.0" "kubernetes>=32.0.1,<33.0.0"
REPLICAS ?= 2
PREFILL_WORKERS ?= 0
DYNAMO_PORT ?= 8080
ROUTER ?= kv

.PHONY: dynamo-venv serve-dynamo bench-dynamo
dynamo-venv: $(DYNAMO_STAMP)
$(DYNAMO_STAMP): $(VENV_STAMP)
	@echo "==> [dynamo] $(DYNAMO_VENV): ai-dynamo 1.6.1 over $(VENV)"
	@rm -rf $(DYNAMO_VENV) && $(PYTHON) -m venv $(DYNAMO_VENV)
	$(PY) -c "import site; print(site.getsitepackages()[0])" > "$$($(DYNAMO_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/_tritonllm_main.pth"
	$(DYNAMO_VENV)/bin/pip install --progress-bar off -q --no-deps "ai-dynamo==1.6.1" "ai-dynamo-runtime==1.6.1"
	$(DYNAMO_VENV)/bin/pip install --progress-bar off -q $(DYNAMO_DEPS)
	$(DYNAMO_VENV)/bin/pip install --progress-bar off -q --no-deps $(NIXL_PKGS)
	$(DYNAMO_VENV)/bin/python -c "import dynamo.frontend, dynamo.common.backend, nixl._api"
	@touch $@

serve-dynamo: build dynamo-venv
	@echo "==> [serve-dynamo] Dynamo frontend + $(REPLICAS) workers of our engine, router $(ROUTER), loopback only"
	PYTHONPATH=backends $(PY) -m tritonllm.dynamo.launch --replicas $(REPLICAS) --port $(DYNAMO_PORT) --router $(ROUTER) \
		--prefill-workers $(PREFILL_WORKERS)

bench-dynamo: build dynamo-venv
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	PYTHONPATH=backends $(PY) benchmarks/bench_dynamo.py $(BENCH_ARGS)

# genai-perf's virtualenv (make perf's): tests/integration/test_perf_llm.py runs `make perf` end to end.
GENAI_VENV ?= build/perf/genai-venv

# make test: build_scripts/make_test.py installs (the three venvs above, as their own targets), builds the test toy
# and what the server needs, runs pytest, and prints a table of where the time went.
test:
	@$(PYTHON) build_scripts/make_test.py --pytest-args "$(PYTEST_ARGS)"

# clean: build outputs (models, configs' artifacts, logs, benchmark results); keeps what takes long to fetch or
# compile again: the peers under build/peers (~6 GB), build/dynamo-venv and build/perf/genai-venv.
# distclean: everything, virtualenvs included.
clean:
	@mkdir -p build
	find build -mindepth 1 -maxdepth 1 ! -name peers ! -name dynamo-venv ! -name perf -exec rm -rf {} +
	@if [ -d build/perf ]; then find build/perf -mindepth 1 -maxdepth 1 ! -name genai-venv -exec rm -rf {} +; fi
	rm -rf .pytest_cache
	rm -f model_repository/*/1/model.onnx
	find . -path ./$(VENV) -prune -o -path ./build -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf build $(VENV) *.egg-info backends/*.egg-info

# Engine benchmarks (not part of `make test`): ratios against HF transformers measured in the same run,
# machine bounds measured on the spot, plots under build/bench/.
bench: build
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/bench_engine.py --triton
	$(PY) benchmarks/bench_features.py
	$(PY) benchmarks/bench_cpu_kernels.py

# Peers on the same workload (not in `make test`, not in CI: ~6 GB under build/peers and 15-25 minutes the first
# time on 2 cores, mostly the llama.cpp compile): vLLM CPU and llama.cpp in their own virtualenvs, greedy ids
# checked against ours, table and plot in build/bench/peers.{json,png}. PEERS_ARGS="--peers llamacpp --skip-hf"
# narrows it; PEERS_ARGS="--quiet-wait 300" waits for a quiet machine before each engine.
PEERS_ARGS ?=
# INT8 / INT4 / FP8 weights against fp32 (speed on the bench model, perplexity of the demo model) and
# llama.cpp Q8_0 / Q4_0 / Q4_K_M when `make bench-peers` has built it (QUANT_ARGS="--llamacpp require").
QUANT_ARGS ?=
bench-quant: build
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/bench_quant.py $(QUANT_ARGS)

bench-peers: build
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/bench_peers.py $(PEERS_ARGS)

# Our engine against llama.cpp on llama.cpp's own files (the default model's Q4_1 GGUF and F32 / Q8_0 / Q4_0 /
# Q4_K_M requantized from it): batch-1 decode, prefill 512, batch 16, alternating rounds (~15-20 minutes; builds
# llama.cpp as bench-peers does when it is missing). REAL_ARGS="--rounds 5 --formats Q4_1,F32"
REAL_ARGS ?=
bench-real: build
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/bench_real.py $(REAL_ARGS)

# Quality: perplexity of our engine (each activation_quantization mode) against llama.cpp's llama-perplexity on the
# same GGUF and the same tokens (its measure: chunks of 512, the second half of each scored); builds llama.cpp as
# bench-peers does when it is missing. EVAL_ARGS="--model path/to/file.gguf --chunks 32"
EVAL_ARGS ?=
.PHONY: eval
eval: build
	@$(PY) -c "import matplotlib, nvidia.cuda_runtime" 2>/dev/null || $(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/eval_ppl.py $(EVAL_ARGS)

# The OpenAI serving path (make serve + make openai) against llama-server, vllm serve and Dynamo over our engine, on
# the default model: one streamed load per concurrency level, a table of ratios and a plot (~20-30 minutes; builds
# llama-server into the vendored llama.cpp on first use; vLLM comes from `make bench-peers`).
# SERVING_ARGS="--levels 1,4 --servers ours,llama-server"
SERVING_ARGS ?=
bench-serving: build
	$(PY) -m pip install --progress-bar off -q -e ".[bench]"
	PYTHONPATH=backends $(PY) benchmarks/bench_serving.py $(SERVING_ARGS)

# ---- OpenAI-compatible API and the LLM serving benchmark (clients/, benchmarks/perf_llm.py)
# `make openai` serves /v1 on OPENAI_PORT in front of a running tritonserver's gRPC port (GRPC_PORT,
# default deployment.yaml's). `make perf` runs perf_analyzer + genai-perf; it starts its own tritonserver
# on free ports unless PERF_ARGS="--url localhost:8001". genai-perf gets its own virtualenv: its
# dependencies (pandas 3, numpy 2 unless pinned) must not reach the serving venv.
OPENAI_PORT ?= 9000
# OpenAI model names of tensorrt_llm's LoRA adapters (deployment.yaml lora_adapters): NAME=TASK_ID ...
OPENAI_LORA_MODULES ?=
# How tool calls are read from the model's text: Hermes-style <tool_call> blocks (tool_choice required / named
# are written in that form by guided decoding; SmolLM2-Instruct's own template has no tools section).
OPENAI_TOOL_CALL_PARSER ?= hermes
PERF_ARGS ?=

.PHONY: openai perf
openai: build
	$(PY) -m clients.openai_server --port $(OPENAI_PORT) $(if $(GRPC_PORT),--triton-url localhost:$(GRPC_PORT)) \
		$(if $(HOST),--host $(HOST)) \
		$(if $(OPENAI_LORA_MODULES),--lora-modules $(OPENAI_LORA_MODULES)) \
		$(if $(OPENAI_TOOL_CALL_PARSER),--tool-call-parser $(OPENAI_TOOL_CALL_PARSER)) \
		$(if $(OPENAI_REASONING_PARSER),--reasoning-parser $(OPENAI_REASONING_PARSER))

$(GENAI_VENV)/bin/genai-perf:
	$(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/pip install --progress-bar off -q "genai-perf==0.0.16" "numpy<2"

perf: build $(GENAI_VENV)/bin/genai-perf
	@$(PY) -c "import matplotlib, nvidia.cuda_runtime" 2>/dev/null || $(PY) -m pip install --progress-bar off -q -e ".[bench]"
	$(PY) benchmarks/perf_llm.py --genai-venv $(GENAI_VENV) $(PERF_ARGS)

# ---- Reliability (issue 8). `make soak`: mixed load for SOAK_MINUTES against its own server, report of
# requests, errors by kind and stub RSS drift (build/soak/report.json), then the reliability tests and a long random
# contract fuzz (SOAK_FUZZ_EXAMPLES).
# `make serve-prod`: the production profile (deploy/production.args: admin APIs need the admin-key
# header); TRITON_ADMIN_KEY must be set in the environment (see docs/security.md).
SOAK_MINUTES ?= 10
SOAK_WORKERS ?= 6
# Extra soak.py arguments, e.g. SOAK_ARGS="--out /tmp/report.json --seed 3"
SOAK_ARGS ?=
# Random examples of the contract fuzz after the load (make test runs 80 derandomized ones)
SOAK_FUZZ_EXAMPLES ?= 1500

.PHONY: soak serve-prod
soak: build
	$(PY) benchmarks/soak.py --minutes $(SOAK_MINUTES) --workers $(SOAK_WORKERS) $(SOAK_ARGS)
	$(PY) -m pytest tests/integration/test_overload_faults.py tests/integration/test_contract_fuzz.py \
		--fuzz-examples $(SOAK_FUZZ_EXAMPLES) -s $(PYTEST_ARGS)

serve-prod: build
	@test -n "$$TRITON_ADMIN_KEY" || { echo "serve-prod: set TRITON_ADMIN_KEY (see docs/security.md)"; exit 2; }
	$(PY) -m tritonllm.serving.launcher \
		$(if $(HTTP_PORT),--http-port $(HTTP_PORT)) \
		$(if $(GRPC_PORT),--grpc-port $(GRPC_PORT)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT)) \
		-- $$($(PY) -c "import os; print(' '.join(os.path.expandvars(l.strip()) for l in open('deploy/production.args') if l.strip() and not l.lstrip().startswith('#')))") $(SERVE_ARGS)

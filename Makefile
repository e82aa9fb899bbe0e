# The user's interface. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint demo image bench bench-cost soak test-docker test-vllm test-llamacpp test-sglang test-triton test-k8s test-kubelet test-gpu tools clean

install: $(STAMP)

# Reinstall when the project's dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Real Prometheus, Alertmanager, promtool, docker-compose and Chromium: installed from Debian when
# we are root on Debian, otherwise the tests that need them skip with one loud line.
tools:
	@bash tools/ensure-tools.sh

test: install tools lint
	$(BIN)/pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# Lint (ruff, whole tree), types (mypy, on the package that ships) and the import contracts
# (import-linter): a second or two each, configured in pyproject.toml. `ruff check --fix .` mends what it can.
lint: install
	@echo "== ruff check ." && $(BIN)/ruff check .
	@echo "== mypy ($$(sed -n 's/^files = //p' pyproject.toml))" && $(BIN)/mypy
	@echo "== lint-imports (the layers and no cycles, [tool.importlinter] in pyproject.toml)" && $(BIN)/lint-imports --no-cache

# With an exporter config of your own (CONFIG=FILE, or ./exporter.yaml when it exists) the demo
# watches your servers instead of the simulated fleet; `make demo CONFIG=` forces the simulation.
CONFIG ?= $(wildcard exporter.yaml)
demo: install
	$(BIN)/python -m llm_vitals.demo$(if $(CONFIG), --config $(CONFIG))

# The image (Dockerfile): exporter, remediator and simulator; the Helm chart's and the manifests'
# `image.repository`. A plain `docker build` on your machine, never a `make test` step (it needs a
# Docker Engine and the base image). Push it where your cluster pulls from:
#   make image IMAGE=registry.example.com/llm-vitals:0.1.0 && docker push registry.example.com/llm-vitals:0.1.0
IMAGE ?= llm-vitals:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	docker build -t $(IMAGE) .

# The real tiers, one rule: `make test-<tier>` runs tools/real-<tier>-test.sh, the tier's launcher.
# - docker (tests/real_docker/): its own dockerd (own socket, data root, pid file, no bridge), the
#   image built on a Debian base made locally (cached outside the clone), the compose stack and the
#   docker executor against the real Engine; leaves no daemon, container or image.
# - vllm (tests/real_vllm/README.md): its own vLLM venv and a tiny model built locally, cached outside
#   the clone (tools/cache-path.sh), fault drills against a real `vllm serve`; prints the summary
#   table at the end. Its reports and logs stay under .cache/.
# - llamacpp (tests/real_llamacpp/README.md): llama-server built from the llama-cpp-python sdist's
#   llama.cpp and cached outside the clone, a tiny GGUF made here, drills against the real server.
# - sglang (tests/real_sglang/README.md): SGLang 0.5.23 on CPU torch in a venv cached outside the
#   clone (tools/cache-path.sh sglang 0.5.23), drills against a real server; a table at the end.
# - triton (tests/real_triton/): Triton 2.51 from nvidia-pytriton 0.7.0 in a venv cached outside the
#   clone, the project's toy model, fault drills against it; prints the summary table.
# - k8s (tests/k8s/): kube-apiserver + kube-controller-manager 1.20.2 built from Debian's source and
#   cached outside the clone, etcd from Debian; the tests start the control plane.
# - kubelet (tests/kubelet/): a two-node Kubernetes 1.20.2 (the k8s tier's build plus
#   kube-scheduler, the kubelet and kubectl, cached outside the clone) in network namespaces of its
#   own; the classic manifests' probes, drain and remediation judged by real kubelets. Leaves nothing behind.
REAL_TIERS := test-docker test-vllm test-llamacpp test-sglang test-triton test-k8s test-kubelet
$(REAL_TIERS): test-%: install
	@bash tools/real-$*-test.sh $(PYTEST_ARGS)

# The GPU tier (tests/real_gpu/README.md), on a machine with an NVIDIA GPU and nvcc: llama-server built with
# CUDA (cached outside the clone), the llama.cpp drills on the GPU, then the NVML source against the GPU.
# Without a GPU: one line, status 0. Not a CI step: CI has no GPU.
test-gpu: install
	@bash tools/real-gpu-test.sh

# bench_cost_of_watching.py is left out of `make bench`: it starts the real engines of the tiers
# (built by `make test-<engine>`) and takes minutes per engine on a quiet box; `make bench-cost` runs it.
bench: install
	@for b in bench/bench_*.py; do [ "$$b" = bench/bench_cost_of_watching.py ] && continue; echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-cost: install
	@$(BIN)/python bench/bench_cost_of_watching.py $(BENCH_ARGS)

# The fleet soak, 30 simulated days of 200 workloads on each store and each of SOAK_SEEDS (minutes
# each; every run reported, the exit status 1 when any had a violation); `make test` runs a two-day
# one (tests/test_soak.py). SOAK_ARGS: e.g. --days 7.
SOAK_SEEDS ?= 1 2
soak: install
	@status=0; for seed in $(SOAK_SEEDS); do for store in lease sqlite; do \
		echo "== bench/soak.py --store $$store --seed $$seed $(SOAK_ARGS)"; \
		$(BIN)/python bench/soak.py --store $$store --seed $$seed $(SOAK_ARGS) || status=1; done; done; exit $$status

clean:
	rm -rf $(VENV) .cache .pytest_cache

# The two commands a newcomer runs: `make run` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SIM ?= h200x2

.PHONY: run test lint gpu bench proto system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	mkdir -p .run
	$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json mig generate-config > .run/mig.yaml
	$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json mig apply -f .run/mig.yaml -c all-balanced
	$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json status
	@echo "metrics: http://127.0.0.1:9401/metrics   (nodeagent --simulate $(SIM) --sim-state .run/node.json sim attach ... adds load)"
	$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json --log-level info run \
	  --metrics-address 127.0.0.1:9401 -f .run/mig.yaml -c all-balanced

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict nodeagent
	$(BIN)/lint-imports

# The Prometheus tests need the real prometheus and promtool (Debian package `prometheus`).
system-deps:
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; \
	else echo "note: install the Debian package 'prometheus'; the Prometheus tests skip without it"; fi

test: lint system-deps
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/reconfig.py
	$(BIN)/python benchmarks/metrics.py
	$(BIN)/python benchmarks/startup.py

gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu tests/gpu

# Regenerate the kubelet pod-resources stubs from nodeagent/kube/proto/podresources.proto.
# With a pinned old grpcio-tools (protoc 25: protobuf 4.25 gencode), in a throwaway venv: its
# stubs carry no grpcio/protobuf version check, so they load on every grpcio and protobuf that
# pyproject.toml allows (checked up to grpcio 1.85, protobuf 7.36). Newer grpcio-tools write
# stubs that refuse any grpcio or protobuf older than the generator's own.
# grpcio-tools 1.62.3 ships wheels for Python 3.8-3.12: PYTHON=python3.12 where python3 is newer.
PROTO_TOOLS ?= grpcio-tools==1.62.3
proto:
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install --quiet '$(PROTO_TOOLS)' && \
	"$$tmp/venv/bin/python" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
	  nodeagent/kube/proto/podresources.proto

clean:
	rm -rf $(VENV) .run .mypy_cache .ruff_cache .pytest_cache .hypothesis

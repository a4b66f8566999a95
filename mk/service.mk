# The cluster-wide limit service (issue 4): service/ (library), cmd/limitd
# (the binary), internal/redistest (real redis-server processes for tests),
# cmd/benchservice (its benchmark). See service/openapi.yaml.
#
#   make build-service        build/limitd: one static binary (CGO_ENABLED=0)
#   make test-service         unit tests (miniredis) and, when redis-server is
#                             installed, integration tests; -race
#   make test-service-redis   the same with CI=true: a missing redis-server fails
#   make bench-service        decisions/s and p50/p99 against a real Redis, with and
#                             without batching, beside redis-benchmark EVALSHA
#   make fuzz-service         fuzz the request decoder for FUZZTIME
#
# BENCH_SERVICE_FLAGS passes options, e.g. BENCH_SERVICE_FLAGS='-duration 5s -c 100'.

.PHONY: build-service test-service test-service-redis bench-service fuzz-service

GO ?= go
BUILD ?= build
FUZZTIME ?= 20s
BENCH_SERVICE_FLAGS ?=
SERVICE_PKGS := ./service/... ./cmd/limitd/... ./cmd/benchservice/... ./internal/redistest/...
LIMITD_SRC := $(shell find service cmd/limitd -name '*.go' -not -name '*_test.go' 2>/dev/null) service/decide.lua

$(BUILD)/limitd: $(LIMITD_SRC) go.mod go.sum
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $@ ./cmd/limitd
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

build-service: $(BUILD)/limitd

test-service:
	$(GO) test -race -count=1 $(SERVICE_PKGS)

test-service-redis:
	CI=true $(GO) test -race -count=1 -run 'Integration|TestStart|TestCluster' ./service/ ./internal/redistest/

bench-service:
	$(GO) run ./cmd/benchservice $(BENCH_SERVICE_FLAGS)

fuzz-service:
	$(GO) test -run XXX -fuzz FuzzDecode -fuzztime $(FUZZTIME) ./service/

# envoyproxy/ratelimit, built from source through the Go module proxy: the peer
# limitd's rate limit service API (RLS) is checked against (the differential
# e2e tests) and measured beside (make bench). Not shipped, never linked into
# this project's modules: `go install` builds it with its own go.mod.
#
#   make build-ratelimit   build/envoy-ratelimit/service_cmd (envoyproxy/ratelimit's server)

.PHONY: build-ratelimit

RATELIMIT_VERSION := v1.4.1-0.20260122083618-3fb702589d36
export RATELIMIT_BIN ?= $(abspath $(BUILD)/envoy-ratelimit/service_cmd)

$(BUILD)/envoy-ratelimit/service_cmd:
	@mkdir -p $(@D)
	GOBIN=$(abspath $(@D)) $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(RATELIMIT_VERSION)

build-ratelimit: $(BUILD)/envoy-ratelimit/service_cmd

# limitd as the rate limit service of Envoy's own rate limit filter
# (envoy.filters.http.ratelimit), checked black-box and against
# envoyproxy/ratelimit (docs/limit-service.md, "Checked against Envoy and
# envoyproxy/ratelimit"): e2e/ratelimit, a Go
# module of its own whose go.mod names envoyproxy/ratelimit at
# RATELIMIT_VERSION, so that `go mod download` puts its example and test
# configurations in the module cache, where the tests read them. Real Envoy
# 1.40, build/limitd, build/envoy-ratelimit/service_cmd and redis-server.
#
#   make test-ratelimit   its tests under CI=true (a missing Envoy, limitd,
#                         envoyproxy/ratelimit or redis-server fails, never
#                         skips); part of `make test`

.PHONY: test-ratelimit

RATELIMIT_MOD := e2e/ratelimit
export LIMITD_BIN ?= $(abspath $(BUILD)/limitd)

test-ratelimit: setup setup-redis build-service build-ratelimit $(TESTLOG_BIN)
	@rm -f $(TEST_DIR)/test-ratelimit.*
	set -o pipefail; cd $(RATELIMIT_MOD) && CI=true $(GO) test -json -count=1 -parallel $(E2E_PARALLEL) -timeout 20m ./... 2>&1 | \
		$(TESTLOG) -part test-ratelimit -log $(abspath $(BUILD))/ratelimit.log

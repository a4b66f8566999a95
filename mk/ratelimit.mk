# envoyproxy/ratelimit, built from source through the Go module proxy: the peer
# limitd's rate limit service API (RLS) is checked against (the differential
# e2e tests) and measured beside (make bench). Not shipped, never linked into
# this project's modules: `go install` builds it with its own go.mod.
#
#   make build-ratelimit   build/ratelimit/service_cmd (envoyproxy/ratelimit's server)

.PHONY: build-ratelimit

RATELIMIT_VERSION := v1.4.1-0.20260122083618-3fb702589d36
export RATELIMIT_BIN ?= $(abspath $(BUILD)/ratelimit/service_cmd)

$(BUILD)/ratelimit/service_cmd:
	@mkdir -p $(@D)
	GOBIN=$(abspath $(@D)) $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(RATELIMIT_VERSION)

build-ratelimit: $(BUILD)/ratelimit/service_cmd

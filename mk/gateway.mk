# The native module in Envoy Gateway (docs/native.md, "Envoy Gateway"):
# examples/envoy-gateway/native.yaml decoded strictly by Envoy Gateway's own
# API types (github.com/envoyproxy/gateway/api/v1alpha1, v1.9.1) and the
# Gateway API's, its module configuration checked by the engine, and a real
# Envoy running the module's filter in the form Envoy Gateway's translator
# writes.
#
# examples/envoy-gateway is a Go module of its own (its go.mod pins Envoy
# Gateway), so Envoy Gateway and its Kubernetes packages never enter the
# product's go.mod; it reaches this module's packages through a replace
# directive (../..). `make check` vets it and checks `go mod tidy` there.
#
#   make test-gateway   its tests under CI=true (a missing Envoy or native
#                       module fails, never skips); part of `make test`
#
#   make test-envoy-gateway   Envoy Gateway's own control plane, built from
#                       source (build/envoy-gateway-bin/envoy-gateway, with
#                       its own go.mod), run standalone as the xDS server of
#                       the rate limit services: e2e/ratelimit's
#                       TestEnvoyGatewayControlPlane under CI=true. Not in
#                       `make test`: the cold build is long (docs/envoy-gateway.md)
#
# Cold (empty Go build cache) the first run compiles the Kubernetes and
# Gateway API packages: about a minute on 2 shared cores.

.PHONY: test-gateway build-envoy-gateway test-envoy-gateway

GATEWAY_MOD := examples/envoy-gateway

test-gateway: setup build-native $(TESTLOG_BIN)
	@rm -f $(TEST_DIR)/test-gateway.*
	set -o pipefail; cd $(GATEWAY_MOD) && CI=true $(GO) test -json -count=1 ./... 2>&1 | \
		$(TESTLOG) -part test-gateway -log $(abspath $(BUILD))/gateway.log

# Envoy Gateway's version: the one examples/envoy-gateway's go.mod pins.
ENVOY_GATEWAY_VERSION := v1.9.1
ENVOY_GATEWAY_BIN := $(abspath $(BUILD)/envoy-gateway-bin/envoy-gateway)

$(ENVOY_GATEWAY_BIN):
	@mkdir -p $(@D)
	GOBIN=$(@D) $(GO) install github.com/envoyproxy/gateway/cmd/envoy-gateway@$(ENVOY_GATEWAY_VERSION)

build-envoy-gateway: $(ENVOY_GATEWAY_BIN)

test-envoy-gateway: setup setup-redis build-ratelimit build-envoy-gateway
	cd $(RATELIMIT_MOD) && CI=true ENVOY_GATEWAY_BIN=$(ENVOY_GATEWAY_BIN) $(GO) test -count=1 -timeout 10m -v -run '^TestEnvoyGateway' .

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
# Cold (empty Go build cache) the first run compiles the Kubernetes and
# Gateway API packages: about a minute on 2 shared cores.

.PHONY: test-gateway

GATEWAY_MOD := examples/envoy-gateway

test-gateway: setup build-native $(TESTLOG_BIN)
	@rm -f $(TEST_DIR)/test-gateway.*
	set -o pipefail; cd $(GATEWAY_MOD) && CI=true $(GO) test -json -count=1 ./... 2>&1 | \
		$(TESTLOG) -part test-gateway -log $(abspath $(BUILD))/gateway.log

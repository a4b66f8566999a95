# Memory benchmark (issue 5): Envoy's resident memory against distinct client
# keys, for the plugin's bounded table and for a comparison plugin that keeps
# one shared-data key per client. Writes docs/memory.md and docs/memory.png.
# See cmd/benchmemory.

.PHONY: bench-memory

PERKEY_SRC := $(wildcard cmd/benchmemory/perkeyplugin/*.go)

# The comparison plugin, built like the real one (see $(BUILD)/plugin.wasm).
$(BUILD)/perkey.wasm: $(BUILD)/sdk.stamp $(PERKEY_SRC)
	GOOS=wasip1 GOARCH=wasm $(GO) build -modfile=$(BUILD)/go.wasm.mod -tags sdkglue \
		-buildmode=c-shared -trimpath -ldflags='-s -w' -o $@ ./cmd/benchmemory/perkeyplugin
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

# BENCH_MEMORY_FLAGS passes options, e.g. BENCH_MEMORY_FLAGS='-keys 1000,10000'.
bench-memory: setup build $(BUILD)/perkey.wasm
	$(GO) run ./cmd/benchmemory -envoy $(ENVOY_BIN) -plugin $(PLUGIN_WASM) -perkey $(BUILD)/perkey.wasm \
		-md docs/memory.md -png docs/memory.png $(BENCH_MEMORY_FLAGS)

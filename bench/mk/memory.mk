# Memory benchmark (issue 5): Envoy's resident memory against distinct client
# keys, for the plugin's bounded table and for a comparison plugin that keeps
# one shared-data key per client. Writes docs/memory.md and docs/memory.png.
# See `bench memory` (bench/cmd/bench/memory.go).

.PHONY: bench-memory

PERKEY_SRC := $(wildcard bench/cmd/bench/perkeyplugin/*.go)

# The comparison plugin, built like the real one (see $(BUILD)/plugin.wasm).
$(BUILD)/perkey.wasm: $(PERKEY_SRC) bench/go.mod bench/go.sum
	$(call bench_wasm,./cmd/bench/perkeyplugin)

# BENCH_MEMORY_FLAGS passes options, e.g. BENCH_MEMORY_FLAGS='-keys 1000,10000'.
bench-memory: setup build $(BUILD)/perkey.wasm $(BENCH_BIN)
	$(BENCH_BIN) memory -plugin $(PLUGIN_WASM) -perkey $(BUILD)/perkey.wasm \
		-md docs/memory.md -png docs/memory.png $(BENCH_MEMORY_FLAGS)

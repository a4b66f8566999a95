# Footprint and start cost (issue 11): see bench/footprint.md.
#
#   make footprint     code bytes per Go package and the data section of the
#                      plugin, the feature floor, the Go floor module and a
#                      wasip1 hello world
#                      (unstripped copies in build/footprint/), plus the
#                      stripped sizes
#   make bench-start   Envoy's CPU and wall time from start to the first 200
#                      (--concurrency 1) and its RSS after 1000 requests at
#                      --concurrency 1, 2, 4 and 8: no filter, the no-op
#                      module, the Go floor, the feature floor (the Go floor
#                      with regexp and gjson), the plugin (`bench start`,
#                      bench/cmd/bench/start.go; START_FLAGS='-rounds 5',
#                      START_MODULES='before=/tmp/old.wasm' adds modules)

.PHONY: footprint bench-start

FP := $(BUILD)/footprint
# Unstripped builds for the size tables (make build's recipe strips).
WASM_BUILD := GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath
BENCH_WASM_BUILD := GOOS=wasip1 GOARCH=wasm $(BENCH_GO) build -trimpath

$(FP)/floor.wasm: bench/internal/footprint/floor/*.go bench/go.mod bench/go.sum
	$(call bench_wasm,./internal/footprint/floor)

$(FP)/deps.wasm: bench/internal/footprint/deps/*.go bench/go.mod bench/go.sum
	$(call bench_wasm,./internal/footprint/deps)

footprint: build $(FP)/floor.wasm $(FP)/deps.wasm
	@mkdir -p $(FP)
	$(WASM_BUILD) -buildmode=c-shared -o $(FP)/plugin-full.wasm .
	$(BENCH_WASM_BUILD) -buildmode=c-shared -o $(abspath $(FP))/floor-full.wasm ./internal/footprint/floor
	$(BENCH_WASM_BUILD) -buildmode=c-shared -o $(abspath $(FP))/deps-full.wasm ./internal/footprint/deps
	$(BENCH_WASM_BUILD) -o $(abspath $(FP))/hello-full.wasm ./internal/footprint/hello
	$(BENCH_WASM_BUILD) -ldflags='-s -w' -o $(abspath $(FP))/hello.wasm ./internal/footprint/hello
	@ls -l $(BUILD)/plugin.wasm $(FP)/deps.wasm $(FP)/floor.wasm $(FP)/hello.wasm | awk '{print "stripped " $$9 ": " $$5 " bytes"}'
	$(BENCH_GO) build -o $(abspath $(FP))/wasmsize ./internal/wasmsize/cmd
	$(FP)/wasmsize -top 30 $(FP)/plugin-full.wasm $(FP)/deps-full.wasm $(FP)/floor-full.wasm $(FP)/hello-full.wasm

START_FLAGS ?=
START_MODULES ?=
bench-start: setup build build-native $(FP)/floor.wasm $(FP)/deps.wasm $(BENCH_BIN)
	@uptime
	$(BENCH_BIN) start $(START_FLAGS) \
		floor=$(FP)/floor.wasm deps=$(FP)/deps.wasm $(START_MODULES) plugin=$(BUILD)/plugin.wasm native=$(NATIVE_SO)

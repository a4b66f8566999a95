# The benchmark lab is a Go module of its own (bench/, go.mod with a replace
# onto this checkout), so its dependencies (gonum/plot, gopsutil) stay out of
# the plugin's and the service's module. Its programs run from the
# repository root, where their default paths (docs/, build/) point.
# BENCH_GO runs the go command in the lab's module; bench_wasm builds one of
# its Go packages into a proxy-wasm module as the plugin is built.
#
# The overhead benchmark (issue 7): bench/cmd/bench runs the real Envoy with
# no filter, Envoy's native local_ratelimit, the plugin, and a cluster rule
# through the limit service (build/limitd, in-memory), and writes the
# results to docs/benchmarks/ (README.md, results.json, PNG plots).
#
#   make bench           full run (each section of the page says how long it took); rewrites docs/benchmarks/
#
# Every page of docs/benchmarks is rewritten without measuring from the
# results its run saved beside it: build/bench -render
# docs/benchmarks/results.json (README.md, the plots, the front page's cost
# sentence), or attribution.json, perf.json, ordinary.json (their pages;
# -out for another directory).
#   make bench-smoke     a few seconds per configuration (CI), into build/bench-smoke/
#   make bench-profile   host calls and guest allocations per request, in wazero
#   make bench-attrib    a cost per host operation: the Go floor and the same
#                        module making 100 of one operation per request
#                        (bench/internal/footprint/ops), with no filter and the no-op
#                        module; and (23), every layer in one Envoy (a listener
#                        each): the host operations made once by a module with
#                        no code (bench/cmd/bench/nullwasm/null-path.wat), by the Go floor, and
#                        the plugin; writes docs/benchmarks/attribution.md
#                        and attribution.json.
#                        ATTRIB_FLAGS='-only 23 -compare-wasm other.wasm
#                        -out build/x' measures another build of the plugin
#                        against build/plugin.wasm in that one Envoy
#   make bench-body      the response body callback's Envoy CPU without
#                        response_json rules (bench/bodycost's TestBodyCallbackCost): the
#                        plugin with and without its body export, 256 HTTP/2
#                        DATA frames per response; prints the figures
#   make bench-perf      where Envoy's CPU goes by DSO (envoy, kernel, JIT = the
#                        Wasm guest) for bench-attrib's configurations, with
#                        perf; writes docs/benchmarks/perf.md and perf.json (says so and
#                        writes nothing where perf is missing)
#   make bench-guest     the guest's own code under V8 alone: the unstripped
#                        plugin in Node with a stub host (bench/cmd/bench/guestprof),
#                        an allowed and an idle request's time, the CPU a 1 MiB
#                        JSON body's scan takes, and with perf
#                        the share of each Go package and function (says so
#                        and stops where node or perf is missing)
#   make bench-rls       only the section on Envoy's own ratelimit filter
#                        (bench/cmd/bench/rls.go): envoyproxy/ratelimit
#                        (make build-ratelimit) against limitd's gRPC front
#                        door, each with a redis-server of its own, beside the
#                        plugin's cluster rule and build/limitd-floor (a
#                        script's floor); put into docs/benchmarks/
#                        results.json and its page (make bench and
#                        bench-smoke run it too). BENCH_RLS_FLAGS='-smoke
#                        -out build/bench-rls' for a quick look elsewhere
#   make bench-delay     what holding requests (max_delay_ms) costs, each build:
#                        how late held requests go on (p50, p99), the
#                        plugin's heap per held request with 10,000 held,
#                        an idle Envoy's CPU once nothing is held (bench/delay's
#                        TestDelayCost, DELAY_COST=1); prints the figures and
#                        writes them to docs/benchmarks/delay.md
#   make bench-idle      an idle Envoy's CPU after 1,000 listener updates, with
#                        the native module and with the Wasm plugin (bench/idlecpu's
#                        TestIdleCPUAfterListenerUpdates, which bounds the
#                        native figure by the Wasm one); prints both, with
#                        the load; about 10 minutes on a loaded machine
#   make bench-rlqs      only the section on Envoy's own quota filter
#                        (bench/cmd/bench/rlqs.go): stock Envoy's
#                        rate_limit_quota filter against limitd's RLQS (a
#                        redis-server of its own), beside no filter,
#                        local_ratelimit and the plugin's and the native
#                        module's cluster rules with leases: Envoy CPU per
#                        request, and limitd's messages and CPU at three
#                        request rates (60 s each); put into
#                        docs/benchmarks/results.json and its page (make
#                        bench and bench-smoke run it too).
#                        BENCH_RLQS_FLAGS='-smoke -out build/bench-rlqs'
#                        for a quick look elsewhere
#   make bench-rlqs-ratio  only the saturation rounds of the RLQS section's no
#                        filter, local_ratelimit and quota filter (with and
#                        without token buckets): their Envoy CPU ratios
#                        printed, with the load; nothing written (a few
#                        minutes: for a quiet moment)
#   make bench-ordinary  the ordinary-load regime alone (bench/cmd/bench/ordinary.go):
#                        Envoy pinned to one CPU, 16 keep-alive connections at
#                        a fixed rate of half no filter's saturated throughput,
#                        and saturated; no filter, local_ratelimit with and
#                        without RateLimit headers, the native module with
#                        and without, the plugin; 3 alternated rounds, ratios
#                        within each round; prints the table with the load and
#                        writes docs/benchmarks/ordinary.md and ordinary.json (about 5 minutes),
#                        with where the CPU goes at that load (perf, the module
#                        built with its symbols). ORDINARY_FLAGS='-ordinary-perf 4s
#                        -compare-module old.so' runs another build of the module
#                        beside this one; '-out build/x' writes elsewhere
#   make bench-service   the limit service's decisions/s and p50/p99 against a
#                        real Redis, with and without batching, beside
#                        redis-benchmark EVALSHA (bench/cmd/benchservice);
#                        BENCH_SERVICE_FLAGS='-duration 5s -c 100'
#
# BENCH_FLAGS passes more flags, e.g. BENCH_FLAGS='-rounds 3 -only 1,2,3'
# (see `build/bench -h`).

.PHONY: bench bench-smoke bench-ordinary bench-rls bench-rlqs bench-rlqs-ratio bench-profile bench-perf bench-attrib bench-body bench-guest bench-service bench-idle bench-delay

BENCH_GO := $(GO) -C bench
define bench_wasm
@mkdir -p $(@D)
GOOS=wasip1 GOARCH=wasm $(BENCH_GO) build -buildmode=c-shared $(REPRO_FLAGS) -o $(abspath $@) $(1)
@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'
endef

BENCH_FLAGS ?=
BENCH_BIN := $(BUILD)/bench

# Every file compiled or embedded into the bench program from this checkout
# (the lab's packages and the root module's it imports), as go list names
# them; should go list fail, the program is always rebuilt.
BENCH_SRC := $(patsubst $(CURDIR)/%,%,$(shell $(BENCH_GO) list -deps -f \
	'{{if .Module}}{{if or .Module.Main .Module.Replace}}{{$$d := .Dir}}{{range .GoFiles}}{{$$d}}/{{.}} {{end}}{{range .EmbedFiles}}{{$$d}}/{{.}} {{end}}{{end}}{{end}}' \
	./cmd/bench 2>/dev/null))
ifeq ($(BENCH_SRC),)
BENCH_SRC := FORCE
endif
.PHONY: FORCE

$(BENCH_BIN): $(BENCH_SRC) bench/go.mod bench/go.sum go.mod
	@mkdir -p $(BUILD)
	$(BENCH_GO) build -o $(abspath $@) ./cmd/bench

bench: build build-native setup build-service build-ratelimit $(BUILD)/limitd-symbols $(BUILD)/limitd-floor $(BENCH_BIN)
	$(BENCH_BIN) -out docs/benchmarks -limitd $(BUILD)/limitd -ratelimit $(RATELIMIT_BIN) -rls-limitd $(BUILD)/limitd-symbols -rls-limitd-floor $(BUILD)/limitd-floor -module $(NATIVE_SO) $(BENCH_FLAGS)

bench-smoke: build build-native setup build-service build-ratelimit $(BENCH_BIN)
	$(BENCH_BIN) -smoke -out $(BUILD)/bench-smoke -limitd $(BUILD)/limitd -ratelimit $(RATELIMIT_BIN) -module $(NATIVE_SO) $(BENCH_FLAGS)

# limitd as build/limitd is built, keeping its symbol table: the RLS
# section's profile of it names functions (the code is the same).
$(BUILD)/limitd-symbols: $(LIMITD_SRC) go.mod go.sum
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./cmd/limitd

# limitd whose plain decisions run service/take_floor.lua (the benchfloor
# tag): the RLS section's floor of one script call per decision. It admits
# every plain decision, so nothing but the benchmark runs it.
$(BUILD)/limitd-floor: $(LIMITD_SRC) service/take_floor.go service/take_floor.lua go.mod go.sum
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 $(GO) build -tags benchfloor -trimpath -o $@ ./cmd/limitd

# The module as build-native builds it, with its symbol table, so that the
# attribution names the module's functions (the code is the same).
$(BUILD)/libtokenbucket-symbols.so: $(WASM_SRC) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -buildvcs=false -o $@ ./native
	@rm -f $(@:.so=.h)

ORDINARY_FLAGS ?= -ordinary-perf 4s
bench-ordinary: build setup $(BUILD)/libtokenbucket-symbols.so $(BENCH_BIN)
	@uptime
	$(BENCH_BIN) -ordinary -out docs/benchmarks -module $(BUILD)/libtokenbucket-symbols.so $(ORDINARY_FLAGS)
	@uptime

BENCH_RLS_FLAGS ?=
bench-rls: build setup build-service build-ratelimit $(BUILD)/limitd-symbols $(BUILD)/limitd-floor $(BENCH_BIN)
	uptime
	$(BENCH_BIN) -rls-only -out docs/benchmarks -limitd $(BUILD)/limitd -ratelimit $(RATELIMIT_BIN) -rls-limitd $(BUILD)/limitd-symbols -rls-limitd-floor $(BUILD)/limitd-floor $(BENCH_RLS_FLAGS)
	uptime

BENCH_RLQS_FLAGS ?=
bench-rlqs: build build-native setup build-service $(BENCH_BIN)
	uptime
	$(BENCH_BIN) -rlqs-only -out docs/benchmarks -limitd $(BUILD)/limitd -module $(NATIVE_SO) $(BENCH_RLQS_FLAGS)
	uptime

bench-rlqs-ratio: setup build-service $(BENCH_BIN)
	@uptime
	$(BENCH_BIN) -rlqs-only -rlqs-ratio -out $(BUILD)/bench-rlqs-ratio -limitd $(BUILD)/limitd $(BENCH_RLQS_FLAGS)

$(BUILD)/bench-ops.wasm: bench/internal/footprint/ops/*.go bench/go.mod bench/go.sum
	$(call bench_wasm,./internal/footprint/ops)

ATTRIB_FLAGS ?=
bench-attrib: build setup $(BENCH_BIN) $(BUILD)/bench-ops.wasm
	$(BENCH_BIN) -attrib -ops-wasm $(BUILD)/bench-ops.wasm -out docs/benchmarks $(ATTRIB_FLAGS)

# The attribution's configurations: (1), (9), the plugin's (3), (7), (8),
# the Go floor and each host operation.
PERF_FLAGS ?= -perf 5s -attrib
bench-perf: build setup $(BENCH_BIN) $(BUILD)/bench-ops.wasm
	$(BENCH_BIN) -out docs/benchmarks -ops-wasm $(BUILD)/bench-ops.wasm $(PERF_FLAGS)

# Builds its own unstripped copy of the plugin (build/plugin-profile.wasm)
# so that the guest's runtime.mallocgc can be found by name.
bench-profile: build
	set -o pipefail; \
	$(BENCH_GO) test -v -count=1 -run XXX -bench 'PluginRequest' -benchtime 20000x ./cmd/bench/ | grep -v '^=== '

bench-body: setup build
	BODY_COST=1 $(BENCH_GO) test -count=1 -timeout 15m -v -run TestBodyCallbackCost ./bodycost/ 2>&1 | grep -E -A14 'bodycost_test.go|^(--- |ok|FAIL)'

GUEST_NODE := node --no-liftoff --no-wasm-lazy-compilation
GUEST_REQUESTS ?= 1000000
bench-guest:
	@command -v node >/dev/null || { echo "bench-guest: node is not installed: no guest profile"; exit 0; }; \
	mkdir -p $(BUILD)/footprint && \
	GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath -buildmode=c-shared -o $(BUILD)/footprint/plugin-full.wasm . && \
	uptime && \
	$(GUEST_NODE) bench/cmd/bench/guestprof/host.js $(BUILD)/footprint/plugin-full.wasm 200000 allow && \
	$(GUEST_NODE) bench/cmd/bench/guestprof/host.js $(BUILD)/footprint/plugin-full.wasm 200000 idle && \
	$(GUEST_NODE) bench/cmd/bench/guestprof/host.js $(BUILD)/footprint/plugin-full.wasm 300 body && \
	if ! command -v perf >/dev/null; then echo "bench-guest: perf is not installed (Debian: linux-perf): no per-function profile"; exit 0; fi && \
	perf record -q -e cpu-clock -F 5000 -o $(BUILD)/guest.perf $(GUEST_NODE) --perf-basic-prof \
		--no-logfile-per-isolate --logfile=$(BUILD)/guest-v8.log \
		bench/cmd/bench/guestprof/host.js $(BUILD)/footprint/plugin-full.wasm $(GUEST_REQUESTS) allow && \
	perf report -i $(BUILD)/guest.perf --no-children --sort sym 2>/dev/null | node bench/cmd/bench/guestprof/report.js

bench-idle: setup build build-native
	uptime
	set -o pipefail; \
	IDLE_CPU=1 $(BENCH_GO) test -count=1 -timeout 30m -v -run TestIdleCPUAfterListenerUpdates ./idlecpu/ 2>&1 | grep -E 'idlecpu_test.go|^(--- |ok|FAIL)'
	uptime

bench-delay: setup build build-native
	uptime
	set -o pipefail; \
	DELAY_COST=1 DELAY_PAGE=$(abspath docs/benchmarks/delay.md) $(BENCH_GO) test -count=1 -timeout 30m -v -run TestDelayCost ./delay/ 2>&1 | grep -E 'delay_test.go|^(--- |ok|FAIL)'
	uptime

BENCH_SERVICE_FLAGS ?=
bench-service:
	$(BENCH_GO) run ./cmd/benchservice $(BENCH_SERVICE_FLAGS)

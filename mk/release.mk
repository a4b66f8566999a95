# Versioned release artifacts (docs/compatibility.md, "Getting a release"),
# all from one clean commit, into build/release/<version>/:
#   tokenbucket-<version>.wasm            the plugin (make build: reproducible bytes)
#   tokenbucket-<version>-oci/            its OCI image (Wasm image spec, compat) as a layout,
#   tokenbucket-<version>-oci.tar         and as one archive; summary in tokenbucket-<version>-oci.json
#   istio/*.yaml                          examples/istio's WasmPlugins for that image
#   limitd-<version>-linux-<arch>         the limit service, static
#   limitd-<version>-oci/, -oci.tar       its container image; summary in limitd-<version>-oci.json
#   libtokenbucket-<version>-linux-amd64.so    the native module (make build-native's flags; the
#   libtokenbucket-<version>-linux-arm64.so    other architecture's cross-compiled with Debian's
#                                              cross toolchain: make setup-cross)
#   tokenbucket-native-<version>-linux-<arch>-oci/, -oci.tar   each module's image (make
#                                              oci-native's); summary in ...-oci.json
#   istio/native-envoyfilter.yaml,        examples/istio's and examples/envoy-gateway's native
#   envoy-gateway/native.yaml             manifests for the amd64 module's image, pinned by digest
#   SHA256SUMS                            sha256 of every file above (sha256sum -c SHA256SUMS)
#
# The version is stamped into the plugin, the native module and limitd (BUILD_VERSION, see the
# Makefile): their start lines and `limitd --version` print it.
# VERSION is `git describe --tags` (v0.3.0 on a tagged commit, v0.3.0-2-g1a2b3c4 after it);
# set it to name a release yourself. A tree with uncommitted changes or untracked
# files (any could be built in) is refused,
# unless RELEASE_DIRTY=1 (then the version ends in -dirty). RELEASE_REPO is the
# registry repository the images and manifests name.
#
#   git tag v0.3.0 && make release RELEASE_REPO=ghcr.io/acme
#   make release VERSION=0.3.0-rc1

.PHONY: release

RELEASE_REPO ?= localhost/ratelimit-wasm
RELEASE_NATIVE_ARCHS := amd64 arm64
RELEASE_DIRTY ?=
# Computed once, when release first uses it (not whenever make reads this file).
RELEASE_VERSION = $(eval RELEASE_VERSION := $(or $(VERSION),$(shell git describe --tags 2>/dev/null))$(if \
	$(RELEASE_DIRTY),$(if $(shell git status --porcelain 2>/dev/null),-dirty)))$(RELEASE_VERSION)
RELEASE_DIR = $(BUILD)/release/$(RELEASE_VERSION)

release:
	@test -n "$(RELEASE_VERSION)" || { echo 'release: no version: tag the commit (git tag v0.1.0) or pass VERSION=...'; exit 1; }
	@case "$(RELEASE_VERSION)" in *[!A-Za-z0-9._+-]*) echo 'release: VERSION "$(RELEASE_VERSION)": use letters, digits and ._+- only'; exit 1;; esac
	@if [ -z "$(RELEASE_DIRTY)" ] && [ -n "$$(git status --porcelain 2>/dev/null)" ]; then \
		echo 'release: the tree has uncommitted changes (git status): commit them, or RELEASE_DIRTY=1'; exit 1; fi
	$(MAKE) --no-print-directory setup-cross
	$(MAKE) --no-print-directory build $(LIMITD_OCI_BIN) $(foreach a,$(RELEASE_NATIVE_ARCHS),$(BUILD)/libtokenbucket-linux-$(a).so $(BUILD)/installmodule-linux-$(a)) BUILD_VERSION=$(RELEASE_VERSION)
	rm -rf $(RELEASE_DIR)
	mkdir -p $(RELEASE_DIR)
	cp $(BUILD)/plugin.wasm $(RELEASE_DIR)/tokenbucket-$(RELEASE_VERSION).wasm
	$(GO) run ./cmd/ociimage -wasm $(BUILD)/plugin.wasm -ref $(RELEASE_REPO)/tokenbucket:$(RELEASE_VERSION) \
		-layout $(RELEASE_DIR)/tokenbucket-$(RELEASE_VERSION)-oci -archive $(RELEASE_DIR)/tokenbucket-$(RELEASE_VERSION)-oci.tar \
		-summary $(RELEASE_DIR)/tokenbucket-$(RELEASE_VERSION)-oci.json -render examples/istio -render-out $(RELEASE_DIR)/istio
	cp $(LIMITD_OCI_BIN) $(RELEASE_DIR)/limitd-$(RELEASE_VERSION)-linux-$(LIMITD_OCI_ARCH)
	$(GO) run ./cmd/ociimage -exe $(LIMITD_OCI_BIN) -exe-name limitd -exe-alias /bin/ratelimit -exe-port 8429 -exe-cmd '--listen=:8429' \
		-ref $(RELEASE_REPO)/limitd:$(RELEASE_VERSION) \
		-layout $(RELEASE_DIR)/limitd-$(RELEASE_VERSION)-oci -archive $(RELEASE_DIR)/limitd-$(RELEASE_VERSION)-oci.tar \
		-summary $(RELEASE_DIR)/limitd-$(RELEASE_VERSION)-oci.json
	for a in $(RELEASE_NATIVE_ARCHS); do \
		render=; [ $$a = amd64 ] && render='examples/istio/native-envoyfilter.yaml=$(RELEASE_DIR)/istio examples/envoy-gateway/native.yaml=$(RELEASE_DIR)/envoy-gateway'; \
		name=tokenbucket-native-$(RELEASE_VERSION)-linux-$$a; \
		cp $(BUILD)/libtokenbucket-linux-$$a.so $(RELEASE_DIR)/libtokenbucket-$(RELEASE_VERSION)-linux-$$a.so && \
		$(GO) run ./cmd/ociimage -module $(BUILD)/libtokenbucket-linux-$$a.so -module-installer $(BUILD)/installmodule-linux-$$a -ref $(RELEASE_REPO)/tokenbucket-native:$(RELEASE_VERSION)-$$a \
			-layout $(RELEASE_DIR)/$$name-oci -archive $(RELEASE_DIR)/$$name-oci.tar -summary $(RELEASE_DIR)/$$name-oci.json \
			-render-native "$$render" || exit 1; \
	done
	cd $(RELEASE_DIR) && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS
	@echo "release $(RELEASE_VERSION): $(RELEASE_DIR)"; cat $(RELEASE_DIR)/SHA256SUMS | grep -v -- '-oci/'

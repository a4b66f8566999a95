# The plugin as an OCI image for Istio's WasmPlugin (README.md, Istio): the Wasm
# image specification's compat variant (one gzip tar layer holding
# plugin.wasm), built by cmd/ociimage with go-containerregistry, no Docker
# daemon. It writes, and reads back to verify:
#   build/oci/             OCI image layout (crane push build/oci <ref>, skopeo copy oci:build/oci ...)
#   build/plugin-oci.tar   the same as one archive (skopeo oci-archive:, podman load, docker load)
#   build/plugin-oci.json  the digests: image_sha256 is WasmPlugin spec.sha256 for an oci:// url
#   build/istio/*.yaml     examples/istio's WasmPlugins with url oci://$(OCI_REF) and that sha256
# The image digest depends only on plugin.wasm (and $SOURCE_DATE_EPOCH, if set).
#
#   make oci OCI_REF=ghcr.io/acme/ratelimit:0.1.0
#   make oci-push OCI_REF=ghcr.io/acme/ratelimit:0.1.0   # also push (docker login credentials), pull back, verify
OCI_REF_DEFAULT := localhost/ratelimit-wasm/tokenbucket:dev
OCI_REF ?= $(OCI_REF_DEFAULT)
OCI_ARGS = -wasm $(BUILD)/plugin.wasm -layout $(BUILD)/oci -archive $(BUILD)/plugin-oci.tar \
	-summary $(BUILD)/plugin-oci.json -ref $(OCI_REF) -render examples/istio -render-out $(BUILD)/istio

# The native module as an OCI image (cmd/ociimage -module, oci.BuildModule):
# FROM scratch, one layer holding libtokenbucket.so at its root, so that a
# Kubernetes image volume mounted at a folder D gives D/libtokenbucket.so,
# and cmd/installmodule as its entrypoint, so that as an init container it
# copies the module into an emptyDir mounted at /module: the examples' way,
# since image volumes are typically mounted noexec (docs/compatibility.md,
# "Loading it from an image"). Built for the host's architecture
# (NATIVE_ARCH; make release builds arm64 too). It writes, and reads back
# to verify:
#   build/native-oci/, build/native-oci.tar   the layout and the archive
#   build/native-oci.json                     the digests (image_digest pins the image)
#   build/istio/native-envoyfilter.yaml       examples/istio's native manifests and
#   build/envoy-gateway/native.yaml           examples/envoy-gateway's, with the init containers'
#                                             image set to $(OCI_NATIVE_REF)@<image digest>
# The image digest depends only on libtokenbucket.so (and $SOURCE_DATE_EPOCH, if set).
#
#   make oci-native OCI_NATIVE_REF=ghcr.io/acme/tokenbucket-native:0.1.0
OCI_NATIVE_REF_DEFAULT := localhost/ratelimit-wasm/tokenbucket-native:dev
OCI_NATIVE_REF ?= $(OCI_NATIVE_REF_DEFAULT)

.PHONY: oci-native

oci-native: build-native $(BUILD)/installmodule-linux-$(NATIVE_ARCH)
	$(GO) run ./cmd/ociimage -module $(NATIVE_SO) -module-installer $(BUILD)/installmodule-linux-$(NATIVE_ARCH) -layout $(BUILD)/native-oci -archive $(BUILD)/native-oci.tar \
		-summary $(BUILD)/native-oci.json -ref $(OCI_NATIVE_REF) \
		-render-native 'examples/istio/native-envoyfilter.yaml=$(BUILD)/istio examples/envoy-gateway/native.yaml=$(BUILD)/envoy-gateway'
	@if [ '$(OCI_NATIVE_REF)' = '$(OCI_NATIVE_REF_DEFAULT)' ]; then echo 'note: $(BUILD)/istio/native-envoyfilter.yaml and $(BUILD)/envoy-gateway/native.yaml name $(OCI_NATIVE_REF_DEFAULT), which no cluster pulls: for a cluster, make oci-native OCI_NATIVE_REF=<registry>/<name>:<tag>'; fi

# Strict checks of Istio manifests before applying them (cmd/validateistio,
# package internal/packaging/manifest): every document decoded into Istio's or
# Kubernetes' API type of its kind (unknown fields fail), every WasmPlugin's
# pluginConfig through the plugin's parser as Istio hands it over. The
# manifests' own choices (failStrategy, phase, limits) are not judged.
#
#   make validate-istio                                  build/istio/*.yaml, after make oci and/or make oci-native
#   make validate-istio MANIFESTS='my/wasmplugin.yaml my/limitd.yaml'
#
# Without MANIFESTS it validates build/istio/*.yaml as `make oci` and `make
# oci-native` left them, and never rebuilds or rewrites them: each WasmPlugin
# must name the image of build/plugin-oci.json (its reference and digest),
# and each image a proxy gets the native module from (the init container
# writing the emptyDir it mounts, or an image volume) must be the image of
# build/native-oci.json (<its reference>@<its digest>), so
# manifests rendered for another reference or before the plugin or the
# module changed are refused.
MANIFESTS ?=

.PHONY: oci oci-push validate-istio

oci: build
	$(GO) run ./cmd/ociimage $(OCI_ARGS)
	@if [ '$(OCI_REF)' = '$(OCI_REF_DEFAULT)' ]; then echo 'note: $(BUILD)/istio/*.yaml name $(OCI_REF_DEFAULT), which no cluster pulls: for a cluster, make oci OCI_REF=<registry>/<name>:<tag>'; fi

oci-push: build
	$(GO) run ./cmd/ociimage $(OCI_ARGS) -push

validate-istio:
ifeq ($(MANIFESTS),)
	@ls $(BUILD)/istio/*.yaml >/dev/null 2>&1 && { [ -e $(BUILD)/plugin-oci.json ] || [ -e $(BUILD)/native-oci.json ]; } || { \
		echo 'validate-istio: no $(BUILD)/istio/*.yaml with the summary of the image they name: run make oci OCI_REF=<registry>/<name>:<tag> (the plugin) or make oci-native OCI_NATIVE_REF=<registry>/<name>:<tag> (the native module) first, or pass MANIFESTS=...'; exit 1; }
	@if [ -e $(BUILD)/istio/native-envoyfilter.yaml ] && [ ! -e $(BUILD)/native-oci.json ]; then \
		echo 'validate-istio: $(BUILD)/istio/native-envoyfilter.yaml but no $(BUILD)/native-oci.json: run make oci-native'; exit 1; fi
	@if [ ! -e $(BUILD)/plugin-oci.json ] && ls $(BUILD)/istio/*.yaml | grep -qv '/native-[^/]*\.yaml$$'; then \
		echo 'validate-istio: plugin manifests in $(BUILD)/istio but no $(BUILD)/plugin-oci.json: run make oci'; exit 1; fi
	$(GO) run ./cmd/validateistio $(if $(wildcard $(BUILD)/plugin-oci.json),-image $(BUILD)/plugin-oci.json) \
		$(if $(wildcard $(BUILD)/native-oci.json),-native-image $(BUILD)/native-oci.json) $(BUILD)/istio/*.yaml
else
	$(GO) run ./cmd/validateistio $(MANIFESTS)
endif

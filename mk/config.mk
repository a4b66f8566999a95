# The plugin's configuration checked without Envoy (cmd/checkconfig): the
# plugin's own validation, run natively, prints the line the plugin would
# log in Envoy for a configuration it refuses and exits non-zero. CONFIG is
# one or more files: .json (the configuration itself), .yaml/.yml (an Envoy
# bootstrap or an Istio EnvoyFilter: every Wasm plugin's configuration and
# the native module's filter_config; an Istio WasmPlugin: its
# spec.pluginConfig as Istio hands it over; an Envoy Gateway
# EnvoyExtensionPolicy: the native module's dynamicModule config).
#
#   make lint CONFIG=my-config.json
#   make lint CONFIG='envoy.yaml examples/istio/wasmplugin-gateway.yaml'
#   make lint CONFIG='examples/istio/native-envoyfilter.yaml examples/envoy-gateway/native.yaml'

.PHONY: lint

CONFIG ?=

# go build decides whether the binary is current (about 0.2 s when it is).
lint:
	@test -n "$(CONFIG)" || { echo 'usage: make lint CONFIG=file.json|envoy.yaml|wasmplugin.yaml|envoyfilter.yaml|envoyextensionpolicy.yaml'; exit 2; }
	@mkdir -p $(BUILD)
	@$(GO) build -o $(BUILD)/checkconfig ./cmd/checkconfig
	$(BUILD)/checkconfig $(CONFIG)

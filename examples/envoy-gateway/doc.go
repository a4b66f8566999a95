// Package envoygateway checks examples/envoy-gateway/native.yaml, the native
// module (libtokenbucket.so) as Envoy Gateway loads it: every document is
// decoded strictly by Envoy Gateway's own API types
// (github.com/envoyproxy/gateway/api/v1alpha1) and the Gateway API's, as the
// API server would with field validation Strict, and what the API server
// cannot check is checked here: the EnvoyExtensionPolicy names a module the
// Gateway's EnvoyProxy registers, with the module's filter name and a JSON
// configuration the plugin's engine accepts (the demo rule of envoy.yaml);
// the EnvoyProxy mounts the file where it registers it and sets
// GODEBUG=cgocheck=0 in Envoy's container. docs/native.md's excerpt of the
// example must decode alike and show the example's values. Then a real
// Envoy runs the module configured the way Envoy Gateway's translator
// configures it (that translator is internal to Envoy Gateway's module).
//
// It checks global.yaml and envoy-gateway-values.yaml too, a global limit
// whose rate limit service is limitd's image: both decode strictly (the
// values' config.envoyGateway as the EnvoyGateway configuration it becomes,
// which Envoy Gateway's own validation must accept), the policy is global
// and targets a route of the example's Gateway, and the rate limit
// deployment's image is limitd's. e2e/ratelimit's
// TestEnvoyGatewayControlPlane runs Envoy Gateway's control plane itself.
//
// It is a Go module of its own so that Envoy Gateway and the Kubernetes
// packages it needs never enter the plugin's go.mod; it uses this
// repository's packages through a replace directive. No Kubernetes API
// server, no Envoy Gateway controller: see docs/native.md, "Envoy Gateway".
package envoygateway

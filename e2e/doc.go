// Package e2e holds the end-to-end tests: the real Envoy (from `make setup`)
// running build/plugin.wasm, an upstream of the tests' own, and, where a test
// says so, the limit service and a real redis-server. They skip when Envoy or
// the plugin is missing, except under CI=true, where they fail.
//
// Envoy compiles the plugin with V8 at start-up, which takes several seconds,
// so each test boots one Envoy and runs its checks as subtests.
package e2e

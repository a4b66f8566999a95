// Package e2e holds the end-to-end tests: the real Envoy (from `make setup`)
// running the plugin, an upstream of the tests' own, and, where a test says
// so, the limit service and a real redis-server. A test that runs the plugin
// runs both builds of it from one table (forEachBuild: the subtests "wasm",
// build/plugin.wasm, and "native", build/libtokenbucket.so) with the same
// checks; a case only the Wasm build can have says why it is Wasm-only. They
// skip when Envoy or a build is missing, except under CI=true, where they
// fail.
//
// Envoy compiles the Wasm plugin with V8 at start-up, which takes several
// seconds, so each test boots one Envoy and runs its checks as subtests.
package e2e

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package envoytest runs the real Envoy binary for end-to-end tests and
// benchmarks of the plugin.
//
// The model: a test starts an in-process HTTP upstream ([StartUpstream]),
// then an Envoy process ([Start]) whose bootstrap is a text/template rendered
// with free loopback ports, the plugin's path and its JSON configuration
// ([DemoConfigYAML] is the standard one). It talks to Envoy's listener with a
// keep-alive [Client] and asserts on statuses, headers and the admin /stats
// counters rather than on log lines.
//
// Guarantees:
//   - Everything is bounded in time: start-up waits at most
//     [Options.StartTimeout] ([DefaultStartTimeout] by default) for the admin /ready endpoint to
//     say LIVE, each request times out after [RequestTimeout], and stopping
//     sends SIGTERM, then SIGKILL after [StopGrace].
//   - Every Envoy is stopped in t.Cleanup; one that died on its own during the
//     test (a crash in the Wasm VM, say) fails the test with the tail of its
//     log. The process also gets SIGKILL if the test binary dies.
//   - Several Envoys can run at once: each runs with --disable-hot-restart, so
//     none uses the shared memory or domain socket that --base-id names.
//   - Only loopback addresses are used.
//
// The binaries come from the environment, as the Makefile exports them:
// ENVOY_BIN (see [EnvoyBin]) and PLUGIN_WASM (see [PluginWasm]). When one is
// missing the test is skipped, unless CI=true, where it fails.
//
// Methods that take no testing.TB but fail the test on error (Stats, Stat,
// WaitStat, WaitLog, RSS) use the t given to [Start] and must be called from
// the test's goroutine. [Client] never touches t and is safe for concurrent
// use.
package envoytest

import (
	"os"
	"strconv"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/loopback"
)

// EnvoyBin returns the path of the Envoy binary named by the environment
// variable ENVOY_BIN. When it is unset or names no file, the test is skipped,
// or fails when the environment variable CI is true.
func EnvoyBin(t testing.TB) string {
	t.Helper()
	return binFromEnv(t, "ENVOY_BIN", "run `make setup` to install Envoy 1.40.0")
}

// PluginWasm returns the path of the compiled plugin named by the environment
// variable PLUGIN_WASM. When it is unset or names no file, the test is
// skipped, or fails when the environment variable CI is true.
func PluginWasm(t testing.TB) string {
	t.Helper()
	return binFromEnv(t, "PLUGIN_WASM", "run `make build` to build the plugin")
}

func binFromEnv(t testing.TB, name, hint string) string {
	t.Helper()
	p := os.Getenv(name)
	var why string
	switch {
	case p == "":
		why = name + " is not set"
	default:
		st, err := os.Stat(p)
		switch {
		case err != nil:
			why = name + ": " + err.Error()
		case st.IsDir():
			why = name + ": " + p + " is a directory"
		default:
			return p
		}
	}
	if inCI() {
		t.Fatalf("envoytest: %s (%s)", why, hint)
	}
	t.Skipf("envoytest: %s (%s)", why, hint)
	return ""
}

// inCI reports whether the environment variable CI holds a true value.
func inCI() bool {
	ci, err := strconv.ParseBool(os.Getenv("CI"))
	return err == nil && ci
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago: it
// binds port 0, reads the port the kernel chose and closes the socket.
// Another process may take it before it is used; [Start] retries when Envoy
// fails to bind a port it chose.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatalf("envoytest: free port: %v", err)
	}
	return p
}

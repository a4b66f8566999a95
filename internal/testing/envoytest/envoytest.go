// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package envoytest wraps package envoy (the Envoy func-e's tool resolves) for tests:
// [Start] fails the test instead of returning an error and stops Envoy in
// t.Cleanup; [Envoy]'s Stat, Stats, WaitStat, WaitLog and RSS fail the test
// on error. It also holds the tests' in-process HTTP upstream
// ([StartUpstream]) and keep-alive [Client].
//
// One test runs either build of the plugin ([Build]: the Wasm module or the
// native module) from the same JSON configuration: Options.Build picks the
// main listener's, [PluginListener] a listener's, and [Envoy.PluginStat]
// reads the plugin's metrics under either build's prefix.
//
// Locally a test whose Envoy or plugin (of the build it runs) is missing is
// skipped; under CI=true it fails. Methods that fail the test must be called
// from its goroutine; [Client] is safe for concurrent use.
package envoytest

import (
	"cmp"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

// Options and TemplateData are package envoy's; DemoConfigYAML is its one
// bootstrap template.
type (
	Options      = envoy.Options
	TemplateData = envoy.TemplateData
	Listener     = envoy.Listener
	Build        = envoy.Build
)

// The builds of the plugin; Builds lists both.
const (
	Wasm   = envoy.Wasm
	Native = envoy.Native
)

var Builds = envoy.Builds

// DemoConfigYAML is envoy.Bootstrap: a listener whose Wasm filter runs the
// plugin (unless Options.NoWasm), the cluster "upstream" (Envoy answers
// directly when Options.UpstreamPort is 0) and, when Options.ServicePort is
// set, the cluster "limit_service". Plugin metrics read as
// PluginStat("tokenbucket.<name>") for either build (Stat sees them as
// "wasmcustom.tokenbucket.<name>" or "dynamicmodulescustom.tokenbucket.<name>"),
// the listener's as Stat("http.ingress.<name>").
var DemoConfigYAML = envoy.Bootstrap

// RenderConfig is envoy.Render.
func RenderConfig(tmpl string, d TemplateData) (string, error) { return envoy.Render(tmpl, d) }

// Envoy is a running Envoy tied to a test.
type Envoy struct {
	*envoy.Process
	t testing.TB
}

// Needs skips the test (fails it under CI=true) unless func-e's tool finds
// Envoy in its home and, when plugin is true, the Wasm plugin is built.
func Needs(t testing.TB, plugin bool) {
	t.Helper()
	if _, err := envoy.Which("", ""); err != nil {
		ci.Skip(t, "envoytest: %v", err)
	}
	if plugin {
		PluginWasm(t)
	}
}

// NeedsBuild is Needs for build b of the plugin.
func NeedsBuild(t testing.TB, b Build) {
	t.Helper()
	Needs(t, false)
	PluginPath(t, b)
}

// PluginPath is the file of build b: PluginWasm or NativeModule.
func PluginPath(t testing.TB, b Build) string {
	t.Helper()
	if b == Native {
		return NativeModule(t)
	}
	return PluginWasm(t)
}

// NativeModule returns $NATIVE_MODULE, else build/libtokenbucket.so of this
// checkout, skipping the test (failing it under CI=true) when it names no
// file.
func NativeModule(t testing.TB) string {
	t.Helper()
	p := cmp.Or(os.Getenv("NATIVE_MODULE"), envoy.DefaultNativeModule())
	if st, err := os.Stat(p); p == "" || err != nil || st.IsDir() {
		ci.Skip(t, "envoytest: NATIVE_MODULE=%q names no file (run `make build-native`)", p)
	}
	return p
}

// PluginListener returns l running build b of the plugin (its Wasm or
// Native path set, the other cleared) with l.PluginConfig.
func PluginListener(t testing.TB, b Build, l Listener) Listener {
	t.Helper()
	l.Wasm, l.Native = "", ""
	if b == Native {
		l.Native = NativeModule(t)
	} else {
		l.Wasm = PluginWasm(t)
	}
	return l
}

// PluginWasm returns $PLUGIN_WASM, skipping the test (failing it under
// CI=true) when it names no file.
func PluginWasm(t testing.TB) string {
	t.Helper()
	p := os.Getenv("PLUGIN_WASM")
	if st, err := os.Stat(p); p == "" || err != nil || st.IsDir() {
		ci.Skip(t, "envoytest: PLUGIN_WASM=%q names no file (run `make build`)", p)
	}
	return p
}

// needs is Needs for what opts run: the Wasm plugin when its path comes
// from the environment, the native module (filled into opts) when the main
// listener runs that build.
func needs(t testing.TB, opts *Options) {
	t.Helper()
	custom := opts.Config != "" && opts.Config != envoy.Bootstrap
	switch {
	case custom:
		Needs(t, strings.Contains(opts.Config, ".PluginWasm") && opts.PluginWasm == "")
	case opts.NoWasm || len(opts.Listeners) > 0:
		Needs(t, false)
	case opts.Build == Native:
		Needs(t, false)
		if opts.NativeModule == "" {
			opts.NativeModule = NativeModule(t)
		}
	default:
		Needs(t, opts.PluginWasm == "")
	}
}

// Start starts Envoy and waits until it serves; see envoy.Start. Envoy is
// stopped in t.Cleanup, and the test fails if it exited on its own before.
func Start(t testing.TB, opts Options) *Envoy {
	t.Helper()
	needs(t, &opts)
	if opts.Dir == "" {
		opts.Dir = t.TempDir() // kept after Stop, for the log
	}
	p, err := envoy.Start(opts)
	if err != nil {
		t.Fatalf("envoytest: %v", err)
	}
	e := &Envoy{Process: p, t: t}
	t.Cleanup(func() {
		if p.Exited() && !p.Stopped() {
			t.Errorf("envoytest: envoy exited during the test (code %d)\n%s", p.ExitCode(), envoy.Tail(p.Log(), 40))
		} else if t.Failed() {
			t.Logf("envoytest: the test failed; envoy's log tail:\n%s", envoy.Tail(p.Log(), 40))
		}
		e.Stop()
	})
	return e
}

// Stop stops Envoy (SIGTERM, then SIGKILL) and returns its exit code.
func (e *Envoy) Stop() int {
	code, err := e.Process.Stop()
	if err != nil {
		e.t.Errorf("envoytest: %v", err)
	}
	return code
}

// PID is Envoy's process id.
func (e *Envoy) PID() int {
	e.t.Helper()
	pid, err := e.Process.PID()
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return pid
}

// Client returns a new keep-alive client for the listener.
func (e *Envoy) Client() *Client { return NewClient(e.URL("")) }

// Stats returns every counter and gauge of /stats.
func (e *Envoy) Stats() map[string]uint64 {
	e.t.Helper()
	m, err := e.Process.Stats("")
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return m
}

// Stat returns the counter or gauge name, 0 when Envoy has none.
func (e *Envoy) Stat(name string) uint64 {
	e.t.Helper()
	v, _, err := e.Process.Stat(name)
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return v
}

// PluginStat returns the plugin's counter or gauge name (as the plugin
// defines it: "tokenbucket.rule.x.allowed") under the prefix of the build
// this Envoy runs, 0 when Envoy has none.
func (e *Envoy) PluginStat(name string) uint64 {
	e.t.Helper()
	return e.Stat(e.Build().StatPrefix() + name)
}

// WaitPluginStat is WaitStat for the plugin's counter or gauge name.
func (e *Envoy) WaitPluginStat(name string, want uint64, timeout time.Duration) {
	e.t.Helper()
	e.WaitStat(e.Build().StatPrefix()+name, want, timeout)
}

// WaitStat waits until the counter or gauge name equals want, at most timeout.
func (e *Envoy) WaitStat(name string, want uint64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, found, err := e.Process.Stat(name)
		if err != nil {
			e.t.Fatalf("envoytest: %v", err)
		}
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("envoytest: stat %s = %d (present: %v) after %v, want %d", name, v, found, timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitLog waits until a line of the log contains substr and returns it.
func (e *Envoy) WaitLog(substr string, timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		exited := e.Exited()
		if line := e.LogLine(substr); line != "" {
			return line
		}
		if exited || time.Now().After(deadline) {
			e.t.Fatalf("envoytest: no log line contains %q after %v (envoy exited: %v)\n%s",
				substr, timeout, exited, envoy.Tail(e.Log(), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CPU is the processor time Envoy has used so far, user and system.
func (e *Envoy) CPU() time.Duration {
	e.t.Helper()
	v, err := e.Process.CPU()
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return v
}

// RSS is Envoy's resident memory in bytes.
func (e *Envoy) RSS() uint64 {
	e.t.Helper()
	v, err := e.Process.RSS()
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return v
}

// WriteLDS replaces the listener file (Options.LDS) with version and pluginConfig.
func (e *Envoy) WriteLDS(version, pluginConfig string) {
	e.t.Helper()
	if err := e.Process.WriteLDS(version, &pluginConfig); err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
}

// Outcome says how Envoy refused to start.
type Outcome int

const (
	// Exited: the process exited during start-up (Envoy 1.40 does, code 1,
	// when a plugin on a static listener rejects its configuration).
	Exited Outcome = iota + 1
	// ListenerRefused: Envoy became LIVE but its listener refused connections.
	ListenerRefused
	// NeverReady: Envoy neither exited nor became LIVE, idle longer than the
	// timeout (see envoy.Process.WaitReady).
	NeverReady
)

func (o Outcome) String() string {
	return [...]string{"Outcome(0)", "exited", "listener refused", "never ready"}[min(int(o), 3)]
}

// StartFailure describes how Envoy refused a configuration.
type StartFailure struct {
	Outcome  Outcome
	ExitCode int    // -1 when Envoy was killed by a signal (a start that never became ready is stopped)
	Log      string // the whole log
}

func (f StartFailure) String() string { return f.Outcome.String() }

// ExpectStartFailure starts Envoy with a configuration it should refuse and
// reports how; the test fails if Envoy serves its listener within 2 s of
// becoming LIVE.
func ExpectStartFailure(t testing.TB, opts Options) StartFailure {
	t.Helper()
	needs(t, &opts)
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	p, err := envoy.Spawn(opts)
	if err != nil {
		t.Fatalf("envoytest: %v", err)
	}
	defer p.Stop()
	failure := func(o Outcome) StartFailure {
		p.Stop()
		return StartFailure{Outcome: o, ExitCode: p.ExitCode(), Log: p.Log()}
	}
	timeout := cmp.Or(opts.StartTimeout, envoy.DefaultStartTimeout)
	switch err := p.WaitReady(timeout); {
	case errors.Is(err, envoy.ErrExited):
		return failure(Exited)
	case errors.Is(err, envoy.ErrNotLive):
		return failure(NeverReady)
	case err != nil:
		return failure(ListenerRefused)
	}
	t.Fatalf("envoytest: envoy started and serves; want a refused configuration\n%s", envoy.Tail(p.Log(), 40))
	return StartFailure{}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := loopback.FreePort()
	if err != nil {
		t.Fatalf("envoytest: free port: %v", err)
	}
	return p
}

// EnvoyBin is the Envoy binary func-e's tool resolves (skipping the test,
// or failing it under CI=true, when it is missing).
func EnvoyBin(t testing.TB) string {
	t.Helper()
	bin, err := envoy.Which("", "")
	if err != nil {
		ci.Skip(t, "envoytest: %v", err)
	}
	return bin
}

package plugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

const sec = int64(1e9)

// clock is the test's time, Unix ns.
type clock struct{ t int64 }

func (c *clock) now() int64 { return c.t }

// emulator is one plugin in the SDK's host emulator.
type emulator struct {
	t    *testing.T
	host proxytest.HostEmulator
	clk  *clock
}

func start(t *testing.T, cfg string, opts ...func(*proxytest.EmulatorOption, *vmContext)) *emulator {
	t.Helper()
	clk := &clock{t: 1_000 * sec}
	vm := &vmContext{now: clk.now, sd: sharedData{}}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg)).
		WithProperty([]string{"source", "address"}, []byte("10.0.0.1:4242"))
	for _, o := range opts {
		o(opt, vm)
	}
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v; critical logs: %v", st, host.GetCriticalLogs())
	}
	return &emulator{t: t, host: host, clk: clk}
}

// response is what a client saw.
type response struct {
	status  int
	headers map[string]string
	body    string
}

// do runs one request through the plugin and, when it continues, an
// upstream 200.
func (e *emulator) do(headers ...string) response {
	e.t.Helper()
	id := e.host.InitializeHttpContext()
	action := e.host.CallOnRequestHeaders(id, requestHeaders(headers), false)
	var r response
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		if action != types.ActionPause {
			e.t.Fatalf("local reply sent but action %v", action)
		}
		r = response{status: int(lr.StatusCode), body: string(lr.Data), headers: map[string]string{}}
		for _, h := range lr.Headers {
			r.headers[h[0]] = h[1]
		}
		e.host.CallOnResponseHeaders(id, lr.Headers, false)
		if got := len(e.host.GetCurrentResponseHeaders(id)); got != len(lr.Headers) {
			e.t.Fatalf("the local reply's headers were added to again: %d, want %d", got, len(lr.Headers))
		}
	} else {
		e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		r = response{status: 200, headers: map[string]string{}}
		for _, h := range e.host.GetCurrentResponseHeaders(id)[1:] { // after :status
			if _, dup := r.headers[h[0]]; dup {
				e.t.Fatalf("header %s added twice", h[0])
			}
			r.headers[h[0]] = h[1]
		}
	}
	e.host.CompleteHttpContext(id)
	return r
}

// requestHeaders are a GET / with the given name/value pairs added; a
// pseudo-header given replaces the default.
func requestHeaders(kv []string) [][2]string {
	hs := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "example"}}
next:
	for i := 0; i+1 < len(kv); i += 2 {
		for j := range hs {
			if hs[j][0] == kv[i] {
				hs[j][1] = kv[i+1]
				continue next
			}
		}
		hs = append(hs, [2]string{kv[i], kv[i+1]})
	}
	return hs
}

func (e *emulator) counter(name string) uint64 {
	e.t.Helper()
	v, err := e.host.GetCounterMetric("tokenbucket." + name)
	if err != nil {
		e.t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

const perKey = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 2, "burst": 4, "cost_source": "header:x-cost", "default_cost": 1}}]}`

func TestBadConfigurationRefused(t *testing.T) {
	vm := &vmContext{now: (&clock{}).now, sd: sharedData{}}
	bad := `{"rules": [{"name": "x", "limit_keys": ["header:k"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(bad)))
	defer reset()
	if st := host.StartPlugin(); st != types.OnPluginStartStatusFailed {
		t.Fatalf("StartPlugin = %v, want failed", st)
	}
	logs := strings.Join(host.GetCriticalLogs(), "\n")
	if !strings.Contains(logs, "rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5") {
		t.Fatalf("critical log %q does not say why", logs)
	}
}

// TestReusedContextStartsClean: the HTTP context of a finished request is
// reused by the next one (OnHttpStreamDone), which must see none of the
// first one's values, plan or headers.
func TestReusedContextStartsClean(t *testing.T) {
	e := start(t, `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "missing_key": "skip",
	  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`)
	if r := e.do("x-api-key", "a"); r.status != 200 || r.headers["ratelimit-remaining"] != "0" {
		t.Fatalf("first request: %d %v, want 200 with 0 remaining", r.status, r.headers)
	}
	if r := e.do(); r.status != 200 || len(r.headers) != 0 {
		t.Fatalf("request without the key (no rule applies): %d %v, want 200 without headers", r.status, r.headers)
	}
	if r := e.do("x-api-key", "b"); r.status != 200 || r.headers["ratelimit-remaining"] != "0" {
		t.Fatalf("another key: %d %v, want 200 with 0 remaining (its own bucket)", r.status, r.headers)
	}
	if r := e.do("x-api-key", "a"); r.status != 429 {
		t.Fatalf("first key again: %d, want 429", r.status)
	}
}

// TestCheckConfigurationIsTheLoggedLine: for configurations the plugin
// refuses, CheckConfiguration's text is the critical line OnPluginStart
// logs, byte for byte; for one it accepts, it is nil and the plugin starts.
func TestCheckConfigurationIsTheLoggedLine(t *testing.T) {
	for _, cfg := range []string{
		`{"rules": [{"name": "x", "limit_keys": ["header:k"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`,
		`{"no_such_field": 1}`,
		``,
		`{"rules": [`,
		`{"service": {"cluster": "limitd"}, "rules": [{"name": "a", "scope": "cluster", "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}, {"name": "b", "scope": "cluster",
		  "service": {"cluster": "limitd", "failure_mode": "deny"}, "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`,
		perKey,
	} {
		vm := &vmContext{now: (&clock{}).now, sd: sharedData{}}
		host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg)))
		st := host.StartPlugin()
		logs := host.GetCriticalLogs()
		reset()
		err := engine.CheckConfiguration([]byte(cfg))
		if err == nil {
			if st != types.OnPluginStartStatusOK || len(logs) != 0 {
				t.Errorf("%s: CheckConfiguration accepts it, but StartPlugin = %v, critical logs %q", cfg, st, logs)
			}
			continue
		}
		if st != types.OnPluginStartStatusFailed || len(logs) != 1 || logs[0] != err.Error() {
			t.Errorf("%s: StartPlugin = %v, critical logs %q; CheckConfiguration: %q", cfg, st, logs, err)
		}
		var re *engine.RefusalError
		if !errors.As(err, &re) {
			t.Errorf("%s: CheckConfiguration = %T, want *engine.RefusalError", cfg, err)
		}
	}
}

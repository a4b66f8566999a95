package plugin

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
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

func TestBurstRefillAndHeaders(t *testing.T) {
	e := start(t, perKey)
	for i := 0; i < 4; i++ {
		r := e.do("x-api-key", "a")
		if r.status != 200 {
			t.Fatalf("request %d: %d, want 200", i, r.status)
		}
		want := map[string]string{
			"ratelimit-policy":    `"per-key";q=4;w=2`,
			"ratelimit":           `"per-key";r=` + strconv.Itoa(3-i) + ";t=" + strconv.Itoa((i+2)/2),
			"ratelimit-limit":     "4",
			"ratelimit-remaining": strconv.Itoa(3 - i),
			"ratelimit-reset":     strconv.Itoa((i + 2) / 2),
		}
		for k, v := range want {
			if r.headers[k] != v {
				t.Errorf("request %d: %s = %q, want %q", i, k, r.headers[k], v)
			}
		}
	}
	r := e.do("x-api-key", "a")
	if r.status != 429 {
		t.Fatalf("5th request: %d, want 429", r.status)
	}
	ra, _ := strconv.Atoi(r.headers["retry-after"])
	if ra < 1 || ra > 1 { // base 1 s (0.5 s rounded up), at most 1.5 × base
		t.Errorf("retry-after = %q, want 1", r.headers["retry-after"])
	}
	if r.headers["x-ratelimit-reason"] != "token_bucket_exceeded" || r.headers["ratelimit"] != `"per-key";r=0;t=1` {
		t.Errorf("rejection headers: %v", r.headers)
	}
	if !strings.Contains(r.body, `"reason":"token_bucket_exceeded"`) {
		t.Errorf("body %q", r.body)
	}
	if got := e.do("x-api-key", "b"); got.status != 200 {
		t.Errorf("another key: %d, want 200 (keys are isolated)", got.status)
	}
	e.clk.t += sec / 2 // one token back
	if got := e.do("x-api-key", "a"); got.status != 200 {
		t.Errorf("after refill: %d, want 200", got.status)
	}
	if got := e.do("x-api-key", "a"); got.status != 429 {
		t.Errorf("after one refilled token: %d, want 429", got.status)
	}
	if a, r := e.counter("rule.per-key.allowed"), e.counter("rule.per-key.rejected"); a != 6 || r != 2 {
		t.Errorf("allowed, rejected = %d, %d; want 6, 2", a, r)
	}
}

func TestRetryAfterJitter(t *testing.T) {
	cfg := `{"rules": [{"name": "slow", "limit_keys": ["header:k"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.1, "burst": 1}}]}`
	e := start(t, cfg)
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		k := "client-" + strconv.Itoa(i)
		e.do("k", k)
		r := e.do("k", k)
		ra, err := strconv.Atoi(r.headers["retry-after"])
		if r.status != 429 || err != nil || ra < 10 || ra > 15 {
			t.Fatalf("client %d: status %d retry-after %q, want 429 within [10, 15]", i, r.status, r.headers["retry-after"])
		}
		if again := e.do("k", k); again.headers["retry-after"] != r.headers["retry-after"] {
			t.Fatalf("client %d: retry-after changed from %s to %s", i, r.headers["retry-after"], again.headers["retry-after"])
		}
		seen[r.headers["retry-after"]] = true
	}
	if len(seen) < 3 {
		t.Errorf("retry-after took only %d values over 40 clients: no jitter", len(seen))
	}
}

func TestCost(t *testing.T) {
	e := start(t, perKey)
	if r := e.do("x-api-key", "a", "x-cost", "3"); r.headers["ratelimit-remaining"] != "1" {
		t.Fatalf("cost 3: remaining %q, want 1", r.headers["ratelimit-remaining"])
	}
	for _, bad := range []string{"", "abc", "NaN", "-1", "0", "Inf", "1e400"} {
		e.clk.t += 10 * sec
		if r := e.do("x-api-key", "a", "x-cost", bad); r.headers["ratelimit-remaining"] != "3" {
			t.Errorf("cost %q: remaining %q, want 3 (default cost)", bad, r.headers["ratelimit-remaining"])
		}
	}
	e.clk.t += 10 * sec
	if r := e.do("x-api-key", "a", "x-cost", "0.5"); r.headers["ratelimit-remaining"] != "3" {
		t.Errorf("cost 0.5: remaining %q, want 3 (floor of 3.5)", r.headers["ratelimit-remaining"])
	}
	r := e.do("x-api-key", "a", "x-cost", "5")
	if r.status != 429 || r.headers["x-ratelimit-reason"] != "cost_exceeds_burst" || r.headers["retry-after"] != "" {
		t.Errorf("cost above burst: %d %v", r.status, r.headers)
	}
	if r := e.do("x-api-key", "a"); r.headers["ratelimit-remaining"] != "2" {
		t.Errorf("after the oversized request: remaining %q, want 2 (bucket untouched)", r.headers["ratelimit-remaining"])
	}
}

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

// brokenData fails every call, as a host whose shared data is unavailable.
type brokenData struct{}

func (brokenData) Get(string) ([]byte, uint32, error) { return nil, 0, errors.New("host: broken") }
func (brokenData) Set(string, []byte, uint32) error   { return errors.New("host: broken") }

func TestFailOpen(t *testing.T) {
	e := start(t, perKey, func(_ *proxytest.EmulatorOption, vm *vmContext) { vm.sd = brokenData{} })
	for i := 0; i < 10; i++ {
		if r := e.do("x-api-key", "a"); r.status != 200 {
			t.Fatalf("request %d: %d, want 200 (fail open)", i, r.status)
		}
	}
	if got := e.counter("rule.per-key.failed_open"); got != 10 {
		t.Fatalf("failed_open = %d, want 10", got)
	}
}

var _ slots.SharedData = brokenData{}

func TestIPIgnoresSpoofedXFF(t *testing.T) {
	cfg := `{"rules": [{"name": "ip", "limit_keys": ["ip:address"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`
	e := start(t, cfg)
	for i := 0; i < 2; i++ {
		e.do("x-forwarded-for", "192.0.2."+strconv.Itoa(i))
	}
	if r := e.do("x-forwarded-for", "198.51.100.7"); r.status != 429 {
		t.Fatalf("a spoofed X-Forwarded-For gave a fresh bucket: %d", r.status)
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

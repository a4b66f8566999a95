package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// The native module (native/, build/libtokenbucket.so) on real Envoy: the
// same configuration as the Wasm plugin's tests, loaded by Envoy's
// dynamic-module filter.

// nativeDir is the folder of libtokenbucket.so ($NATIVE_SO's, else
// build/), skipping the test (failing it under CI=true) when it is not
// built.
func nativeDir(t *testing.T) string {
	t.Helper()
	so := os.Getenv("NATIVE_SO")
	if so == "" {
		so = filepath.Join("..", "build", "libtokenbucket.so")
	}
	abs, err := filepath.Abs(so)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		ci.Skip(t, "native: %s is not built (run `make build-native`)", abs)
	}
	return filepath.Dir(abs)
}

// nativeFilter is the dynamic-module filter running pluginConfig, as YAML
// for envoytest.Options.Filters.
func nativeFilter(t *testing.T, pluginConfig string) string {
	t.Helper()
	value, err := json.Marshal(pluginConfig) // a JSON string is a YAML string
	if err != nil {
		t.Fatal(err)
	}
	return `- name: envoy.filters.http.dynamic_modules
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
    dynamic_module_config: {name: tokenbucket, do_not_close: true}
    filter_name: tokenbucket
    filter_config:
      "@type": type.googleapis.com/google.protobuf.StringValue
      value: ` + string(value)
}

// nativeOptions are the options of an Envoy running the native module
// with pluginConfig, and the environment it needs (Envoy's own, not the
// test process's, so tests run side by side).
func nativeOptions(t *testing.T, pluginConfig string, upstreamPort int) envoytest.Options {
	t.Helper()
	return envoytest.Options{NoWasm: true, Filters: nativeFilter(t, pluginConfig),
		UpstreamPort: upstreamPort, Concurrency: 4,
		Env: []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + nativeDir(t), "GODEBUG=cgocheck=0"}}
}

const nativePrefix, wasmPrefix = "dynamicmodulescustom.tokenbucket.", "wasmcustom.tokenbucket."

func TestNative(t *testing.T) {
	t.Parallel()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, nativeOptions(t, mainConfig, up.Port()))
	c := e.Client()
	t.Cleanup(c.Close)

	t.Run("concurrent burst admits exactly burst over 4 workers", func(t *testing.T) {
		for round, key := range []string{"burst-1", "burst-2", "burst-3"} {
			res := c.Burst(200, func(int) *http.Request {
				return c.NewRequest("GET", "/exact", map[string]string{"x-api-key": key})
			})
			st := envoytest.Statuses(res)
			if st[200] != 50 || st[429] != 150 {
				t.Fatalf("round %d: statuses %v, want exactly 50 admitted and 150 rejected", round, st)
			}
		}
		if n := e.Stat(nativePrefix + "rule.exact.failed_open"); n != 0 {
			t.Fatalf("%d requests failed open during the bursts", n)
		}
		if n := e.Stat(nativePrefix + "panics"); n != 0 {
			t.Fatalf("%d panics", n)
		}
		t.Logf("CAS retries: %d", e.Stat(nativePrefix+"cas_retries"))
		// The bursts were served by several workers, each with its own
		// engine: exactness came from the shared store.
		workers := 0
		for name, v := range e.Stats() {
			if strings.Contains(name, ".worker_") && strings.HasSuffix(name, ".downstream_cx_total") && v > 0 {
				workers++
			}
		}
		if workers < 2 {
			t.Fatalf("the bursts reached %d workers, want several", workers)
		}
	})
}

// TestNativeDemoRule: the demo's rule (envoy.yaml's, the one `make
// run-native` runs) admits exactly its burst of 200 concurrent requests
// over 4 workers, per key.
func TestNativeDemoRule(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	if err := yaml.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	confs := wasmConfigurations(tree)
	if len(confs) != 1 {
		t.Fatalf("envoy.yaml has %d plugin configurations, want 1", len(confs))
	}
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, nativeOptions(t, confs[0], up.Port()))
	c := e.Client()
	t.Cleanup(c.Close)
	for _, key := range []string{"a", "b"} {
		res := c.Burst(200, func(int) *http.Request { return c.NewRequest("GET", "/", map[string]string{"x-api-key": key}) })
		if st := envoytest.Statuses(res); st[200] != 5 || st[429] != 195 {
			t.Fatalf("key %s: statuses %v, want exactly the burst of 5 admitted", key, st)
		}
	}
}

// TestNativeSameAsWasm sends the same requests to the Wasm plugin and to
// the native module, each in its own Envoy with the same configuration,
// and demands the same statuses, rate-limit headers, bodies and metrics.
func TestNativeSameAsWasm(t *testing.T) {
	t.Parallel()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	wasm := envoytest.Start(t, envoytest.Options{Config: envoytest.DemoConfigYAML, PluginConfig: mainConfig,
		UpstreamPort: up.Port(), Concurrency: 4})
	native := envoytest.Start(t, nativeOptions(t, mainConfig, up.Port()))
	wc, nc := wasm.Client(), native.Client()
	t.Cleanup(wc.Close)
	t.Cleanup(nc.Close)

	type step struct{ path, key, cost string }
	var steps []step
	for i := range 3 {
		steps = append(steps, step{"/slow", "same-slow", ""}, step{"/api/same", "same-" + strconv.Itoa(i), "7"})
	}
	for range 8 {
		steps = append(steps, step{"/api/same", "same-big", "9"})
	}
	steps = append(steps, step{"/api/same", "same-big", "lots"}, step{"/exact", "", ""}, step{"/other", "x", ""})
	var slowest time.Duration // the longest request yet, to either Envoy
	for i, s := range steps {
		h := map[string]string{}
		if s.key != "" {
			h["x-api-key"] = s.key
		}
		if s.cost != "" {
			h["x-cost"] = s.cost
		}
		sent := time.Now()
		w := wc.Get(s.path, h)
		between := time.Now()
		n := nc.Get(s.path, h)
		slowest = max(slowest, between.Sub(sent), time.Since(between))
		if w.Err != nil || n.Err != nil {
			t.Fatalf("step %d: %v / %v", i, w.Err, n.Err)
		}
		if w.Status != n.Status || string(w.Body) != string(n.Body) {
			t.Errorf("step %d %+v: Wasm %d %q, native %d %q", i, s, w.Status, w.Body, n.Status, n.Body)
		}
		// The two Envoys' buckets refill on their own clocks. A bucket's
		// age when one Envoy decides differs from its age when the other
		// does by at most four requests' time (each Envoy is asked right
		// after the other answers, at its first step and at this one): the
		// numbers may differ by what that refills at the /api rule's 10
		// tokens a second, plus 1 for a whole number rounded either way.
		slack := int64(10*4*slowest.Seconds()) + 1
		if wh, nh := limitHeaders(w.Header), limitHeaders(n.Header); !sameUpTo(wh, nh, slack) {
			t.Errorf("step %d %+v: headers differ by more than %d\nWasm:   %s\nnative: %s", i, s, slack, wh, nh)
		}
	}

	ws, ns := suffixes(wasm.Stats(), wasmPrefix), suffixes(native.Stats(), nativePrefix)
	for name, v := range ws {
		nv, ok := ns[name]
		switch {
		case !ok:
			t.Errorf("the native module has no metric %s%s", nativePrefix, name)
		case strings.HasPrefix(name, "memory."):
			// the Go runtime's figures: one process, not one VM per worker
		case nv != v:
			t.Errorf("%s: Wasm %d, native %d", name, v, nv)
		}
	}
	for name := range ns {
		if _, ok := ws[name]; !ok && name != "panics" {
			t.Errorf("the native module has a metric the Wasm plugin lacks: %s%s", nativePrefix, name)
		}
	}
}

// limitHeaders is the response headers a rule decides, in one line.
func limitHeaders(h http.Header) string {
	var out []string
	for k, vs := range h {
		switch strings.ToLower(k) {
		case "date", "x-envoy-upstream-service-time", "server":
			continue
		}
		out = append(out, strings.ToLower(k)+": "+strings.Join(vs, ", "))
	}
	slices.Sort(out)
	return strings.Join(out, " | ")
}

// sameUpTo reports whether a and b are the same text but for their
// integers, each pair of which differs by at most slack.
func sameUpTo(a, b string, slack int64) bool {
	an, bn := digits.FindAllString(a, -1), digits.FindAllString(b, -1)
	if digits.ReplaceAllString(a, "#") != digits.ReplaceAllString(b, "#") || len(an) != len(bn) {
		return false
	}
	for i := range an {
		x, _ := strconv.ParseInt(an[i], 10, 64)
		y, _ := strconv.ParseInt(bn[i], 10, 64)
		if x-y > slack || y-x > slack {
			return false
		}
	}
	return true
}

var digits = regexp.MustCompile(`[0-9]+`)

// suffixes is the stats whose names start with prefix, by the rest.
func suffixes(stats map[string]uint64, prefix string) map[string]uint64 {
	m := map[string]uint64{}
	for k, v := range stats {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			m[rest] = v
		}
	}
	return m
}

// TestNativeRefusals: Envoy refuses the filter when the engine refuses the
// configuration (its text, with the JSON path, in Envoy's log) and when
// Envoy's environment lacks GODEBUG=cgocheck=0 (a line saying how to set
// it), instead of aborting.
func TestNativeRefusals(t *testing.T) {
	t.Parallel()
	t.Run("configuration", func(t *testing.T) {
		bad := `{"rules": [{"name": "r", "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`
		want := engine.CheckConfiguration([]byte(bad))
		if want == nil {
			t.Fatal("the engine accepts the configuration meant to be refused")
		}
		f := envoytest.ExpectStartFailure(t, nativeOptions(t, bad, 0))
		if !strings.Contains(f.Log, want.Error()) {
			t.Fatalf("%v; Envoy's log lacks the engine's refusal %q:\n%s", f, want, logtext.Tail(f.Log, 15))
		}
	})
	t.Run("GODEBUG", func(t *testing.T) {
		opts := nativeOptions(t, mainConfig, 0)
		opts.Env = append(opts.Env, "GODEBUG=") // the last of a repeated key wins
		f := envoytest.ExpectStartFailure(t, opts)
		if !strings.Contains(f.Log, "lacks GODEBUG=cgocheck=0") || !strings.Contains(f.Log, "start Envoy with GODEBUG=cgocheck=0") {
			t.Fatalf("%v; Envoy's log lacks the GODEBUG hint:\n%s", f, logtext.Tail(f.Log, 15))
		}
	})
}

// TestNativeClusterWide: a native Envoy and a Wasm Envoy share one limitd
// and one redis-server. A per-request cluster rule admits exactly its burst
// of 300 concurrent requests over both; a leased one at most its burst, the
// native module's lease calls going out from Envoy's main thread.
func TestNativeClusterWide(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	for _, tc := range []struct {
		name, config string
		exact        bool
	}{
		{"per request", clusterConfig("allow"), true},
		{"lease", leaseConfig("allow"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := nativeOptions(t, tc.config, up.Port())
			opts.ServicePort, opts.Concurrency = svc, 2
			var native, wasm *envoytest.Envoy
			var wg sync.WaitGroup
			wg.Go(func() { native = envoytest.Start(t, opts) })
			wg.Go(func() {
				wasm = envoytest.Start(t, envoytest.Options{Config: envoytest.DemoConfigYAML, PluginConfig: tc.config,
					UpstreamPort: up.Port(), ServicePort: svc, Concurrency: 2})
			})
			wg.Wait()
			if t.Failed() || t.Skipped() {
				return
			}
			n, w := native.Client(), wasm.Client()
			t.Cleanup(n.Close)
			t.Cleanup(w.Close)
			var res [2][]envoytest.Result
			for i, c := range []*envoytest.Client{n, w} {
				wg.Go(func() {
					res[i] = c.Burst(150, func(int) *http.Request {
						return c.NewRequest("GET", "/", map[string]string{"x-test": "burst", "x-api-key": "shared-" + tc.name})
					})
				})
			}
			wg.Wait()
			st := envoytest.Statuses(append(res[0], res[1]...))
			ok := st[200] == 40
			if !tc.exact {
				ok = st[200] <= 40 && st[200] >= 36
			}
			if !ok || st[200]+st[429] != 300 {
				t.Fatalf("statuses %v (native %v, Wasm %v), want 40 admitted (36 to 40 with leases)",
					st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
			}
			t.Logf("%v (native %v, Wasm %v)", st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
			if !tc.exact && native.Stat(nativePrefix+"lease_calls") == 0 {
				t.Error("the native module made no lease calls")
			}
			for _, name := range []string{"service_errors", "panics"} {
				if v := native.Stat(nativePrefix + name); v != 0 {
					t.Errorf("%s%s = %d", nativePrefix, name, v)
				}
			}
		})
	}
}

// TestNativeResumeAnsweredAtOnce: a request waiting for the limit service
// is resumed from the callout's answer, and Envoy answers it at once inside
// that resume (here the route's direct response: no upstream), running the
// module's response callback from inside its answer callback on the same
// thread. The worker's lock is reentrant for its own thread, so this
// neither deadlocks the worker nor loses the response headers.
func TestNativeResumeAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	opts := nativeOptions(t, clusterConfig("allow"), 0) // upstream 0: Envoy answers 200 itself
	opts.ServicePort, opts.Concurrency = svc, 2
	e := envoytest.Start(t, opts)
	c := e.Client()
	t.Cleanup(c.Close)
	for i := range 3 {
		r := c.Get("/", map[string]string{"x-api-key": "resume"})
		if r.Err != nil || r.Status != 200 || r.Header.Get("RateLimit-Remaining") != strconv.Itoa(39-i) {
			t.Fatalf("request %d: %v, remaining %q, want 200 and %d", i, r, r.Header.Get("RateLimit-Remaining"), 39-i)
		}
	}
	if v := e.Stat(nativePrefix + "panics"); v != 0 {
		t.Fatalf("%d panics", v)
	}
}

// TestNativeResponseCosts: costs known from the response (a header, a JSON
// body read in pieces as it passes, an event stream) and charge_on settle
// in the native module as in the Wasm plugin (TestResponseCosts).
func TestNativeResponseCosts(t *testing.T) {
	t.Parallel()
	up := startLLMUpstream(t)
	opts := nativeOptions(t, responseConfig, up.port(t))
	opts.Concurrency = 2
	e := envoytest.Start(t, opts)
	c := e.Client()
	t.Cleanup(c.Close)
	for _, tc := range []struct{ rule, path string }{
		{"by-header", "/header"}, {"by-json", "/json"}, {"by-sse", "/sse"},
	} {
		var statuses []int
		for i := range 6 {
			r := c.Do("POST", tc.path, map[string]string{"x-api-key": "k"})
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			statuses = append(statuses, r.Status)
			if r.Status == 429 && r.Header.Get("RateLimit") != `"`+tc.rule+`";r=0;t=21000` {
				t.Fatalf("%s request %d: RateLimit %q", tc.rule, i, r.Header.Get("RateLimit"))
			}
		}
		if want := []int{200, 200, 200, 200, 429, 429}; !slicesEqual(statuses, want) {
			t.Errorf("%s: statuses %v, want %v (a budget of 100, 30 a response)", tc.rule, statuses, want)
		}
		if n := e.Stat(nativePrefix + "rule." + tc.rule + ".cost_missing"); n != 0 {
			t.Errorf("%s: cost_missing = %d", tc.rule, n)
		}
	}
	login := func(password string) int {
		return c.Do("POST", "/login", map[string]string{"x-user": "alice", "x-password": password}).Status
	}
	for range 10 {
		if s := login("right"); s != 200 {
			t.Fatalf("login: %d, want 200", s)
		}
	}
	for range 5 {
		if s := login("wrong"); s != 401 {
			t.Fatalf("failed login: %d, want 401", s)
		}
	}
	if s := login("right"); s != 429 {
		t.Fatalf("after 5 failed logins: %d, want 429 (charge_on [\"401\"])", s)
	}
}

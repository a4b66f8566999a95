package istio

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

const (
	examples       = "../../examples/istio/"
	gatewayExample = examples + "wasmplugin-gateway.yaml"
	// anonRate and anonBurst are the example's anonymous-per-ip rule.
	anonRate, anonBurst = 2, 10
)

// gatewaySetup is one discovery server and one gateway Envoy it configures.
type gatewaySetup struct {
	mesh    *mesh
	envoy   *envoytest.Envoy
	wasm    string
	decides *atomic.Int64 // limit service decisions with the example's Host
}

// gatewayPluginEdit is the one change made to the example's WasmPlugin
// besides its url and match ports: the limit service's 50 ms callout
// timeout suits a gateway, but on a loaded 2-core test machine a slow answer
// would fail open and spoil the exact counts.
func gatewayPluginEdit(t *testing.T) func(spec map[string]any) {
	return func(spec map[string]any) {
		pc, _ := spec["pluginConfig"].(map[string]any)
		svc, _ := pc["service"].(map[string]any)
		if svc == nil || svc["timeout_ms"] != float64(50) {
			t.Fatalf("%s: pluginConfig.service.timeout_ms is not 50: %v", gatewayExample, svc)
		}
		svc["timeout_ms"] = 1000
	}
}

// startGatewaySetup starts the limit service (in-memory store) and an
// upstream on loopback, Istio's discovery server with the gateway objects,
// the example's gateway WasmPlugin and extra, and the gateway Envoy.
func startGatewaySetup(t *testing.T, extra ...func(wasm string, port int) string) *gatewaySetup {
	t.Helper()
	wasm := pluginCopy(t)
	y := wasmPlugin(t, gatewayExample, wasm, 0, nil)
	cfg := parsePluginConfig(t, y)
	limitdPort, decides := startCountingLimitd(t, cfg)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})

	port := envoytest.FreePort(t)
	configs := []string{wasmPlugin(t, gatewayExample, wasm, port, gatewayPluginEdit(t))}
	for _, f := range extra {
		configs = append(configs, f(wasm, port))
	}
	m := startMesh(t, meshObjects{GatewayPort: port, UpstreamPort: up.Port(),
		LimitdPort: limitdPort, Configs: configs})
	return &gatewaySetup{mesh: m, envoy: m.startGateway(t), wasm: wasm, decides: decides}
}

// startCountingLimitd serves the limit service (in memory, with cfg's
// token) on a loopback port and counts its decisions whose Host is cfg's
// service authority (the name Istio's cluster gives it).
func startCountingLimitd(t *testing.T, cfg *config.Config) (port int, decides *atomic.Int64) {
	t.Helper()
	srv, err := service.NewServer(service.Config{
		Store:     service.NewMemoryStore(service.MemoryOptions{}),
		StoreName: "memory",
		Token:     cfg.Service.Token,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	decides = new(atomic.Int64)
	limitd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/decide" && r.Host == cfg.Service.Authority {
			decides.Add(1)
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(limitd.Close)
	return limitd.Listener.Addr().(*net.TCPAddr).Port, decides
}

// parsePluginConfig returns the pluginConfig of the WasmPlugin y as the
// plugin parses it.
func parsePluginConfig(t *testing.T, y string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(pluginConfigJSON(t, y))
	if err != nil {
		t.Fatalf("pluginConfig: %v", err)
	}
	if cfg.Service == nil {
		t.Fatal("the gateway example has no limit service")
	}
	return cfg
}

// pluginConfigJSON is spec.pluginConfig of the WasmPlugin y as JSON.
func pluginConfigJSON(t *testing.T, y string) []byte {
	t.Helper()
	var obj struct {
		Spec struct {
			PluginConfig json.RawMessage `json:"pluginConfig"`
		} `json:"spec"`
	}
	if err := yamlToJSON(y, &obj); err != nil {
		t.Fatal(err)
	}
	return obj.Spec.PluginConfig
}

// ecdsPlugin is what Envoy holds for one Wasm filter it got through ECDS.
type ecdsPlugin struct {
	Filter string // the ECDS resource (filter) name
	Name   string `json:"name"`
	RootID string `json:"root_id"`
	VMConf struct {
		VMID    string `json:"vm_id"`
		Runtime string `json:"runtime"`
		Code    struct {
			Local struct {
				Filename string `json:"filename"`
			} `json:"local"`
		} `json:"code"`
		Env struct {
			KeyValues map[string]string `json:"key_values"`
		} `json:"environment_variables"`
	} `json:"vm_config"`
	Configuration struct {
		Value string `json:"value"`
	} `json:"configuration"`
	FailurePolicy string `json:"failure_policy"`
}

// istioName is the PluginConfig name Istio 1.31 gives a WasmPlugin's
// filter: it translates every WasmPlugin into an internal TrafficExtension
// named <name>~istio-translated-wasmplugin, and the ECDS resource is
// extensions.istio.io/trafficextension/<this name>.
func istioName(namespace, name string) string {
	return namespace + "." + name + "~istio-translated-wasmplugin"
}

// ecdsPlugins returns the Wasm filters of Envoy's ECDS config dump by
// PluginConfig name (see istioName).
func ecdsPlugins(t *testing.T, e *envoytest.Envoy) map[string]ecdsPlugin {
	t.Helper()
	out := map[string]ecdsPlugin{}
	for _, raw := range configDump(t, e, "ecds_filters") {
		var f struct {
			Filter struct {
				Name        string `json:"name"`
				TypedConfig struct {
					Type   string     `json:"@type"`
					Config ecdsPlugin `json:"config"`
				} `json:"typed_config"`
			} `json:"ecds_filter"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			t.Fatalf("ecds_filters: %v: %s", err, raw)
		}
		if !strings.HasSuffix(f.Filter.TypedConfig.Type, "envoy.extensions.filters.http.wasm.v3.Wasm") {
			continue
		}
		p := f.Filter.TypedConfig.Config
		p.Filter = f.Filter.Name
		out[p.Name] = p
	}
	return out
}

// httpFilters returns the HTTP filter names of the gateway listener's
// first filter chain, in order.
func httpFilters(t *testing.T, e *envoytest.Envoy) []string {
	t.Helper()
	for _, raw := range configDump(t, e, "dynamic_listeners") {
		var l struct {
			ActiveState struct {
				Listener struct {
					Address struct {
						Socket struct {
							Port int `json:"port_value"`
						} `json:"socket_address"`
					} `json:"address"`
					FilterChains []struct {
						Filters []struct {
							Name        string `json:"name"`
							TypedConfig struct {
								HTTPFilters []struct {
									Name string `json:"name"`
								} `json:"http_filters"`
							} `json:"typed_config"`
						} `json:"filters"`
					} `json:"filter_chains"`
				} `json:"listener"`
			} `json:"active_state"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatalf("dynamic_listeners: %v", err)
		}
		if l.ActiveState.Listener.Address.Socket.Port != e.ListenerPort() {
			continue
		}
		for _, fc := range l.ActiveState.Listener.FilterChains {
			for _, f := range fc.Filters {
				if f.Name != "envoy.filters.network.http_connection_manager" {
					continue
				}
				var names []string
				for _, h := range f.TypedConfig.HTTPFilters {
					names = append(names, h.Name)
				}
				return names
			}
		}
	}
	t.Fatalf("no HTTP connection manager on the gateway listener (port %d)", e.ListenerPort())
	return nil
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%v: %s", err, a)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return string(xs) == string(ys)
}

// policyName is the rule a RateLimit header names, "" when none.
func policyName(h http.Header) string {
	m := regexp.MustCompile(`^"([^"]+)"`).FindStringSubmatch(h.Get("RateLimit"))
	if m == nil {
		return ""
	}
	return m[1]
}

// refillBound is how many tokens a rule of rate per second can refill in d,
// rounded up, plus one for the request in flight when the window closes.
func refillBound(rate float64, d time.Duration) int {
	return int(rate*d.Seconds()) + 1
}

// TestIstioGateway: Istio's discovery server generates everything a real
// Envoy 1.40 gateway runs from the examples' WasmPlugin (url pointed at a
// file:// copy of build/plugin.wasm, match port at the test's listener);
// the plugin arrives through ECDS, starts with the configuration Istio
// built, and enforces it.
func TestIstioGateway(t *testing.T) {
	g := startGatewaySetup(t, denyAdmin)
	e := g.envoy
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.Stat("wasmcustom.tokenbucket." + name) }

	t.Run("the filter arrives through ECDS as Istio generates it", func(t *testing.T) {
		plugins := ecdsPlugins(t, e)
		name := istioName("istio-system", "ratelimit")
		p, ok := plugins[name]
		if !ok {
			t.Fatalf("no Wasm filter %s in Envoy's ECDS dump: %v", name, plugins)
		}
		if want := "extensions.istio.io/trafficextension/" + name; p.Filter != want {
			t.Errorf("ECDS resource %q, want %q", p.Filter, want)
		}
		// Without istio-agent (which strips them) the VM sees Istio's
		// ISTIO_META_WASM_* variables; nothing else is set.
		for k := range p.VMConf.Env.KeyValues {
			if !strings.HasPrefix(k, "ISTIO_META_WASM_") {
				t.Errorf("vm environment variable %s, want only ISTIO_META_WASM_*", k)
			}
		}
		t.Logf("ECDS resource %q, vm env %v", p.Filter, p.VMConf.Env.KeyValues)
		if p.RootID != "ratelimit-gateway" || p.VMConf.VMID != "" || p.VMConf.Runtime != "envoy.wasm.runtime.v8" ||
			p.VMConf.Code.Local.Filename != g.wasm || p.FailurePolicy != "FAIL_OPEN" {
			t.Errorf("root_id %q vm_id %q runtime %q code %q failure_policy %q; want ratelimit-gateway, none, v8, %s, FAIL_OPEN",
				p.RootID, p.VMConf.VMID, p.VMConf.Runtime, p.VMConf.Code.Local.Filename, p.FailurePolicy, g.wasm)
		}
		want := pluginConfigJSON(t, wasmPlugin(t, gatewayExample, g.wasm, e.ListenerPort(), gatewayPluginEdit(t)))
		if !sameJSON(t, []byte(p.Configuration.Value), want) {
			t.Errorf("configuration %s\nwant the WasmPlugin's pluginConfig %s", p.Configuration.Value, want)
		}
		filters := httpFilters(t, e)
		t.Logf("gateway HTTP filters: %v", filters)
		at := -1
		for i, f := range filters {
			if f == p.Filter {
				at = i
			}
		}
		if at < 0 || at == len(filters)-1 || filters[len(filters)-1] != "envoy.filters.http.router" {
			t.Errorf("filters %v: want %s before the router", filters, p.Filter)
		}
	})

	t.Run("the plugin starts with the configuration Istio built", func(t *testing.T) {
		e.WaitLog("tokenbucket: started with 4 rules, max_keys 100000", 10*time.Second)
		if line := e.LogLine("refusing to start"); line != "" {
			t.Errorf("a VM refused the configuration: %s", line)
		}
	})

	n := checkGatewayLimits(t, c, g.decides)
	checkGatewayStats(t, "wasmcustom.", stat, n)

	// The example's phase AUTHZ: after Istio's authentication filters,
	// before its authorization filters, so a flood is limited before an
	// authorization policy (or its ext_authz callout) spends anything.
	t.Run("phase AUTHZ: before Istio's authorization filter", func(t *testing.T) {
		filters := httpFilters(t, e)
		plugin := index(filters, "extensions.istio.io/trafficextension/"+istioName("istio-system", "ratelimit"))
		if rbac := index(filters, "envoy.filters.http.rbac"); plugin < 0 || rbac < 0 || plugin > rbac {
			t.Fatalf("filters %v: want the plugin before envoy.filters.http.rbac", filters)
		}
		c := newSourceClient(t, e, "127.0.0.7")
		start := time.Now()
		var statuses []int
		for range anonBurst + 2 {
			st, _ := c.get("/admin", nil)
			statuses = append(statuses, st)
		}
		denied := 0
		for _, st := range statuses {
			if st == 403 {
				denied++
			}
		}
		if refill := refillBound(anonRate, time.Since(start)); denied < anonBurst || denied > anonBurst+refill || statuses[len(statuses)-1] != 429 {
			t.Fatalf("/admin x%d: %v; want %d x 403 from the DENY policy (+ at most %d refilled), then 429: the limit counts first",
				len(statuses), statuses, anonBurst, refill)
		}
	})
}

// denyAdmin is an AuthorizationPolicy of the gateway: DENY for /admin.
// Istio turns it into an envoy.filters.http.rbac filter.
func denyAdmin(string, int) string {
	return `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-admin
  namespace: istio-system
spec:
  selector:
    matchLabels:
      istio: ingressgateway
  action: DENY
  rules:
  - to:
    - operation:
        paths: ["/admin"]
`
}

// tenantPlugin is a second WasmPlugin on the same gateway, with its own
// pluginName and its own rule. The rule deliberately has the name and key
// of the example's anonymous-per-ip (a bucket's identity is the hash of
// both), with burst 4 instead of 10: only the pluginName (root id), which
// the plugin puts in front of its shared-data keys, keeps the two buckets
// apart in the one shared-data namespace Istio leaves every WasmPlugin.
func tenantPlugin(failStrategy, pluginConfig string) func(wasm string, port int) string {
	return func(wasm string, port int) string {
		return `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata:
  name: tenants
  namespace: istio-system
spec:
  selector:
    matchLabels:
      istio: ingressgateway
  pluginName: ratelimit-tenants
  url: file://` + wasm + `
  failStrategy: ` + failStrategy + `
  phase: AUTHZ
  priority: 50
  match:
  - mode: CLIENT
    ports:
    - number: ` + strconv.Itoa(port) + `
  pluginConfig: ` + pluginConfig + `
`
	}
}

const tenantConfig = `{"headers": "both", "rules": [{"name": "anonymous-per-ip", "limit_keys": ["ip:address"],
  "match": {"header:x-api-key": {"present": false}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 2, "burst": 4}}]}`

// TestIstioSecondPlugin: two WasmPlugins of this plugin on one gateway,
// each with a bucket of the same identity, keep their buckets apart.
func TestIstioSecondPlugin(t *testing.T) {
	g := startGatewaySetup(t, tenantPlugin("FAIL_CLOSE", tenantConfig))
	e := g.envoy

	t.Run("both filters arrive, placed by priority", func(t *testing.T) {
		plugins := ecdsPlugins(t, e)
		a, b := plugins[istioName("istio-system", "ratelimit")], plugins[istioName("istio-system", "tenants")]
		if a.RootID != "ratelimit-gateway" || b.RootID != "ratelimit-tenants" || b.FailurePolicy != "FAIL_CLOSED" {
			t.Fatalf("ECDS plugins %+v", plugins)
		}
		filters := httpFilters(t, e)
		ia, ib := index(filters, a.Filter), index(filters, b.Filter)
		if ia < 0 || ib < 0 || ia > ib {
			t.Fatalf("filters %v: want %s (priority 100) before %s (priority 50)", filters, a.Filter, b.Filter)
		}
		e.WaitLog("tokenbucket: started with 1 rules", 10*time.Second)
	})

	t.Run("buckets of the same identity stay apart", func(t *testing.T) {
		c := newSourceClient(t, e, "127.0.0.2")
		start := time.Now()
		var statuses []int
		var policies [][]string
		for range 14 {
			st, h := c.get("/public", nil)
			statuses = append(statuses, st)
			policies = append(policies, h.Values("RateLimit-Policy"))
		}
		refill := refillBound(anonRate, time.Since(start))
		t.Logf("statuses %v", statuses)
		ok, firstB, firstA := 0, -1, -1
		var rejectedA, rejectedB uint64
		for i, st := range statuses {
			// Each plugin that decided adds its own headers: the tenants
			// plugin's come first (it answers, or is nearer the upstream).
			switch p := policies[i]; {
			case st == 200 && len(p) == 2:
				ok++
			case st == 429 && len(p) == 2 && strings.Contains(p[0], ";q=4;"):
				rejectedB++
				if firstB < 0 {
					firstB = i
				}
			case st == 429 && len(p) == 1 && strings.Contains(p[0], ";q=10;"):
				rejectedA++
				if firstA < 0 {
					firstA = i
				}
			default:
				t.Fatalf("request %d: status %d RateLimit-Policy %q", i, st, p)
			}
		}
		// Apart: the tenants bucket (4) rejects from request 5 on; the
		// gateway's bucket (10), drained by every request it let through,
		// from request 11 on. Shared, both filters would take from one
		// bucket and the first rejection would come by request 3.
		if ok < 4 || ok > 4+refill || firstB < 4 || firstB > 4+refill || firstA < 10 || firstA > 10+refill {
			t.Fatalf("statuses %v policies %q: want 4 x 200, 429 from the tenants plugin (q=4) from request 5, from the gateway plugin (q=10) from request 11 (refill allowance %d)",
				statuses, policies, refill)
		}
		// Both plugins count into the same metrics: the rule has one name.
		allowedA := 14 - rejectedA
		allowedB := allowedA - rejectedB
		stat := func(name string) uint64 { return e.Stat("wasmcustom.tokenbucket.rule.anonymous-per-ip." + name) }
		if a, r := stat("allowed"), stat("rejected"); a != allowedA+allowedB || r != rejectedA+rejectedB {
			t.Fatalf("anonymous-per-ip allowed %d rejected %d, want %d+%d and %d+%d (gateway + tenants plugin)",
				a, r, allowedA, allowedB, rejectedA, rejectedB)
		}
	})
}

func index(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// TestIstioPluginUpdate: the WasmPlugin changes (a rule added, an
// environment variable for the Go runtime) while a client sends requests;
// Istio pushes a new ECDS resource, Envoy starts new VMs, and the buckets,
// which live in Envoy's shared data rather than in a VM, are kept: a
// drained client stays drained across the update.
func TestIstioPluginUpdate(t *testing.T) {
	g := startGatewaySetup(t)
	e := g.envoy
	c := newSourceClient(t, e, "127.0.0.3")

	// Drain the client's anonymous-per-ip bucket.
	var drained time.Time
	for i := 0; ; i++ {
		sent := time.Now()
		if st, _ := c.get("/public", nil); st == 429 {
			drained = sent
			break
		} else if st != 200 || i > anonBurst+5 {
			t.Fatalf("request %d: %d while draining", i, st)
		}
	}

	type response struct {
		at     time.Time
		status int
	}
	done := make(chan []response)
	stop := make(chan struct{})
	go func() {
		var out []response
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for n := 0; n < 2000; n++ { // bounded: 50 s at most
			select {
			case <-stop:
				done <- out
				return
			case <-tick.C:
			}
			st, _ := c.get("/public", nil)
			out = append(out, response{time.Now(), st})
		}
		done <- out
	}()

	updated := wasmPlugin(t, gatewayExample, g.wasm, e.ListenerPort(), func(spec map[string]any) {
		gatewayPluginEdit(t)(spec)
		pc := spec["pluginConfig"].(map[string]any)
		pc["rules"] = append(pc["rules"].([]any), map[string]any{
			"name": "added-by-update", "match": map[string]any{"path": map[string]any{"prefix": "/added"}},
			"algorithm": "token_bucket", "algorithm_config": map[string]any{"tokens_per_second": 0.001, "burst": 1},
		})
		spec["vmConfig"] = map[string]any{"env": []any{map[string]any{"name": "GOGC", "value": "200"}}}
	})
	g.mesh.apply(t, updated)
	// The new configuration serves once the added rule rejects.
	k := e.Client()
	t.Cleanup(k.Close)
	waitUntil(t, "the updated WasmPlugin serving", 60*time.Second, func() bool {
		r := k.Get("/added", map[string]string{"x-api-key": "update-probe"})
		return r.Status == 429 && policyName(r.Header) == "added-by-update"
	})
	applied := time.Now()
	waitUntil(t, "a second of traffic after the update", 5*time.Second, func() bool { return time.Since(applied) > time.Second })
	close(stop)
	res := <-done

	if p := ecdsPlugins(t, e)[istioName("istio-system", "ratelimit")]; p.VMConf.Env.KeyValues["GOGC"] != "200" {
		t.Errorf("vm env after the update: %v, want GOGC=200 among them", p.VMConf.Env.KeyValues)
	}
	allowed := 0
	for i, r := range res {
		switch r.status {
		case 200:
			allowed++
		case 429:
		default:
			t.Fatalf("response %d at %v: status %d during the update", i, r.at.Sub(drained), r.status)
		}
		// Kept: what passes is what the rule refills since the drain (2/s).
		// Reset: a new bucket would let a burst of 10 through at once.
		if bound := refillBound(anonRate, r.at.Sub(drained)) + 1; allowed > bound {
			t.Fatalf("%d allowed by %v after the drain, more than the refill allows (%d): the update reset the bucket",
				allowed, r.at.Sub(drained), bound)
		}
	}
	t.Logf("%d requests over %v around the update, %d allowed; the update was served %v after the drain",
		len(res), res[len(res)-1].at.Sub(drained), allowed, applied.Sub(drained))
	if len(res) < 20 {
		t.Fatalf("only %d requests during the update", len(res))
	}
}

// gatewayCounts is what the gateway example's requests saw, to compare with
// /stats.
type gatewayCounts struct{ anonAllowed, anonRejected, keyAllowed, keyRejected uint64 }

// checkGatewayLimits sends the gateway example's traffic through c and checks
// each rule's answers, with either build of the limiter: the anonymous burst,
// the per-key limit through the limit service (decides counts its decisions),
// and health checks never limited.
func checkGatewayLimits(t *testing.T, c *envoytest.Client, decides *atomic.Int64) *gatewayCounts {
	n := &gatewayCounts{}
	t.Run("anonymous clients: the burst, then 429 with the RateLimit headers", func(t *testing.T) {
		start := time.Now()
		res := c.Burst(40, func(int) *http.Request { return c.NewRequest("GET", "/public", nil) })
		st := envoytest.Statuses(res)
		refill := refillBound(anonRate, time.Since(start))
		if st[200] < anonBurst || st[200] > anonBurst+refill || st[200]+st[429] != 40 {
			t.Fatalf("statuses %v, want %d (+ at most %d refilled) 200s, the rest 429", st, anonBurst, refill)
		}
		n.anonAllowed, n.anonRejected = uint64(st[200]), uint64(st[429])
		r := c.Get("/public", nil)
		if r.Status != 429 || policyName(r.Header) != "anonymous-per-ip" || r.Header.Get("Retry-After") == "" ||
			!strings.HasPrefix(r.Header.Get("RateLimit-Policy"), `"anonymous-per-ip";q=10`) {
			t.Fatalf("after the burst: %d %v, want 429 from anonymous-per-ip with Retry-After and RateLimit headers", r.Status, r.Header)
		}
		n.anonRejected++
	})

	t.Run("per API key: the limit service behind the cluster Istio names", func(t *testing.T) {
		before := decides.Load()
		start := time.Now()
		for i := range 60 {
			r := c.Get("/api/orders", map[string]string{"x-api-key": "key-a"})
			switch {
			case r.Status == 200:
				n.keyAllowed++
			case r.Status == 429 && policyName(r.Header) == "per-api-key":
				n.keyRejected++
			default:
				t.Fatalf("request %d: %d RateLimit %q, want 200, or 429 from per-api-key", i, r.Status, r.Header.Get("RateLimit"))
			}
		}
		refill := refillBound(20, time.Since(start))
		if n.keyAllowed < 40 || n.keyAllowed > 40+uint64(refill) {
			t.Fatalf("key-a: %d of 60 allowed, want 40 (+ at most %d refilled)", n.keyAllowed, refill)
		}
		if got := decides.Load() - before; got < 60 {
			t.Fatalf("the limit service took %d decisions with Host limitd.ratelimit.svc.cluster.local for 60 requests", got)
		}
	})

	t.Run("health checks are never limited", func(t *testing.T) {
		res := c.Burst(30, func(int) *http.Request { return c.NewRequest("GET", "/healthz", nil) })
		if st := envoytest.Statuses(res); st[200] != 30 {
			t.Fatalf("/healthz x30: %v, want 30 x 200", st)
		}
	})
	return n
}

// checkGatewayStats compares the limiter's counters (stat reads
// tokenbucket.<name> under the build's prefix) with what n saw.
func checkGatewayStats(t *testing.T, prefix string, stat func(string) uint64, n *gatewayCounts) {
	t.Run("stats count per rule", func(t *testing.T) {
		for name, want := range map[string]uint64{
			"rule.anonymous-per-ip.allowed": n.anonAllowed, "rule.anonymous-per-ip.rejected": n.anonRejected,
			"rule.per-api-key.allowed": n.keyAllowed, "rule.per-api-key.rejected": n.keyRejected,
			// Every request a rule above let through, none it rejected.
			"rule.global-ceiling.allowed": n.anonAllowed + n.keyAllowed, "rule.global-ceiling.rejected": 0,
			"service_errors": 0,
		} {
			if v := stat(name); v != want {
				t.Errorf("%stokenbucket.%s = %d, want %d", prefix, name, v, want)
			}
		}
	})
}

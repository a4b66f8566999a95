package e2e

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/service"
)

// istioPluginConfig returns spec.pluginConfig of the WasmPlugin in file the
// way Istio hands it to the plugin: decoded into a google.protobuf.Struct and
// marshalled back to JSON by protojson (sorted keys, protojson's numbers).
// examples/istio's own tests decode the manifests strictly; here only the
// configuration is needed.
func istioPluginConfig(t *testing.T, file string) string {
	t.Helper()
	y, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Spec struct {
			PluginConfig json.RawMessage `json:"pluginConfig"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(j, &obj); err != nil {
		t.Fatal(err)
	}
	var s structpb.Struct
	if err := protojson.Unmarshal(obj.Spec.PluginConfig, &s); err != nil {
		t.Fatal(err)
	}
	out, err := protojson.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestIstioGatewayShape boots examples/istio/envoy-istio.yaml, the Envoy
// configuration Istio 1.31 generates from examples/istio/wasmplugin-gateway.yaml
// (root_id = pluginName, no vm_id, the configuration as a protojson string,
// V8, failure_policy FAIL_OPEN, clusters named outbound|port||host), with that
// WasmPlugin's pluginConfig exactly as Istio passes it, and the limit service
// (in-memory store) on loopback behind the cluster the configuration names.
//
// Wasm only: it boots what Istio generates from a WasmPlugin (V8, the Wasm filter).
func TestIstioGatewayShape(t *testing.T) {
	t.Parallel()
	const dir = "../examples/istio/"
	pc := istioPluginConfig(t, dir+"wasmplugin-gateway.yaml")
	// The example's 50 ms callout timeout suits a gateway; on a loaded 2-core
	// test machine a slow answer would count in service_errors, which this
	// test requires to stay 0. Everything else is as Istio passes it.
	timeout := regexp.MustCompile(`"timeout_ms":\s*50\b`)
	if !timeout.MatchString(pc) {
		t.Fatalf("pluginConfig has no timeout_ms 50 to lengthen: %s", pc)
	}
	pc = timeout.ReplaceAllString(pc, `"timeout_ms":1000`)
	cfg, err := config.Parse([]byte(pc))
	if err != nil {
		t.Fatalf("pluginConfig: %v", err)
	}
	if cfg.Service == nil {
		t.Fatal("the gateway example has no limit service")
	}
	tmpl, err := os.ReadFile(dir + "envoy-istio.yaml")
	if err != nil {
		t.Fatal(err)
	}

	srv, err := service.NewServer(service.Config{
		Store:     service.NewMemoryStore(service.MemoryOptions{}),
		StoreName: "memory",
		Token:     cfg.Service.Token,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var decides atomic.Int64
	limitd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/decide" && r.Host == cfg.Service.Authority {
			decides.Add(1)
		}
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(limitd.Close)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(limitd.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	servicePort, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}

	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{
		Config: string(tmpl), PluginConfig: pc,
		UpstreamPort: up.Port(), ServicePort: servicePort, Concurrency: 4,
	})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.Stat("wasmcustom.tokenbucket." + name) }
	// The refusals each rule's subtest saw: its rejected counter must say
	// as much (how many depends on how fast the machine sent them).
	refused := map[string]uint64{}

	t.Run("health checks are never limited", func(t *testing.T) {
		res := c.Burst(50, func(int) *http.Request { return c.NewRequest("GET", "/healthz", nil) })
		if st := envoytest.Statuses(res); st[200] != 50 {
			t.Fatalf("/healthz x50: %v, want 50 x 200", st)
		}
	})

	t.Run("anonymous clients: local per-address bucket", func(t *testing.T) {
		start := time.Now()
		res := c.Burst(40, func(int) *http.Request { return c.NewRequest("GET", "/public", nil) })
		st := envoytest.Statuses(res)
		// After the burst, a 429 from the rule; a token refilled since
		// (one every 0.5 s) admits a request first.
		var r envoytest.Result
		after := 0
		for r = c.Get("/public", nil); r.Status == 200 && after < 5; r = c.Get("/public", nil) {
			after++
		}
		refill := int(2*time.Since(start).Seconds()) + 1
		if st[200] < 10 || st[200]+after > 10+refill || st[200]+st[429] != 40 {
			t.Fatalf("statuses %v and %d admitted after, want 10 (+ at most %d refilled) 200s, the rest 429", st, after, refill)
		}
		if r.Status != 429 || !strings.HasPrefix(r.Header.Get("RateLimit"), `"anonymous-per-ip";`) {
			t.Fatalf("after the burst: %d RateLimit %q, want 429 from anonymous-per-ip", r.Status, r.Header.Get("RateLimit"))
		}
		refused["anonymous-per-ip"] = uint64(st[429]) + 1
	})

	// Sequential: this checks the shape (cluster name, Host, token, the
	// answer applied), not the service under a concurrent burst, which the
	// cluster tests cover.
	t.Run("per API key: cluster bucket in the limit service", func(t *testing.T) {
		before := decides.Load()
		start := time.Now()
		allowed := 0
		for i := 0; i < 60; i++ {
			r := c.Get("/api/orders", map[string]string{"x-api-key": "key-a"})
			switch {
			case r.Status == 200:
				allowed++
			case r.Status != 429 || !strings.HasPrefix(r.Header.Get("RateLimit"), `"per-api-key";`):
				t.Fatalf("request %d: %d RateLimit %q, want 200, or 429 from per-api-key", i, r.Status, r.Header.Get("RateLimit"))
			}
		}
		refill := int(20*time.Since(start).Seconds()) + 1
		if allowed < 40 || allowed > 40+refill {
			t.Fatalf("key-a: %d of 60 allowed, want 40 (+ at most %d refilled)", allowed, refill)
		}
		refused["per-api-key"] = uint64(60 - allowed)
		if got := decides.Load() - before; got < 60 {
			t.Fatalf("the limit service took %d decisions with Host %s for 60 requests", got, cfg.Service.Authority)
		}
		if r := c.Get("/api/orders", map[string]string{"x-api-key": "key-b"}); r.Status != 200 {
			t.Fatalf("another key: %d, want 200", r.Status)
		}
	})

	t.Run("stats names", func(t *testing.T) {
		for _, name := range []string{"rule.per-api-key.allowed", "rule.anonymous-per-ip.allowed", "rule.global-ceiling.allowed"} {
			if stat(name) == 0 {
				t.Errorf("wasmcustom.tokenbucket.%s = 0", name)
			}
		}
		for _, rule := range []string{"per-api-key", "anonymous-per-ip"} {
			if n := stat("rule." + rule + ".rejected"); n != refused[rule] {
				t.Errorf("wasmcustom.tokenbucket.rule.%s.rejected = %d, want the %d refusals its subtest saw", rule, n, refused[rule])
			}
		}
		if n := stat("service_errors"); n != 0 {
			t.Errorf("wasmcustom.tokenbucket.service_errors = %d, want 0", n)
		}
	})
}

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

var (
	limitdOnce sync.Once
	limitdPath string
	limitdErr  error
)

// limitd builds cmd/limitd once per test binary.
func limitd(t *testing.T) string {
	t.Helper()
	limitdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "limitd")
		if err != nil {
			limitdErr = err
			return
		}
		limitdPath = filepath.Join(dir, "limitd")
		out, err := exec.Command("go", "build", "-o", limitdPath, "../cmd/limitd").CombinedOutput()
		if err != nil {
			limitdErr = fmt.Errorf("building limitd: %v\n%s", err, out)
		}
	})
	if limitdErr != nil {
		t.Fatal(limitdErr)
	}
	return limitdPath
}

// startLimitd runs the limit service on a free loopback port against redis,
// with extra flags after its own, and stops it when t ends.
func startLimitd(t *testing.T, redisAddr string, extra ...string) int {
	t.Helper()
	return startLimitdOn(t, envoytest.FreePort(t), redisAddr, extra...)
}

// startLimitdOn is startLimitd on a port of the caller's.
func startLimitdOn(t *testing.T, port int, redisAddr string, extra ...string) int {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(port), "--redis", redisAddr, "--timeout", "800ms"}, extra...)
	cmd := exec.Command(limitd(t), args...)
	logf, err := os.Create(filepath.Join(t.TempDir(), "limitd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("limitd log:\n%s", b)
		}
	})
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err := http.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return port
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("limitd did not become healthy")
		}
	}
}

// twoEnvoys boots two Envoys (two workers each) at once, Envoy i with
// build of the plugin configured by configs[i], behind upstreamPort, sharing the limit
// service on servicePort: V8 compiles the plugin for seconds, so they boot
// side by side. It returns false when t failed or skipped meanwhile.
func twoEnvoys(t *testing.T, build envoytest.Build, upstreamPort, servicePort int, configs [2]string) ([2]*envoytest.Envoy, bool) {
	t.Helper()
	var envoys [2]*envoytest.Envoy
	var wg sync.WaitGroup
	for i := range envoys {
		wg.Go(func() {
			envoys[i] = envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
				PluginConfig: configs[i], UpstreamPort: upstreamPort, ServicePort: servicePort, Concurrency: 2})
		})
	}
	wg.Wait()
	return envoys, !t.Failed() && !t.Skipped()
}

// clusterTimeout is the plugin's callout timeout in these tests: long enough
// that 300 concurrent decisions on a loaded 2-core machine are answered (a
// timed-out callout fails open and would spoil the exact count), while a
// Redis outage still fails fast (connections are refused at once).
const clusterTimeout = time.Second

func clusterConfig(failureMode string) string {
	return `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "` + failureMode + `"},
	 "rules": [{"name": "fleet", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 0.01, "burst": 40}}]}`
}

// TestClusterWide: two Envoys with the plugin share one limit service and
// one Redis. One key's burst of 40 holds across both; then Redis dies
// mid-load and comes back.
func TestClusterWide(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testClusterWide)
}

func testClusterWide(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	envoys, ok := twoEnvoys(t, build, up.Port(), svc, [2]string{clusterConfig("allow"), clusterConfig("deny")})
	if !ok {
		return
	}
	a, b := envoys[0].Client(), envoys[1].Client()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)

	t.Run("300 concurrent over two Envoys admit exactly 40", func(t *testing.T) {
		var res [2][]envoytest.Result
		var wg sync.WaitGroup
		for i, c := range []*envoytest.Client{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = c.Burst(150, func(int) *http.Request {
					return c.NewRequest("GET", "/", map[string]string{"x-api-key": "shared"})
				})
			}()
		}
		wg.Wait()
		all := append(res[0], res[1]...)
		st := envoytest.Statuses(all)
		if st[200] != 40 || st[429] != 260 {
			t.Fatalf("statuses %v (Envoy A %v, B %v), want exactly 40 admitted", st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
		}
		for _, e := range envoys {
			if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
				t.Fatalf("%d failed calls to the service during the burst", n)
			}
		}
		var slowest time.Duration
		for _, r := range all {
			slowest = max(slowest, r.Elapsed)
		}
		t.Logf("both Envoys: %v, slowest %v", st, slowest)
	})

	t.Run("Redis dies mid-load and comes back", func(t *testing.T) {
		stop := make(chan struct{})
		type obs struct {
			status  int
			elapsed time.Duration
			reason  string
			during  bool
		}
		var mu sync.Mutex
		var seen []obs
		var down sync.WaitGroup
		var redisDown bool
		for w, c := range []*envoytest.Client{a, b, a, b} {
			down.Add(1)
			go func() {
				defer down.Done()
				for i := 0; ; i++ { // bounded by stop, closed below after about 3 s
					select {
					case <-stop:
						return
					default:
					}
					r := c.Get("/", map[string]string{"x-api-key": "load-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)})
					mu.Lock()
					seen = append(seen, obs{r.Status, r.Elapsed, r.Header.Get("X-RateLimit-Reason"), redisDown})
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Second)
		mu.Lock()
		redisDown = true
		mu.Unlock()
		redis.Kill()
		time.Sleep(1500 * time.Millisecond)
		mu.Lock()
		redisDown = false
		mu.Unlock()
		if err := redis.Restart(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		// Exact again within a second: poll with fresh keys until a request
		// gets a real decision from the service (a RateLimit header).
		var exactAfter time.Duration
		for i := 0; time.Since(back) < 5*time.Second; i++ {
			r := a.Get("/", map[string]string{"x-api-key": "probe-" + strconv.Itoa(i)})
			if r.Header.Get("RateLimit") != "" {
				exactAfter = time.Since(back)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		close(stop)
		down.Wait()
		if exactAfter == 0 || exactAfter > time.Second {
			t.Fatalf("decisions came back %v after Redis (want within 1 s)", exactAfter)
		}
		var failedAllow, failedDeny, slow int
		var slowest time.Duration
		for _, o := range seen {
			if !o.during {
				continue
			}
			slowest = max(slowest, o.elapsed)
			if o.elapsed > clusterTimeout+200*time.Millisecond {
				slow++
			}
			switch {
			case o.status == 200:
				failedAllow++
			case o.status == 429 && o.reason == "limit_service_unavailable":
				failedDeny++
			default:
				t.Errorf("during the outage: status %d reason %q", o.status, o.reason)
			}
		}
		t.Logf("outage: %d requests failed open (Envoy A), %d denied (Envoy B), slowest %v; exact again %v after restart",
			failedAllow, failedDeny, slowest, exactAfter)
		if failedAllow == 0 || failedDeny == 0 || slow > 0 {
			t.Fatalf("want requests on both Envoys during the outage, each within the timeout (%d slow)", slow)
		}
		for _, e := range envoys {
			if r := e.Client().Get("/", map[string]string{"x-api-key": "after"}); r.Status != 200 && r.Status != 429 {
				t.Fatalf("an Envoy stopped serving: %v", r)
			}
		}
		// Exact again: a fresh key on both Envoys admits exactly 40.
		res := append(a.Burst(60, func(int) *http.Request {
			return a.NewRequest("GET", "/", map[string]string{"x-api-key": "after-outage"})
		}), b.Burst(60, func(int) *http.Request {
			return b.NewRequest("GET", "/", map[string]string{"x-api-key": "after-outage"})
		})...)
		if st := envoytest.Statuses(res); st[200] != 40 {
			t.Fatalf("after the outage: %v, want exactly 40 admitted", st)
		}
	})
}

package e2e

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// clusterSlotTTL is the slots' ttl_ms in these tests.
const clusterSlotTTL = 6 * time.Second

// clusterConcurrencyConfig allows four requests in flight per tenant
// across the fleet, the slots held by limitd.
var clusterConcurrencyConfig = `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "deny"},
 "rules": [{"name": "streams", "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 4, "ttl_ms": ` + strconv.Itoa(int(clusterSlotTTL.Milliseconds())) + `}}]}`

// waitReleasesAnswered waits until e's cluster rule rule holds no slot and
// every call e sent to limit_service was answered: a request's client has
// its answer before the plugin's release call of its slots (sent when the
// stream ends) reaches limitd, so another Envoy's request that follows at
// once may find them still held. The count of calls in flight must read 0
// twice, 40 ms apart: the rule's in_flight drops a moment before the
// release call goes out, in the same event.
func waitReleasesAnswered(e *envoytest.Envoy, rule string) {
	e.WaitPluginStat("tokenbucket.rule."+rule+".in_flight", 0, 10*time.Second)
	for range 2 {
		e.WaitStat("cluster.limit_service.upstream_rq_active", 0, 10*time.Second)
		time.Sleep(40 * time.Millisecond)
	}
}

// TestWaitReleasesAnswered: Envoy A's calls to limitd go through a proxy
// that holds release calls until the test lets them go. Once A's four
// requests of a tenant have ended, Envoy B's request for that tenant is
// refused (A's slots are still held at limitd: what TestConcurrencyCluster's
// check raced with on a loaded machine). waitReleasesAnswered(A) returns
// only after the releases went, and B is then admitted.
func TestWaitReleasesAnswered(t *testing.T) {
	t.Parallel()
	build := envoytest.Builds[len(envoytest.Builds)-1] // one build: the engine and the helper are the same on both
	redis := redistest.Start(t)
	ld := &restartableLimitd{t: t, port: envoytest.FreePort(t), redis: redis.Addr()}
	ld.start()
	t.Cleanup(ld.kill)
	var held atomic.Int64
	gate := make(chan struct{})
	proxy := startProxy(t, ld.port, 0, nil, func(r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/release") {
			held.Add(1)
			select { // bounded: a test that never lets go fails by its own checks
			case <-gate:
			case <-time.After(time.Minute):
			}
		}
	})
	upstream := holdingUpstream(t)
	var envoys [2]*envoytest.Envoy
	var wg sync.WaitGroup
	for i, port := range []int{proxy.port, ld.port} {
		wg.Go(func() {
			envoys[i] = envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
				PluginConfig: clusterConcurrencyConfig, UpstreamPort: upstream, ServicePort: port, Concurrency: 2})
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	a, b := envoys[0].Client(), envoys[1].Client()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	tenant := map[string]string{"x-tenant": "w", "x-hold-ms": "200"}
	if st := envoytest.Statuses(a.Burst(4, func(int) *http.Request { return a.NewRequest("GET", "/", tenant) })); st[200] != 4 {
		t.Fatalf("A's four requests: %v, want four 200", st)
	}
	tenant["x-hold-ms"] = "0"
	if r := b.Do("GET", "/", tenant); r.Status != 429 {
		t.Fatalf("B after A's requests ended, A's releases held: %d, want 429", r.Status)
	}
	// The releases go 300 ms from now; the helper must not return before:
	// one that did not wait for them would return at once.
	var opened atomic.Bool
	go func() {
		time.Sleep(300 * time.Millisecond)
		opened.Store(true)
		close(gate)
	}()
	waitReleasesAnswered(envoys[0], "streams")
	if !opened.Load() {
		t.Fatal("waitReleasesAnswered returned while A's release calls were held")
	}
	if n := held.Load(); n == 0 {
		t.Fatal("no release call reached the proxy")
	}
	if r := b.Do("GET", "/", tenant); r.Status != 200 {
		t.Fatalf("B after waitReleasesAnswered(A): %d, want 200", r.Status)
	}
}

// TestConcurrencyCluster: two Envoys (two workers each) through one limitd
// and a real redis-server share four slots per tenant exactly; limitd
// killed and restarted under load loses no slot and gives none twice; a
// kill -9 of one Envoy holding four slots frees them within the ttl (the
// figure is logged).
func TestConcurrencyCluster(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrencyCluster)
}

func testConcurrencyCluster(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	ld := &restartableLimitd{t: t, port: envoytest.FreePort(t), redis: redis.Addr()}
	ld.start()
	t.Cleanup(ld.kill)
	svc := ld.port
	envoys, ok := twoEnvoys(t, build, holdingUpstream(t), svc, [2]string{clusterConcurrencyConfig, clusterConcurrencyConfig})
	if !ok {
		return
	}
	a, b := envoys[0].Client(), envoys[1].Client()
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	held := func(tenant string, ms int) map[string]string {
		return map[string]string{"x-tenant": tenant, "x-hold-ms": strconv.Itoa(ms)}
	}

	t.Run("twelve at once over two Envoys: exactly four in flight", func(t *testing.T) {
		var res [2][]envoytest.Result
		var wg sync.WaitGroup
		for i, c := range []*envoytest.Client{a, b} {
			wg.Go(func() {
				res[i] = c.Burst(6, func(int) *http.Request { return c.NewRequest("GET", "/", held("shared", 3000)) })
			})
		}
		wg.Wait()
		st := envoytest.Statuses(append(res[0], res[1]...))
		if st[200] != 4 || st[429] != 8 {
			t.Fatalf("statuses %v (A %v, B %v), want exactly 4 admitted and 8 refused", st, envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
		}
		t.Logf("A %v, B %v", envoytest.Statuses(res[0]), envoytest.Statuses(res[1]))
	})

	t.Run("limitd killed and restarted under load: no slot lost, none given twice", func(t *testing.T) {
		// A holds four requests of tenant r (8 s each); limitd is killed
		// and restarted while B keeps asking for r: B is refused
		// throughout (by the slots, or by failure_mode deny while limitd
		// is down: both 429), A's slots are renewed after the restart
		// (none lost: Redis holds them), and once A's requests end B gets
		// a slot.
		var wg sync.WaitGroup
		// B asks only while A surely holds: 6 s of A's 8 (a slow machine's
		// 200 requests would outlast A's).
		holding := time.Now().Add(6 * time.Second)
		for range 4 {
			wg.Go(func() { a.Do("GET", "/", held("r", 8000)) })
		}
		envoys[0].WaitPluginStat("tokenbucket.rule.streams.in_flight", 4, 10*time.Second)
		ld.kill()
		restarted := make(chan struct{})
		go func() { ld.start(); close(restarted) }()
		statuses := map[int]int{}
		up := false
		for i := 0; i < 200 && time.Now().Before(holding); i++ { // bounded: 200 requests, at most 6 s
			select {
			case <-restarted:
				if !up {
					i = max(i, 180) // 20 more after the restart
					up = true
				}
			default:
			}
			statuses[b.Do("GET", "/", held("r", 0)).Status]++
			time.Sleep(20 * time.Millisecond)
		}
		<-restarted
		if statuses[200] != 0 {
			t.Fatalf("B during and after the restart: %v, want no 200 while A holds four slots", statuses)
		}
		if !up {
			t.Logf("limitd's restart took longer than B asked: B's answers are from while it was down")
		}
		wg.Wait()
		if lost := envoys[0].PluginStat("tokenbucket.cluster_slots_lost"); lost != 0 {
			t.Fatalf("cluster_slots_lost %d, want 0 (Redis keeps the slots)", lost)
		}
		waitReleasesAnswered(envoys[0], "streams")
		if r := b.Do("GET", "/", held("r", 0)); r.Status != 200 {
			t.Fatalf("B once A's releases were answered: %d, want 200", r.Status)
		}
		t.Logf("B's answers across the restart: %v", statuses)
	})

	t.Run("kill -9 of an Envoy holding four slots: freed within the ttl", func(t *testing.T) {
		// A holds four requests of tenant k (10 s each, the upstream's
		// most), and B is refused meanwhile.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { a.Do("GET", "/", held("k", 10_000)) })
		}
		t.Cleanup(wg.Wait)
		envoys[0].WaitPluginStat("tokenbucket.rule.streams.in_flight", 4, 10*time.Second)
		if r := b.Do("GET", "/", held("k", 0)); r.Status != 429 {
			t.Fatalf("B while A holds four: %d, want 429", r.Status)
		}
		killed := time.Now()
		if err := syscall.Kill(envoys[0].PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		envoys[0].Stop() // reaps it
		// Poll B every 100 ms, bounded: twice the ttl.
		var freed time.Duration
		for deadline := killed.Add(2 * clusterSlotTTL); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r := b.Do("GET", "/", held("k", 0)); r.Status == 200 {
				freed = time.Since(killed)
				break
			}
		}
		if freed == 0 || freed > clusterSlotTTL+2*time.Second {
			t.Fatalf("B admitted k %v after the kill (0: not within %v), want within the ttl %v", freed, 2*clusterSlotTTL, clusterSlotTTL)
		}
		t.Logf("slots freed %v after kill -9 (ttl %v; renewed at least every ttl/3 + 1 s)", freed.Round(10*time.Millisecond), clusterSlotTTL)
	})
}

// restartableLimitd is a limitd process on a fixed port that a test kills
// (SIGKILL) and starts again.
type restartableLimitd struct {
	t     *testing.T
	port  int
	redis string
	mu    sync.Mutex
	cmd   *exec.Cmd
}

// start starts limitd and waits (bounded) until it is healthy.
func (l *restartableLimitd) start() {
	bin := limitd(l.t)
	cmd := exec.Command(bin, "--listen", "127.0.0.1:"+strconv.Itoa(l.port), "--redis", l.redis, "--timeout", "800ms")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(l.t.TempDir(), "limitd.log"))
	if err != nil {
		l.t.Error(err)
		return
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		l.t.Error(err)
		return
	}
	l.mu.Lock()
	l.cmd = cmd
	l.mu.Unlock()
	url := "http://127.0.0.1:" + strconv.Itoa(l.port) + "/readyz"
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r, err := http.Get(url); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
	}
	l.t.Error("limitd did not become ready")
}

// kill kills limitd (SIGKILL) and reaps it; it is idempotent.
func (l *restartableLimitd) kill() {
	l.mu.Lock()
	cmd := l.cmd
	l.cmd = nil
	l.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// shadowSlotsConfig is a shadow cluster concurrency rule: three in flight
// per tenant across the fleet, never refusing.
var shadowSlotsConfig = `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "deny"},
 "rules": [{"name": "watch", "mode": "shadow", "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 3, "ttl_ms": ` + strconv.Itoa(int(clusterSlotTTL.Milliseconds())) + `}}]}`

// TestConcurrencyClusterShadow: a shadow cluster concurrency rule through
// limitd and a real redis-server: five requests held at once against
// three slots all pass, shadow_rejected counts the two limitd refused, and
// once they end limitd has released every slot it granted (its counters:
// three acquired, two refused, three released held).
func TestConcurrencyClusterShadow(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrencyClusterShadow)
}

func testConcurrencyClusterShadow(t *testing.T, build envoytest.Build) {
	const slots, extra = 3, 2
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: shadowSlotsConfig, UpstreamPort: holdingUpstream(t), ServicePort: svc, Concurrency: 2})
	if t.Failed() || t.Skipped() {
		return
	}
	c := e.Client()
	t.Cleanup(c.Close)
	// Held 4 s each: all five are in flight together even on a loaded
	// machine (each acquire is answered within the 1 s callout bound).
	res := c.Burst(slots+extra, func(int) *http.Request {
		return c.NewRequest("GET", "/", map[string]string{"x-tenant": "s", "x-hold-ms": "4000"})
	})
	if st := envoytest.Statuses(res); st[200] != slots+extra {
		t.Fatalf("statuses %v, want all %d to pass (a shadow rule never refuses)", st, slots+extra)
	}
	if n := e.PluginStat("tokenbucket.rule.watch.shadow_rejected"); n != extra {
		t.Fatalf("shadow_rejected %d, want %d", n, extra)
	}
	e.WaitPluginStat("tokenbucket.rule.watch.in_flight", 0, 10*time.Second)
	// Every granted slot released (bounded poll: the releases are the
	// plugin's own calls, sent as the requests end).
	var acquired, refused, released float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		acquired = limitdSeries(t, svc, "limitd_slot_acquires_total", `result="acquired"`)
		refused = limitdSeries(t, svc, "limitd_slot_acquires_total", `result="refused"`)
		released = limitdSeries(t, svc, "limitd_slot_releases_total", `state="held"`)
		if released == slots || time.Now().After(deadline) {
			break
		}
	}
	if acquired != slots || refused != extra || released != slots {
		t.Fatalf("limitd: %v acquired, %v refused, %v released held; want %d, %d, %d", acquired, refused, released, slots, extra, slots)
	}
}

// limitdSeries reads the value of one series of limitd's /metrics: the
// first line of name whose labels contain label.
func limitdSeries(t *testing.T, port int, name, label string) float64 {
	t.Helper()
	r, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return f
		}
	}
	return 0
}

// patientClusterConfig is one slot per tenant across the fleet, a refused
// request waiting up to 5 s for it, four waiting per worker at most.
var patientClusterConfig = `{"service": {"cluster": "limit_service", "timeout_ms": ` + strconv.Itoa(int(clusterTimeout.Milliseconds())) + `, "failure_mode": "deny"},
 "rules": [{"name": "patient", "scope": "cluster", "limit_keys": ["header:x-tenant"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": 1, "max_delay_ms": 5000, "max_waiting": 4, "ttl_ms": ` + strconv.Itoa(int(clusterSlotTTL.Milliseconds())) + `}}]}`

// TestConcurrencyClusterWait: max_delay_ms on a cluster concurrency rule
// through limitd and a real redis-server: a request refused the one slot
// retries its acquire and goes on once the first (held 1 s) ends, with the
// delay header; then a flood of 40 at once on one tenant: each is admitted
// or refused, past max_waiting (waiting_full) or at its bound
// (delay_refused), and limitd ends with every granted slot released.
func TestConcurrencyClusterWait(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testConcurrencyClusterWait)
}

func testConcurrencyClusterWait(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	e := envoytest.Start(t, envoytest.Options{Build: build, Config: envoytest.DemoConfigYAML,
		PluginConfig: patientClusterConfig, UpstreamPort: holdingUpstream(t), ServicePort: svc, Concurrency: 2})
	if t.Failed() || t.Skipped() {
		return
	}
	c := e.Client()
	t.Cleanup(c.Close)
	first := make(chan envoytest.Result, 1)
	go func() { first <- c.Get("/", map[string]string{"x-tenant": "w", "x-hold-ms": "1000"}) }()
	waitFor(t, "the first in flight", func() bool { return e.PluginStat("tokenbucket.rule.patient.in_flight") == 1 })
	r := c.Get("/", map[string]string{"x-tenant": "w"})
	held, _ := strconv.Atoi(r.Header.Get("X-Ratelimit-Delayed-Ms"))
	if r.Status != 200 || held == 0 {
		t.Fatalf("second: %v, delayed %q ms; want 200 once the first ended", r, r.Header.Get("X-Ratelimit-Delayed-Ms"))
	}
	if f := <-first; f.Status != 200 {
		t.Fatalf("first: %v", f)
	}
	if n := e.PluginStat("tokenbucket.rule.patient.delayed"); n != 1 {
		t.Fatalf("rule.patient.delayed %d, want 1", n)
	}
	e.WaitPluginStat("tokenbucket.rule.patient.in_flight", 0, 10*time.Second)
	refused := limitdSeries(t, svc, "limitd_slot_acquires_total", `result="refused"`)
	t.Logf("held %d ms behind a request of 1000 ms; %v acquires refused meanwhile", held, refused)

	res := c.Burst(40, func(int) *http.Request {
		return c.NewRequest("GET", "/", map[string]string{"x-tenant": "f", "x-hold-ms": "100"})
	})
	st := envoytest.Statuses(res)
	if st[200] < 1 || st[200]+st[429] != 40 {
		t.Fatalf("flood: %v, want each admitted or refused, at least one admitted", st)
	}
	// Every refusal is one past max_waiting (at once) or at its bound.
	wf, dr := e.PluginStat("tokenbucket.rule.patient.waiting_full"), e.PluginStat("tokenbucket.rule.patient.delay_refused")
	if int(wf+dr) != st[429] {
		t.Fatalf("flood: %d refused, waiting_full %d + delay_refused %d", st[429], wf, dr)
	}
	e.WaitPluginStat("tokenbucket.rule.patient.in_flight", 0, 10*time.Second)
	var acquired, released float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		acquired = limitdSeries(t, svc, "limitd_slot_acquires_total", `result="acquired"`)
		released = limitdSeries(t, svc, "limitd_slot_releases_total", `state="held"`)
		if released == acquired || time.Now().After(deadline) {
			break
		}
	}
	if want := float64(2 + st[200]); acquired != want || released != want {
		t.Fatalf("limitd: %v acquired, %v released held; want %v each", acquired, released, want)
	}
	t.Logf("flood of 40: %v, waiting_full %d, delay_refused %d", st, wf, dr)
}

package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// bodyUpstream answers like an LLM API, in bodies of any size:
//   - /big...?size=N&cost=K: a JSON body of about N bytes whose usage
//     (total_tokens K) comes last. With &meet=1 it sends half the body,
//     then waits until meet answers have sent theirs (or 20 s), so that they
//     are all in flight at once.
//   - /gzip/asked: the usage JSON, gzipped when the request accepts gzip;
//     /gzip/always: gzipped whatever the request accepts.
//   - /stream: an event stream of contentEvents events, then (unless the
//     request is gone first, or after 10 s) the usage event and [DONE];
//     /stream/quick: one usage event of 0 tokens.
type bodyUpstream struct {
	srv    *httptest.Server
	meet   atomic.Int64 // answers that sent their first half
	want   atomic.Int64 // how many to wait for
	met    chan struct{}
	once   sync.Once
	accept atomic.Value // the last accept-encoding of /gzip/asked
}

const (
	contentEvents = 5
	streamUsage   = 2500
)

func startBodyUpstream(t *testing.T) *bodyUpstream {
	t.Helper()
	u := &bodyUpstream{met: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *bodyUpstream) port(t *testing.T) int { return serverPort(t, u.srv) }

func (u *bodyUpstream) serve(w http.ResponseWriter, r *http.Request) {
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	q := r.URL.Query()
	switch {
	case strings.HasPrefix(r.URL.Path, "/big"):
		size, _ := strconv.Atoi(q.Get("size"))
		head, tail := `{"pad":"`, `","usage":{"total_tokens":`+q.Get("cost")+`}}`
		w.Header().Set("content-type", "application/json")
		w.Header().Set("content-length", strconv.Itoa(len(head)+size+len(tail)))
		if _, err := io.WriteString(w, head); err != nil {
			return
		}
		pad := []byte(strings.Repeat("x", 64<<10))
		for sent := 0; sent < size; {
			n := min(len(pad), size-sent)
			if _, err := w.Write(pad[:n]); err != nil {
				return
			}
			sent += n
			if q.Get("meet") != "" && sent-n < size/2 && sent >= size/2 {
				flush()
				if u.meet.Add(1) >= u.want.Load() {
					u.once.Do(func() { close(u.met) })
				}
				select {
				case <-u.met:
				case <-time.After(20 * time.Second):
				}
			}
		}
		_, _ = io.WriteString(w, tail)
	case strings.HasPrefix(r.URL.Path, "/gzip"):
		body := `{"id":"g","choices":[{"message":{"content":"` + strings.Repeat("words ", 200) + `"}}],"usage":{"total_tokens":5000}}`
		w.Header().Set("content-type", "application/json")
		if r.URL.Path == "/gzip/asked" {
			u.accept.Store(r.Header.Get("accept-encoding"))
		}
		if r.URL.Path == "/gzip/always" || strings.Contains(r.Header.Get("accept-encoding"), "gzip") {
			w.Header().Set("content-encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, body)
			_ = zw.Close()
			return
		}
		_, _ = io.WriteString(w, body)
	case strings.HasPrefix(r.URL.Path, "/stream"):
		w.Header().Set("content-type", "text/event-stream")
		if r.URL.Path == "/stream/quick" {
			_, _ = io.WriteString(w, "data: {\"usage\":{\"total_tokens\":0}}\n\n")
			return
		}
		for i := 0; i < contentEvents; i++ {
			_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"word %d\"}}]}\n\n", i)
		}
		flush()
		select {
		case <-r.Context().Done():
			return // the client left: the usage never comes
		case <-time.After(10 * time.Second):
		}
		_, _ = fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", streamUsage)
	default:
		http.NotFound(w, r)
	}
}

// bodyMemoryConfig: a rule per test, each a budget per x-api-key refilling
// 1 token every 100 s or slower (so a test under 100 s sees no refill in
// the RateLimit headers), whose cost is the usage in the response body
// (bigplain: a fixed cost, its bodies never read).
const bodyMemoryConfig = `{"rules": [
 {"name": "big16", "match": {"path": {"prefix": "/big16"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 100000,
  "cost_source": "response_json:usage.total_tokens", "max_body_bytes": 16777216}},
 {"name": "bigplain", "match": {"path": {"prefix": "/bigplain/"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 100000}},
 {"name": "big1", "match": {"path": {"prefix": "/big1/"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 100000,
  "cost_source": "response_json:usage.total_tokens"}},
 {"name": "gzip", "match": {"path": {"prefix": "/gzip"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 10000,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 10, "truncated_cost": 8000}},
 {"name": "stream", "match": {"path": {"prefix": "/stream"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 100000,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 10, "truncated_cost": 3000}}]}`

// maxPluginSys bounds what the Go runtimes of the plugin's three VMs (one
// worker) may take from the host, memory.sys_bytes: each collects against
// a 64 MiB limit and holds no body, far from the 1 GiB that ends a VM.
const maxPluginSys = 256 << 20

// maxScanRatio bounds the processor time Envoy spends a byte of answers a
// response_json rule reads, against answers no rule reads, while they
// stream to clients that stopped reading. A new request on that worker
// waits for the worker to read what those answers have in flight; this
// bounds the plugin's share of that wait (docs/response-costs.md, "What it
// costs in time").
const maxScanRatio = 1.75

// TestResponseBodiesInBoundedMemory runs, on one Envoy worker, what ended a
// worker's VM when the plugin copied bodies (large answers in flight at
// once, clients that stop reading), and what let a client lower its cost
// (accepting gzip, leaving before the usage event).
//
// Alone: it measures Envoy's memory and its CPU a byte of answers, which
// any other process on the machine disturbs (beside the end of the unit
// tests at nice 10, one measure's CPU a byte rose to 2.13 times the
// other's, above maxScanRatio).
func TestResponseBodiesInBoundedMemory(t *testing.T) {
	forEachBuild(t, testResponseBodiesInBoundedMemory)
}

func testResponseBodiesInBoundedMemory(t *testing.T, build envoytest.Build) {
	up := startBodyUpstream(t)
	// The route's timeout is the client's (5 minutes), not the bootstrap's
	// 15 s: 1.6 GB through one worker takes longer on a loaded machine, and
	// this bounds memory, not time (under load 25 the 15 s cut answers
	// short: "unexpected EOF").
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: bodyMemoryConfig,
		UpstreamPort: up.port(t), Concurrency: 1, RouteTimeout: "300s",
	})
	base := e.URL("")
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }
	c := e.Client()
	t.Cleanup(c.Close)
	// remaining is what a small request of key to path finds in the bucket,
	// after its own reservation (shown in the RateLimit headers).
	remaining := func(path, key string) string {
		t.Helper()
		r := c.Get(path, map[string]string{"x-api-key": key})
		if r.Err != nil || r.Status != 200 {
			t.Fatalf("GET %s: %d %v (a dead VM answers 503)", path, r.Status, r.Err)
		}
		return r.Header.Get("RateLimit-Remaining")
	}

	t.Run("100 answers of 16 MiB in flight on one worker", func(t *testing.T) {
		const n, size, cost = 100, 16<<20 - 1024, 500 // within max_body_bytes
		up.want.Store(n)
		tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: n, DisableCompression: true}
		defer tr.CloseIdleConnections()
		// What this bounds is memory: on a loaded machine the answers take
		// as long as the worker's share of a CPU makes them.
		hc := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("GET", base+"/big16?meet=1&size="+strconv.Itoa(size)+"&cost="+strconv.Itoa(cost), nil)
				req.Header.Set("x-api-key", "a")
				res, err := hc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				defer res.Body.Close()
				got, err := io.Copy(io.Discard, res.Body)
				if err != nil || res.StatusCode != 200 || got < size {
					errs <- fmt.Errorf("status %d, %d bytes, %v", res.StatusCode, got, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if m := up.meet.Load(); m < n {
			t.Fatalf("only %d answers were in flight together, want %d", m, n)
		}
		sys := stat("memory.sys_bytes")
		t.Logf("%d answers of %.1f MiB in %v; Envoy RSS %d MiB, the plugin's Go runtime %d MiB (memory.sys_bytes)",
			n, float64(size)/(1<<20), time.Since(start).Round(time.Millisecond), e.RSS()>>20, sys>>20)
		if sys > maxPluginSys {
			t.Errorf("the plugin's VMs hold %d MiB, more than %d MiB: bodies are held", sys>>20, maxPluginSys>>20)
		}
		// Every cost charged: 100,000 − 100 × 500, less this request's
		// reservation of 1.
		if got := remaining("/big16?size=10&cost=0", "a"); got != "49999" {
			t.Errorf("remaining %q, want 49999", got)
		}
		if m, tr := stat("rule.big16.cost_missing"), stat("rule.big16.cost_truncated"); m != 0 || tr != 0 {
			t.Errorf("cost_missing %d, cost_truncated %d, want 0", m, tr)
		}
	})

	t.Run("clients that stop reading", func(t *testing.T) {
		// Its own patience: on a loaded machine a request waits for the
		// worker's share of a CPU; what the test bounds is the CPU.
		probeClient := envoytest.NewClientTimeout(base, 5*time.Minute)
		t.Cleanup(probeClient.Close)
		probe := func(when, key string) {
			t.Helper()
			cpu0, asked := e.CPU(), time.Now()
			r := probeClient.Get("/big1/?size=10&cost=0", map[string]string{"x-api-key": key})
			cpu, wall := e.CPU()-cpu0, time.Since(asked)
			t.Logf("a request %s: answered in %v, while Envoy used %v of CPU", when, wall.Round(time.Millisecond), cpu)
			if r.Err != nil || r.Status != 200 {
				t.Fatalf("a request %s: %d %v (a dead VM answers 503)", when, r.Status, r.Err)
			}
			if got := r.Header.Get("RateLimit-Remaining"); got != "99999" {
				t.Errorf("a request %s: remaining %q, want 99999", when, got)
			}
		}
		// stall sends n requests to path, each for 1.5 MiB (more than the
		// default max_body_bytes the plugin used to copy), reading
		// nothing, and returns Envoy's CPU a byte until it has read 1 MiB
		// of every answer. With probes, a request is sent while the
		// answers are read, and one when they wait: each is answered,
		// however long the worker takes on a loaded machine.
		const n, size = 1300, 3 << 19
		const closeBound = 20 * time.Second
		stall := func(path string, probes bool) float64 {
			t.Helper()
			conns := make([]net.Conn, 0, n)
			active := func() uint64 { return e.Stat("http.ingress.downstream_cx_active") }
			cx0 := active()
			defer func() {
				for _, cn := range conns {
					_ = cn.Close()
				}
				// The probes' keep-alive connection is not one of these:
				// left open, it counts until the client's idle timeout
				// (30 s), and this wait used to last that long.
				probeClient.Close()
				// Envoy has let them go before the next measure starts: it
				// takes well under a second on a quiet machine.
				deadline := time.Now().Add(closeBound)
				for active() > cx0 {
					if time.Now().After(deadline) {
						t.Errorf("Envoy still holds %d connections %v after the %d clients closed, want %d", active(), closeBound, n, cx0)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
			port := strings.TrimPrefix(base, "http://127.0.0.1:")
			// What Envoy had read and spent before (the subtests before
			// this one read their answers through the same cluster).
			cpu0, rx0 := e.CPU(), e.Stat("cluster.upstream.upstream_cx_rx_bytes_total")
			for i := 0; i < n; i++ {
				cn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 5*time.Second)
				if err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				conns = append(conns, cn)
				if _, err := fmt.Fprintf(cn, "GET %s?size=%d&cost=5 HTTP/1.1\r\nHost: x\r\nx-api-key: b\r\n\r\n", path, size); err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
			}
			read := func() uint64 { return e.Stat("cluster.upstream.upstream_cx_rx_bytes_total") - rx0 }
			readAll := func(want int) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Minute) // at 1/8 of a CPU: 8 × the CPU it takes
				for read() < uint64(want) {
					if time.Now().After(deadline) {
						t.Fatalf("Envoy read %d bytes of the answers, want at least %d", read(), want)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			if probes {
				readAll(n << 18)
				probe(fmt.Sprintf("while %d answers are read", n), "b1")
			}
			readAll(n << 20)
			cpu, bytes := e.CPU()-cpu0, read()
			perByte := float64(cpu.Nanoseconds()) / float64(bytes)
			t.Logf("%s: Envoy used %v of CPU to read %.0f MiB of the answers: %.2f ns a byte", path, cpu, float64(bytes)/(1<<20), perByte)
			if probes {
				probe(fmt.Sprintf("while %d answers wait", n), "b2")
				sys := stat("memory.sys_bytes")
				t.Logf("%d answers waiting: Envoy RSS %d MiB, the plugin's Go runtime %d MiB (memory.sys_bytes)", n, e.RSS()>>20, sys>>20)
				if sys > maxPluginSys {
					t.Errorf("the plugin's VMs hold %d MiB, more than %d MiB: bodies are held", sys>>20, maxPluginSys>>20)
				}
			}
			return perByte
		}
		// The same answers where no rule reads the body, then where one
		// does: what the worker spends a byte on the plugin's reading and
		// scanning is bounded against what it spends on Envoy's own work,
		// measured on the same machine under the same load.
		plain := stall("/bigplain/", false)
		scanned := stall("/big1/", true)
		if r := scanned / plain; r > maxScanRatio {
			t.Errorf("the answers a rule reads cost Envoy %.2f ns of CPU a byte, %.2f times the %.2f of answers no rule reads; want at most %.2f times",
				scanned, r, plain, maxScanRatio)
		}
	})

	t.Run("accept-encoding gzip does not hide the cost", func(t *testing.T) {
		r := c.Get("/gzip/asked", map[string]string{"x-api-key": "g", "accept-encoding": "gzip"})
		if r.Err != nil || r.Status != 200 || r.Header.Get("content-encoding") != "" || !strings.Contains(string(r.Body), `"total_tokens":5000`) {
			t.Fatalf("status %d, content-encoding %q, err %v", r.Status, r.Header.Get("content-encoding"), r.Err)
		}
		if got := up.accept.Load(); got != "identity" {
			t.Errorf("the upstream saw accept-encoding %q, want identity", got)
		}
		// 10000 − 5000 − 10 reserved.
		if got := remaining("/gzip/asked", "g"); got != "4990" {
			t.Errorf("remaining %q, want 4990 (the full cost)", got)
		}
		// An upstream that compresses anyway: truncated_cost (8000).
		if r := c.Get("/gzip/always", map[string]string{"x-api-key": "g2"}); r.Err != nil || r.Header.Get("content-encoding") != "gzip" {
			t.Fatalf("/gzip/always: %v, content-encoding %q", r.Err, r.Header.Get("content-encoding"))
		}
		if got := remaining("/gzip/asked", "g2"); got != "1990" {
			t.Errorf("remaining %q, want 1990 (truncated_cost)", got)
		}
		if n := stat("rule.gzip.cost_truncated"); n != 1 {
			t.Errorf("cost_truncated = %d, want 1", n)
		}
	})

	t.Run("a client that leaves before the usage event", func(t *testing.T) {
		const streams = 20
		tr := &http.Transport{Proxy: nil, DisableCompression: true}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr, Timeout: 20 * time.Second}
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for i := 0; i < streams; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", base+"/stream", nil)
				req.Header.Set("x-api-key", "s")
				res, err := hc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				br := bufio.NewReader(res.Body)
				for seen := 0; seen < contentEvents; {
					line, err := br.ReadString('\n')
					if err != nil {
						errs <- fmt.Errorf("after %d events: %v", seen, err)
						return
					}
					if strings.HasPrefix(line, "data:") {
						seen++
					}
				}
				cancel() // every content event read: leave
				_ = res.Body.Close()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		e.WaitPluginStat("tokenbucket.rule.stream.cost_truncated", streams, 10*time.Second)
		// 100000 − 20 × 3000 − 10 reserved.
		if got := remaining("/stream/quick", "s"); got != "39990" {
			t.Errorf("remaining %q, want 39990 (truncated_cost each)", got)
		}
		if n := stat("rule.stream.cost_missing"); n != 0 {
			t.Errorf("cost_missing = %d, want 0", n)
		}
	})
}

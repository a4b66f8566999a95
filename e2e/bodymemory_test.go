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
// the RateLimit headers), whose cost is the usage in the response body.
const bodyMemoryConfig = `{"rules": [
 {"name": "big16", "match": {"path": {"prefix": "/big16"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 100000,
  "cost_source": "response_json:usage.total_tokens", "max_body_bytes": 16777216}},
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

// TestResponseBodiesInBoundedMemory runs, on one Envoy worker, what ended a
// worker's VM when the plugin copied bodies (large answers in flight at
// once, clients that stop reading), and what let a client lower its cost
// (accepting gzip, leaving before the usage event).
func TestResponseBodiesInBoundedMemory(t *testing.T) {
	forEachBuild(t, testResponseBodiesInBoundedMemory)
}

func testResponseBodiesInBoundedMemory(t *testing.T, build envoytest.Build) {
	up := startBodyUpstream(t)
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: bodyMemoryConfig,
		UpstreamPort: up.port(t), Concurrency: 1,
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
		hc := &http.Client{Transport: tr, Timeout: 50 * time.Second}
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
		// Each asks for 1.5 MiB (more than the default max_body_bytes the
		// plugin used to copy) and reads nothing.
		const n, size = 1300, 3 << 19
		conns := make([]net.Conn, 0, n)
		defer func() {
			for _, cn := range conns {
				_ = cn.Close()
			}
		}()
		port := strings.TrimPrefix(base, "http://127.0.0.1:")
		for i := 0; i < n; i++ {
			cn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, 5*time.Second)
			if err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
			conns = append(conns, cn)
			if _, err := fmt.Fprintf(cn, "GET /big1/?size=%d&cost=5 HTTP/1.1\r\nHost: x\r\nx-api-key: b\r\n\r\n", size); err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
		}
		// Wait until Envoy has read at least 1 MiB of every answer: the
		// plugin has seen it all.
		deadline := time.Now().Add(40 * time.Second)
		for e.Stat("cluster.upstream.upstream_cx_rx_bytes_total") < n<<20 {
			if time.Now().After(deadline) {
				t.Fatalf("Envoy read %d bytes of the answers, want at least %d", e.Stat("cluster.upstream.upstream_cx_rx_bytes_total"), n<<20)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := remaining("/big1/?size=10&cost=0", "b2"); got != "99999" {
			t.Errorf("a request while %d answers wait: remaining %q, want 99999", n, got)
		}
		sys := stat("memory.sys_bytes")
		t.Logf("%d answers waiting: Envoy RSS %d MiB, the plugin's Go runtime %d MiB (memory.sys_bytes)", n, e.RSS()>>20, sys>>20)
		if sys > maxPluginSys {
			t.Errorf("the plugin's VMs hold %d MiB, more than %d MiB: bodies are held", sys>>20, maxPluginSys>>20)
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

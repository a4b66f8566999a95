package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// llmUpstream answers like an LLM API that reports usage: 30 tokens per
// answer, in a header (/header), in a JSON body (/json) or in the last
// event of a server-sent event stream (/sse, earlier events carry partial
// counts). /login answers 401 when the request has "x-password: wrong",
// else 200. /slow-sse sends its first event, then waits for the client to
// say (through release) that it has read it before sending the rest: a
// stream the plugin held back would never get there. /partial-sse sends an
// early partial count (1 token), content and finish_reason, then, unless
// the client left first (or after 10 s), the usage (3000) and [DONE];
// /partial-sse/quick sends a usage of 0 and [DONE] at once.
type llmUpstream struct {
	srv     *httptest.Server
	release chan struct{}
}

func startLLMUpstream(t *testing.T) *llmUpstream {
	t.Helper()
	u := &llmUpstream{release: make(chan struct{}, 16)}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *llmUpstream) port(t *testing.T) int { return serverPort(t, u.srv) }

// serverPort is the loopback port a test server listens on.
func serverPort(t *testing.T, srv *httptest.Server) int {
	t.Helper()
	_, p, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	switch {
	case strings.HasPrefix(r.URL.Path, "/header"):
		w.Header().Set("x-usage", "30")
		_, _ = io.WriteString(w, "ok\n")
	case strings.HasPrefix(r.URL.Path, "/json"):
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","choices":[{"message":{"content":"hi"}}],`)
		flush()
		_, _ = io.WriteString(w, `"usage":{"prompt_tokens":12,"completion_tokens":18,"total_tokens":30}}`)
	case strings.HasPrefix(r.URL.Path, "/sse"), strings.HasPrefix(r.URL.Path, "/slow-sse"):
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"h\"}}],\"usage\":{\"total_tokens\":3}}\n\n")
		flush()
		if strings.HasPrefix(r.URL.Path, "/slow-sse") {
			select {
			case <-u.release:
			case <-time.After(10 * time.Second):
				return
			}
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"i\"}}]}\n\ndata: {\"choices\":[],\"us")
		flush()
		_, _ = io.WriteString(w, "age\":{\"prompt_tokens\":12,\"completion_tokens\":18,\"total_tokens\":30}}\n\ndata: [DONE]\n\n")
	case r.URL.Path == "/partial-sse/quick":
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":0}}\n\ndata: [DONE]\n\n")
	case strings.HasPrefix(r.URL.Path, "/partial-sse"):
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"usage\":{\"total_tokens\":1}}\n\n"+
			"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"+
			"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n")
		flush()
		select {
		case <-r.Context().Done():
			return // the client left: the usage never comes
		case <-time.After(10 * time.Second):
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":3000}}\n\ndata: [DONE]\n\n")
	case strings.HasPrefix(r.URL.Path, "/login"):
		if r.Header.Get("x-password") == "wrong" {
			w.WriteHeader(http.StatusUnauthorized)
		}
		_, _ = io.WriteString(w, "login\n")
	default:
		http.NotFound(w, r)
	}
}

// responseConfig: a budget of 100 tokens per key (refilling 1 token every
// 1000 s) for each way of reporting usage, and a login rule that counts
// only failed logins.
const responseConfig = `{"rules": [
 {"name": "by-header", "match": {"path": {"prefix": "/header"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
  "cost_source": "response_header:x-usage", "default_cost": 1}},
 {"name": "by-json", "match": {"path": {"prefix": "/json"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 1}},
 {"name": "by-sse", "match": {"path": {"prefix": "/sse"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 1}},
 {"name": "slow-sse", "match": {"path": {"prefix": "/slow-sse"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 100,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 1}},
 {"name": "partial-sse", "match": {"path": {"prefix": "/partial-sse"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 10000,
  "cost_source": "response_json:usage.total_tokens", "default_cost": 10, "truncated_cost": 5000}},
 {"name": "failed-logins", "match": {"path": {"prefix": "/login"}}, "limit_keys": ["header:x-user"],
  "charge_on": ["401"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 5}}]}`

func TestResponseCosts(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testResponseCosts)
}

func testResponseCosts(t *testing.T, build envoytest.Build) {
	up := startLLMUpstream(t)
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: responseConfig,
		UpstreamPort: up.port(t), Concurrency: 2,
	})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }

	for _, tc := range []struct{ rule, path string }{
		{"by-header", "/header"}, {"by-json", "/json"}, {"by-sse", "/sse"},
	} {
		t.Run("a budget of 100 admits 4 requests costing 30: "+tc.rule, func(t *testing.T) {
			var statuses []int
			for i := 0; i < 6; i++ {
				r := c.Do("POST", tc.path, map[string]string{"x-api-key": "k"})
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				statuses = append(statuses, r.Status)
				if r.Status == 200 && !strings.Contains(string(r.Body), "ok") && !strings.Contains(string(r.Body), "total_tokens") {
					t.Fatalf("request %d: body %q", i, r.Body)
				}
				if r.Status == 429 {
					// The debt of 20 plus the 1 token asked for, at 0.001 per
					// second: 21000 s, plus up to half again of jitter.
					ra, _ := strconv.Atoi(r.Header.Get("Retry-After"))
					if ra < 21000 || ra > 31500 || r.Header.Get("RateLimit") != `"`+tc.rule+`";r=0;t=21000` {
						t.Fatalf("request %d: Retry-After %q, RateLimit %q", i, r.Header.Get("Retry-After"), r.Header.Get("RateLimit"))
					}
				}
			}
			if want := []int{200, 200, 200, 200, 429, 429}; !slicesEqual(statuses, want) {
				t.Fatalf("statuses %v, want %v", statuses, want)
			}
			if n := stat("rule." + tc.rule + ".cost_missing"); n != 0 {
				t.Fatalf("cost_missing = %d", n)
			}
		})
	}

	t.Run("the RateLimit headers", func(t *testing.T) {
		// response_header: after the charge (100 − 30); response_json:
		// after the reservation (100 − 1).
		if r := c.Do("POST", "/header", map[string]string{"x-api-key": "h"}); r.Header.Get("RateLimit-Remaining") != "70" {
			t.Errorf("response_header: remaining %q, want 70", r.Header.Get("RateLimit-Remaining"))
		}
		if r := c.Do("POST", "/json", map[string]string{"x-api-key": "h"}); r.Header.Get("RateLimit-Remaining") != "99" {
			t.Errorf("response_json: remaining %q, want 99", r.Header.Get("RateLimit-Remaining"))
		}
	})

	t.Run("a streamed body is not held back", func(t *testing.T) {
		req := c.NewRequest("POST", "/slow-sse", map[string]string{"x-api-key": "s"})
		hc := &http.Client{Timeout: 15 * time.Second}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		first, err := br.ReadString('\n')
		if err != nil || !strings.Contains(first, `"total_tokens":3`) {
			t.Fatalf("first event: %q, %v", first, err)
		}
		up.release <- struct{}{} // the upstream sends the rest only now
		rest, err := io.ReadAll(br)
		if err != nil || !strings.Contains(string(rest), "[DONE]") {
			t.Fatalf("rest: %q, %v", rest, err)
		}
		// Charged the last event's 30 (not the first's 3): the next request
		// finds 70 and reserves 1.
		up.release <- struct{}{}
		if r := c.Do("POST", "/slow-sse", map[string]string{"x-api-key": "s"}); r.Header.Get("RateLimit-Remaining") != "69" {
			t.Fatalf("after the stream: remaining %q, want 69", r.Header.Get("RateLimit-Remaining"))
		}
		if n := stat("rule.slow-sse.cost_missing"); n != 0 {
			t.Fatalf("cost_missing = %d", n)
		}
	})

	t.Run("a client that leaves at finish_reason after an early partial count", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := c.NewRequest("POST", "/partial-sse", map[string]string{"x-api-key": "p"}).WithContext(ctx)
		hc := &http.Client{Timeout: 15 * time.Second}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(res.Body)
		var read []string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("after %q: %v", read, err)
			}
			read = append(read, line)
			if strings.Contains(line, "finish_reason") {
				break
			}
		}
		if !strings.Contains(read[0], `"total_tokens":1}`) {
			t.Fatalf("first event %q, want the partial count", read[0])
		}
		cancel() // leave: the upstream never sends the usage
		_ = res.Body.Close()
		e.WaitPluginStat("tokenbucket.rule.partial-sse.cost_truncated", 1, 10*time.Second)
		// Charged truncated_cost (5000), not the partial count (1): the next
		// request finds 10000 − 5000 and reserves 10.
		r := c.Do("POST", "/partial-sse/quick", map[string]string{"x-api-key": "p"})
		if r.Err != nil || r.Header.Get("RateLimit-Remaining") != "4990" {
			t.Fatalf("after the stream: %v, remaining %q, want 4990", r.Err, r.Header.Get("RateLimit-Remaining"))
		}
		if n := stat("rule.partial-sse.cost_missing"); n != 0 {
			t.Fatalf("cost_missing = %d", n)
		}
	})

	t.Run(`charge_on ["401"]: 200s pass, a burst of 401s blocks`, func(t *testing.T) {
		login := func(password string) int {
			r := c.Do("POST", "/login", map[string]string{"x-user": "alice", "x-password": password})
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			return r.Status
		}
		for i := 0; i < 30; i++ {
			if s := login("right"); s != 200 {
				t.Fatalf("login %d: %d, want 200", i, s)
			}
		}
		for i := 0; i < 5; i++ {
			if s := login("wrong"); s != 401 {
				t.Fatalf("failed login %d: %d, want 401", i, s)
			}
		}
		if s := login("right"); s != 429 {
			t.Fatalf("after 5 failed logins: %d, want 429", s)
		}
		if n := stat("rule.failed-logins.allowed"); n != 35 {
			t.Errorf("allowed = %d, want 35", n)
		}
	})
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

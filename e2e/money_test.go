package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// moneyModels are the fake upstream's three models and their prices in
// millionths of a unit per million tokens (input, output, cached input),
// as moneyConfig writes them.
var moneyModels = map[string][3]uint64{
	"gpt-4o":        {2_500_000, 10_000_000, 1_250_000},
	"gpt-4o-mini":   {150_000, 600_000, 75_000},
	"claude-sonnet": {3_000_000, 15_000_000, 0},
}

// moneyConfig: a budget of $0.50 per tenant, priced per model from the
// request body's model; a request reserves max_tokens at its model's
// output price (the fake upstream keeps prompt and completion together
// within max_tokens, and no model's input costs more than its output, so
// a reservation covers its response). The rate refills the budget in a
// year (about the least the configuration allows: 0.02 millionths a
// second).
const moneyConfig = `{"rules": [{"name": "spend", "limit_keys": ["header:x-tenant"], "algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.00000002, "burst": 0.5, "default_cost": 0.5,
    "prices": {"model": "request_json:model", "per": 1000000, "table": {
      "gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25},
      "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cached_input": 0.075},
      "claude-sonnet": {"input": 3, "output": 15}}},
    "cost_terms": [
      {"source": "response_json:usage.prompt_tokens", "price": "input"},
      {"source": "response_json:usage.completion_tokens", "price": "output"},
      {"source": "response_json:usage.prompt_tokens_details.cached_tokens", "price": "cached_input"},
      {"source": "response_json:usage.input_tokens", "price": "input"},
      {"source": "response_json:message.usage.input_tokens", "price": "input"},
      {"source": "response_json:usage.output_tokens", "price": "output"}],
    "reserve": {"source": "request_json:max_tokens", "price": "output"}}}]}`

// moneyUpstream answers like OpenAI (/openai) and Anthropic (/anthropic),
// plain or streamed ("stream": true in the request), with usage it makes
// up from a counter and records per tenant (the ledger). /anthropic/cut
// sends message_start and waits for the client to leave.
type moneyUpstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   int
	// ledger is, per tenant, the micro-units the reported usage costs.
	ledger map[string]uint64
}

func startMoneyUpstream(t *testing.T) *moneyUpstream {
	t.Helper()
	u := &moneyUpstream{ledger: map[string]uint64{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

// cost is what usage costs at model's prices, in millionths rounded up.
func moneyCost(model string, input, output, cached uint64) uint64 {
	p := moneyModels[model]
	num := input*p[0] + output*p[1] + cached*p[2]
	return (num + 999_999) / 1_000_000
}

func (u *moneyUpstream) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string `json:"model"`
		MaxTokens uint64 `json:"max_tokens"`
		Stream    bool   `json:"stream"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err := json.Unmarshal(body, &req); err != nil || req.MaxTokens < 100 {
		http.Error(w, "bad request body", http.StatusBadRequest)
		return
	}
	u.mu.Lock()
	u.n++
	i := uint64(u.n)
	u.mu.Unlock()
	input := 20 + i*37%(req.MaxTokens/2-20)
	output := 1 + i*53%(req.MaxTokens/2)
	var cached uint64
	tenant := r.Header.Get("x-tenant")
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	record := func(c uint64) {
		u.mu.Lock()
		u.ledger[tenant] += c
		u.mu.Unlock()
	}
	switch {
	case r.URL.Path == "/anthropic/cut":
		w.Header().Set("content-type", "text/event-stream")
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", input)
		flush()
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
	case r.URL.Path == "/openai" && !req.Stream:
		cached = i % 3 * 10
		w.Header().Set("content-type", "application/json")
		record(moneyCost(req.Model, input, output, cached))
		fmt.Fprintf(w, `{"id":"c%d","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, i, input, output, cached)
	case r.URL.Path == "/openai":
		cached = i % 3 * 10
		w.Header().Set("content-type", "text/event-stream")
		record(moneyCost(req.Model, input, output, cached))
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"h\"}}],\"usage\":null}\n\n")
		flush()
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n", input, output, cached)
	case r.URL.Path == "/anthropic" && !req.Stream:
		w.Header().Set("content-type", "application/json")
		record(moneyCost(req.Model, input, output, 0))
		fmt.Fprintf(w, `{"id":"m%d","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":%d,"output_tokens":%d}}`, i, input, output)
	case r.URL.Path == "/anthropic":
		w.Header().Set("content-type", "text/event-stream")
		record(moneyCost(req.Model, input, output, 0))
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", input)
		flush()
		fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n")
		fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":%d}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", output)
	default:
		http.NotFound(w, r)
	}
}

func (u *moneyUpstream) spent(tenant string) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.ledger[tenant]
}

func TestMoneyBudget(t *testing.T) {
	t.Parallel()
	forEachBuild(t, func(t *testing.T, b envoytest.Build) { testMoneyBudget(t, b, moneyConfig, 0.02) })
}

// moneyQuotaConfig is moneyConfig's budget as "$0.50 a day" in
// Europe/Berlin: a quota, which nothing refills before its boundary.
var moneyQuotaConfig = strings.Replace(moneyConfig,
	`"algorithm": "token_bucket",
  "algorithm_config": {"tokens_per_second": 0.00000002, "burst": 0.5,`,
	`"algorithm": "quota",
  "algorithm_config": {"limit": 0.5, "period": "day", "time_zone": "Europe/Berlin",`, 1)

// TestMoneyQuota is TestMoneyBudget on a quota: with no refill, what was
// charged equals the ledger exactly (unless the test spans Berlin's
// midnight, when the day's counter starts again: then it says so).
func TestMoneyQuota(t *testing.T) {
	t.Parallel()
	if !strings.Contains(moneyQuotaConfig, `"quota"`) {
		t.Fatal("moneyQuotaConfig is not a quota")
	}
	forEachBuild(t, func(t *testing.T, b envoytest.Build) { testMoneyBudget(t, b, moneyQuotaConfig, 0) })
}

// testMoneyBudget: 200 concurrent requests per tenant over both styles,
// plain and streamed, and three models: what the budget was charged (its
// starting $2 less what a last request sees remaining and reserves)
// equals the ledger of what the upstream reported, to a millionth (the
// refill over the test, at most a few millionths, aside); the money
// admitted never passes the budget by more than one reservation; a stream
// the client leaves is charged its reservation.
func testMoneyBudget(t *testing.T, build envoytest.Build, config string, rate float64) {
	up := startMoneyUpstream(t)
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: config,
		UpstreamPort: serverPort(t, up.srv), Concurrency: 2,
	})
	c := e.Client()
	t.Cleanup(c.Close)
	const (
		budget     = 500_000 // millionths
		perCall    = 200
		maxTok     = 2000
		maxReserve = maxTok * 15 // claude-sonnet's output price: the largest reservation
	)
	// rate: millionths a second (tokens_per_second 0.00000002 × 1e6), 0 for
	// the quota.
	models := []string{"gpt-4o", "gpt-4o-mini", "claude-sonnet"}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	post := func(tenant, path, model string, maxTokens int, stream bool) *http.Request {
		b := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"hello"}]}`, model, maxTokens, stream)
		req := c.NewRequest("POST", path, map[string]string{"x-tenant": tenant, "content-type": "application/json"})
		req.Body = io.NopCloser(strings.NewReader(b))
		req.ContentLength = int64(len(b))
		return req
	}
	// remaining is what the budget of tenant holds now, in whole
	// millionths: a probe of gpt-4o-mini with max_tokens 1 reserves 1 and
	// sees the rest (its upstream answers 400, whose body has no usage:
	// the 1 stands); refused, the budget held less than 1.
	remaining := func(tenant string) int64 {
		t.Helper()
		r := c.DoRequest(post(tenant, "/probe", "gpt-4o-mini", 1, false))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if r.Status == 429 {
			return 0
		}
		v, err := strconv.ParseInt(r.Header.Get("RateLimit-Remaining"), 10, 64)
		if err != nil {
			t.Fatalf("status %d, RateLimit-Remaining %q", r.Status, r.Header.Get("RateLimit-Remaining"))
		}
		return v + 1
	}

	for _, style := range []string{"/openai", "/anthropic"} {
		for _, stream := range []bool{false, true} {
			tenant := fmt.Sprintf("%s-%t", strings.Trim(style, "/"), stream)
			t.Run(tenant, func(t *testing.T) {
				start := time.Now()
				results := c.Burst(perCall, func(i int) *http.Request {
					return post(tenant, style, models[i%3], maxTok, stream)
				})
				st := envoytest.Statuses(results)
				if st[200] == 0 || st[200]+st[429] != perCall {
					t.Fatalf("statuses %v", st)
				}
				for _, r := range results {
					if r.Status == 200 && !strings.Contains(string(r.Body), "tokens") {
						t.Fatalf("body %q", r.Body)
					}
				}
				left := remaining(tenant)
				elapsed := time.Since(start).Seconds()
				ledger := up.spent(tenant)
				charged := budget - left
				refill := int64(rate*elapsed) + 1 // the floor of the remaining's fraction
				if rate == 0 {
					refill = 0
					if day := time.Now().In(berlin).Day(); day != start.In(berlin).Day() {
						t.Fatalf("the test spanned Berlin's midnight: the day's counter started again")
					}
				}
				diff := int64(ledger) - charged
				t.Logf("%s: %d admitted of %d; ledger %d, charged %d millionths (difference %d, refill bound %d, %.1f s)",
					tenant, st[200], perCall, ledger, charged, diff, refill, elapsed)
				if diff < 0 || diff > refill {
					t.Errorf("charged %d millionths, ledger %d: off by %d (refill at most %d)", charged, ledger, diff, refill)
				}
				if over := int64(ledger) - budget - refill; over > maxReserve {
					t.Errorf("admitted %d millionths, %d past the budget: more than one reservation (%d)", ledger, over, maxReserve)
				}
				if n := e.PluginStat("tokenbucket.rule.spend.price_missing"); n != 0 {
					t.Errorf("price_missing = %d", n)
				}
			})
		}
	}

	t.Run("hostile request bodies", func(t *testing.T) {
		// Each is decided as if its body held no value (no model: no
		// price, no "*": price_missing, the reservation default_cost),
		// never answered 413 nor left hanging; bounded in count.
		before := e.PluginStat("tokenbucket.rule.spend.price_missing")
		// Over the 512 KiB bound, within Envoy's buffer limit (1 MiB: a
		// larger body the plugin held was answered 413 by Envoy).
		huge := `{"model":"gpt-4o","max_tokens":1000,"pad":"` + strings.Repeat("x", 900<<10) + `"}`
		deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
		long := `{"model":"` + strings.Repeat("m", 10000) + `","max_tokens":1000}`
		for i, b := range []string{huge, deep, long, "not json", `{"model":{"nested":"gpt-4o"}}`} {
			req := c.NewRequest("POST", "/openai", map[string]string{"x-tenant": "hostile"})
			req.Body = io.NopCloser(strings.NewReader(b))
			req.ContentLength = int64(len(b))
			r := c.DoRequest(req)
			if r.Err != nil || r.Status == 413 || r.Status == 0 {
				t.Fatalf("body %d: status %d, %v", i, r.Status, r.Err)
			}
		}
		if got := e.PluginStat("tokenbucket.rule.spend.price_missing") - before; got != 5 {
			t.Errorf("price_missing rose by %d, want 5 (every body decided without its model)", got)
		}
		// Bodies left unfinished: the client sends half and leaves. The
		// requests after them are decided as usual.
		for i := 0; i < 20; i++ {
			conn, err := net.DialTimeout("tcp", strings.TrimPrefix(e.URL(""), "http://"), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /openai HTTP/1.1\r\nHost: x\r\nx-tenant: hostile\r\ncontent-length: 1000\r\n\r\n{\"model\":\"gpt-4o\",")
			conn.Close()
		}
		if r := c.DoRequest(post("after-hostile", "/openai", "gpt-4o-mini", maxTok, false)); r.Status != 200 || r.Header.Get("RateLimit-Remaining") == "" {
			t.Fatalf("after unfinished bodies: status %d, RateLimit-Remaining %q", r.Status, r.Header.Get("RateLimit-Remaining"))
		}
	})

	t.Run("a cut stream is charged its reservation", func(t *testing.T) {
		before := remaining("cut")
		req := post("cut", "/anthropic/cut", "claude-sonnet", 1000, true) // reserves 15000
		hc := &http.Client{Timeout: 15 * time.Second}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil || !strings.Contains(line, "message_start") {
			t.Fatalf("first line %q, %v", line, err)
		}
		res.Body.Close() // the client leaves
		e.WaitPluginStat("tokenbucket.rule.spend.cost_truncated", 1, 10*time.Second)
		after := remaining("cut")
		// The probe of before kept its 1.
		if got := before - after - 1; got < 14999 || got > 15001 {
			t.Errorf("the cut stream cost %d millionths, want its reservation, 15000", got)
		}
	})
}

// TestMoneyCluster: moneyConfig's budget with scope cluster through limitd
// (Redis), two Envoys sharing it, both builds: 200 concurrent requests
// split over the two; once every charge call has reached limitd, what the
// budget was charged equals the upstream's ledger (refill aside) and the
// admitted spend stays within the budget and one reservation.
func TestMoneyCluster(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testMoneyCluster)
}

func testMoneyCluster(t *testing.T, build envoytest.Build) {
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := startMoneyUpstream(t)
	cfg := strings.Replace(moneyConfig, `{"rules": [{"name": "spend",`,
		`{"service": {"cluster": "limit_service", "timeout_ms": 1000}, "rules": [{"name": "spend", "scope": "cluster",`, 1)
	// limitd refills a cluster bucket within a week: 1 millionth a second.
	cfg = strings.Replace(cfg, `"tokens_per_second": 0.00000002`, `"tokens_per_second": 0.000001`, 1)
	envoys, ok := twoEnvoys(t, build, serverPort(t, up.srv), svc, [2]string{cfg, cfg})
	if !ok {
		return
	}
	clients := [2]*envoytest.Client{envoys[0].Client(), envoys[1].Client()}
	for _, c := range clients {
		t.Cleanup(c.Close)
	}
	const (
		budget     = 500_000
		maxReserve = 2000 * 15
	)
	models := []string{"gpt-4o", "gpt-4o-mini", "claude-sonnet"}
	post := func(c *envoytest.Client, tenant, model string, maxTokens int) *http.Request {
		b := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[]}`, model, maxTokens)
		req := c.NewRequest("POST", "/openai", map[string]string{"x-tenant": tenant})
		req.Body = io.NopCloser(strings.NewReader(b))
		req.ContentLength = int64(len(b))
		return req
	}
	start := time.Now()
	var wg sync.WaitGroup
	var results [2][]envoytest.Result
	for i := range clients {
		wg.Go(func() {
			results[i] = clients[i].Burst(100, func(j int) *http.Request { return post(clients[i], "fleet", models[j%3], 2000) })
		})
	}
	wg.Wait()
	admitted := 0
	for i := range results {
		st := envoytest.Statuses(results[i])
		if st[200]+st[429] != 100 {
			t.Fatalf("envoy %d: statuses %v", i, st)
		}
		admitted += st[200]
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		sent := envoys[0].PluginStat("tokenbucket.charge_calls") + envoys[1].PluginStat("tokenbucket.charge_calls")
		if limitdCounter(t, svc, "limitd_charges_total") >= float64(sent) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d charge calls sent, not all reached limitd", sent)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := clients[0].DoRequest(post(clients[0], "fleet", "gpt-4o-mini", 1)) // reserves 1; its 400 has no usage
	left := int64(0)
	if r.Status != 429 {
		v, err := strconv.ParseInt(r.Header.Get("RateLimit-Remaining"), 10, 64)
		if err != nil {
			t.Fatalf("probe: status %d, RateLimit-Remaining %q", r.Status, r.Header.Get("RateLimit-Remaining"))
		}
		left = v + 1
	}
	ledger := int64(up.spent("fleet"))
	charged := budget - left
	refill := int64(1*time.Since(start).Seconds()) + 1
	t.Logf("%d admitted of 200 over two Envoys; ledger %d, charged %d millionths (difference %d, refill bound %d)",
		admitted, ledger, charged, ledger-charged, refill)
	if d := ledger - charged; d < 0 || d > refill {
		t.Errorf("charged %d millionths, ledger %d", charged, ledger)
	}
	if over := ledger - budget - refill; over > maxReserve {
		t.Errorf("admitted %d millionths: %d past the budget", ledger, over)
	}
	for i, e := range envoys {
		if n := e.PluginStat("tokenbucket.service_errors"); n != 0 {
			t.Errorf("envoy %d: service_errors = %d", i, n)
		}
	}
}

package service

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// TestQuotaAttacker is a client of limitd's HTTP API over loopback TCP,
// on a real redis-server, with hostile quota bodies: out-of-range, partial
// and mistyped periods are all refused with 400 and never reach Redis;
// then a flood of 200 concurrent decisions on one quota that churns
// between the current period and the previous one (a lagging gateway's,
// which ended 10 s ago) admits at most the limit in each period (10 to 20
// in all), and no churn after it starts a period again; the one key it leaves expires after the current period's end.
func TestQuotaAttacker(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 16)
	api, err := NewServer(Config{Store: s, StoreName: "redis", Token: "tok", Timeout: floodTimeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api)
	defer hs.Close()
	post := func(body string) (int, string) {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/decide", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	now := time.Now()
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	q := `{"buckets":[{"key":"q","tokens_per_second":0,"burst":10,`
	for _, body := range []string{
		q + `"period_start_ms":` + ms(-time.Hour) + `}]}`,
		q + `"period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(time.Hour) + `,"period_end_ms":` + ms(-time.Hour) + `}]}`,
		q + `"period_start_ms":1e308,"period_end_ms":1e308}]}`,
		q + `"period_start_ms":-1,"period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":"` + ms(0) + `","period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(0) + `.5,"period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(0) + `,"period_end_ms":` + ms(400*24*time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(300*24*time.Hour) + `,"period_end_ms":` + ms(301*24*time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(-3*time.Hour) + `,"period_end_ms":` + ms(-2*time.Hour) + `}]}`,
		`{"buckets":[{"key":"q","tokens_per_second":5,"burst":10,"period_start_ms":` + ms(0) + `,"period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":null,"period_end_ms":` + ms(time.Hour) + `}]}`,
		q + `"period_start_ms":` + ms(0) + `,"period_start_ms":` + ms(0) + `,"period_end_ms":` + ms(time.Hour) + `}]}`,
	} {
		if code, b := post(body); code != http.StatusBadRequest || !strings.Contains(b, "buckets[0].") {
			t.Fatalf("%s: %d %s, want 400 naming the bucket's field", body, code, b)
		}
	}
	if n, err := redistest.Do(srv.Addr(), "DBSIZE"); err != nil || strings.TrimSpace(n) != "0" {
		t.Fatalf("DBSIZE %q, %v after refused calls: want nothing written", n, err)
	}
	current := q + `"period_start_ms":` + ms(-10*time.Second) + `,"period_end_ms":` + ms(50*time.Second) + `}]}`
	previous := q + `"period_start_ms":` + ms(-70*time.Second) + `,"period_end_ms":` + ms(-10*time.Second) + `}]}`
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 { // bounded: 200 calls, each under the client's timeout
		wg.Go(func() {
			body := current
			if i%2 == 1 {
				body = previous
			}
			code, b := post(body)
			switch {
			case code != 200:
				t.Errorf("%d %s", code, b)
			case strings.HasPrefix(b, `{"allowed":true`):
				admitted.Add(1)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	// Each period admits at most its limit: the previous one what its calls
	// took before the current period's first call started the record again
	// (none after: they then count against the current record).
	if a := admitted.Load(); a < 10 || a > 20 || a+refused.Load() != 200 {
		t.Fatalf("admitted %d, refused %d: want 10 to 20 (10 a period)", a, refused.Load())
	}
	for i := range 20 { // churn on the exhausted record: no call starts a period again
		body := current
		if i%2 == 1 {
			body = previous
		}
		if code, b := post(body); code != 200 || !strings.HasPrefix(b, `{"allowed":false`) {
			t.Fatalf("churn %d: %d %s, want refused", i, code, b)
		}
	}
	keys, err := redistest.Do(srv.Addr(), "KEYS", "*")
	if err != nil || len(strings.Fields(keys)) != 1 {
		t.Fatalf("keys %q, %v: want the quota's one", keys, err)
	}
	pttl, _ := redistest.Do(srv.Addr(), "PTTL", strings.TrimSpace(keys))
	left, _ := strconv.ParseInt(strings.TrimSpace(pttl), 10, 64)
	if end := time.Until(now.Add(50*time.Second)) + quotaMargin; time.Duration(left)*time.Millisecond < end-5*time.Second || time.Duration(left)*time.Millisecond > end+time.Second {
		t.Fatalf("PTTL %s ms, want about %v (the current period's end plus %v)", pttl, end, quotaMargin)
	}
}

package service

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// TestQuotaLeaseReturnAttacker is a client of limitd's /v1/lease over
// loopback TCP, on a real redis-server, that tries to grow a quota's
// period with returns of the period before: it leases the previous
// period's 10 (a lagging gateway's, ended 10 s ago), then floods 100
// concurrent calls that alternate a return of those 10, labelled with the
// previous period, and a lease of the current period. The current period
// grants 10 in all, never more: no return of the ended period is taken
// back into it.
func TestQuotaLeaseReturnAttacker(t *testing.T) {
	srv := redistest.Start(t)
	s := realStore(t, realClient(t, srv.Addr()), 0)
	api, err := NewServer(Config{Store: s, StoreName: "redis", Token: "tok", Timeout: floodTimeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api)
	defer hs.Close()
	type answer struct {
		Granted bool `json:"granted"`
		Buckets []struct {
			Granted float64 `json:"granted"`
		} `json:"buckets"`
	}
	post := func(body string) answer {
		req, _ := http.NewRequest("POST", hs.URL+"/v1/lease", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Error(err)
			return answer{}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var a answer
		if resp.StatusCode != 200 || json.Unmarshal(b, &a) != nil || len(a.Buckets) != 1 {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
		return a
	}
	now := time.Now()
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	bucket := func(want, lo, ret int, start, end time.Duration) string {
		return `{"buckets":[{"key":"q","tokens_per_second":0,"burst":10,"want":` + strconv.Itoa(want) + `,"min":` + strconv.Itoa(lo) +
			`,"return":` + strconv.Itoa(ret) + `,"period_start_ms":` + ms(start) + `,"period_end_ms":` + ms(end) + `}]}`
	}
	previous := func(want, ret int) string { return bucket(want, 0, ret, -70*time.Second, -10*time.Second) }
	current := bucket(3, 1, 0, -10*time.Second, 50*time.Second)
	if a := post(previous(10, 0)); !a.Granted || a.Buckets[0].Granted != 10 {
		t.Fatalf("lease of the previous period = %+v, want its 10", a)
	}
	var mu sync.Mutex
	granted := 0.0
	var wg sync.WaitGroup
	for i := range 100 { // bounded: 100 calls, each under the client's timeout
		wg.Go(func() {
			body := current
			if i%2 == 1 {
				body = previous(0, 10)
			}
			a := post(body)
			if i%2 == 0 && a.Granted && len(a.Buckets) == 1 {
				mu.Lock()
				granted += a.Buckets[0].Granted
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if granted != 10 {
		t.Fatalf("the current period granted %v in all, want its limit of 10 (returns of the previous period taken back into it)", granted)
	}
}

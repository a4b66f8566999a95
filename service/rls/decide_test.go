package rls

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// RLS and /v1/decide name a bucket the same way: the HTTP API, asked for
// key BucketKey(...) at the descriptor's rate and burst, decides the very
// bucket the rate limit service took from, on the one store.
func TestSameBucketAsDecide(t *testing.T) {
	c := newClock(epoch)
	st := memory(c)
	f := start(t, basicYAML, fixtureOpts{store: st, now: c.Now})
	for range 3 {
		f.call(request("apis", desc("generic_key", "slow")))
	}
	api, err := service.NewServer(service.Config{Store: st, StoreName: "memory", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(api)
	defer h.Close()
	key := BucketKey("apis", []rlsconfig.Entry{{Key: "generic_key", Value: "slow"}}, nil)
	if key != "apis_generic_key_slow_" {
		t.Fatalf("BucketKey = %q", key)
	}
	body := `{"buckets":[{"key":"` + key + `","tokens_per_second":` + strconv.FormatFloat(10.0/60, 'g', -1, 64) + `,"burst":10,"cost":1}]}`
	resp, err := http.Post(h.URL+"/v1/decide", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"remaining":6`) {
		t.Fatalf("/v1/decide: %d %s, want 6 left (10 - 3 by RLS - 1)", resp.StatusCode, b)
	}
	if r := f.call(request("apis", desc("generic_key", "slow"))); r.Statuses[0].LimitRemaining != 5 {
		t.Fatalf("RLS after /v1/decide: %v, want 5 left", r.Statuses[0])
	}
}

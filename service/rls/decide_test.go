package rls

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
	"github.com/ratelimit-wasm/tokenbucket/wire"
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
	key := rlsconfig.Naming{}.BucketKey("apis", []rlsconfig.Entry{{Key: "generic_key", Value: "slow"}}, nil)
	if key != "4:apis_11:generic_key_4:slow" {
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

// The rate limit service never delays (Envoy's filter can only allow or
// refuse), and a bucket that /v1/decide's delayed decisions put into debt
// refuses it until the debt is paid back and its hits are there: at 10 a
// minute, a held request's token is 6 s of debt, the time to full 66 s.
func TestDelayedDebtRefusesRLS(t *testing.T) {
	for _, name := range []string{"memory", "miniredis"} {
		t.Run(name, func(t *testing.T) {
			c := newClock(epoch)
			var st service.Store = memory(c)
			advance := c.Add
			if name == "miniredis" {
				mr := miniredis.RunT(t)
				mr.SetTime(epoch)
				client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
				t.Cleanup(func() { client.Close() })
				rs, err := service.NewRedisStore(client, service.RedisOptions{})
				if err != nil {
					t.Fatal(err)
				}
				st = rs
				advance = func(d time.Duration) { c.Add(d); mr.SetTime(c.Now()) }
			}
			f := start(t, basicYAML, fixtureOpts{store: st, now: c.Now})
			for range 10 {
				f.call(request("apis", desc("generic_key", "slow")))
			}
			key := rlsconfig.Naming{}.BucketKey("apis", []rlsconfig.Entry{{Key: "generic_key", Value: "slow"}}, nil)
			held := &wire.Request{Buckets: []wire.Bucket{{Key: key, Rate: 10.0 / 60, Burst: 10, Cost: 1, MaxDelayMs: 60_000}}}
			a, _, err := service.Decide(context.Background(), st, held)
			if err != nil || !a.Allowed || a.WaitMs != 6000 {
				t.Fatalf("/v1/decide's delayed decision: %+v, %v; want a wait of 6s", a, err)
			}
			for _, step := range []struct {
				after time.Duration
				code  pb.RateLimitResponse_Code
				reset time.Duration
			}{
				{0, over, 66 * time.Second},
				{6 * time.Second, over, 60 * time.Second}, // out of debt, no token yet
				{6 * time.Second, ok, 60 * time.Second},   // one token: taken
			} {
				advance(step.after)
				r := f.call(request("apis", desc("generic_key", "slow")))
				s := r.Statuses[0]
				if r.OverallCode != step.code || s.LimitRemaining != 0 || s.DurationUntilReset.AsDuration() != step.reset {
					t.Fatalf("+%v: %v remaining %d reset %v; want %v, 0, %v", step.after, codesOf(r), s.LimitRemaining, s.DurationUntilReset.AsDuration(), step.code, step.reset)
				}
			}
		})
	}
}

package rls

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// stores runs test on the memory store and on a RedisStore over miniredis,
// each with the clock c (fixed windows are named from the Server's clock,
// as envoyproxy/ratelimit names them from its own).
func stores(t *testing.T, c *clock, test func(t *testing.T, st service.Store)) {
	t.Run("memory", func(t *testing.T) { test(t, memory(c)) })
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { client.Close() })
		st, err := service.NewRedisStore(client, service.RedisOptions{})
		if err != nil {
			t.Fatal(err)
		}
		test(t, st)
	})
}

// A fixed window counts as envoyproxy/ratelimit does: the window is the
// clock truncated to the unit, hits over the limit are counted too, the
// reset is the window's end, and across a window's edge a client gets twice
// the limit in a second.
func TestFixedWindowEdges(t *testing.T) {
	c := newClock(epoch)
	stores(t, c, func(t *testing.T, st service.Store) {
		c.t = epoch.Add(59 * time.Second)
		f := start(t, basicYAML, fixtureOpts{store: st, now: c.Now, algo: rlsconfig.FixedWindow})
		for i := range 10 {
			r := f.call(request("apis", desc("generic_key", "slow")))
			if r.OverallCode != ok || r.Statuses[0].LimitRemaining != uint32(9-i) {
				t.Fatalf("call %d: %v", i, r)
			}
			if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != time.Second {
				t.Fatalf("call %d: reset %v, want 1s (the window's end)", i, got)
			}
		}
		if r := f.call(request("apis", desc("generic_key", "slow"))); r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("11th: %v", r)
		}
		// The next window, a second later: ten more.
		c.Add(time.Second)
		for i := range 10 {
			r := f.call(request("apis", desc("generic_key", "slow")))
			if r.OverallCode != ok {
				t.Fatalf("next window, call %d: %v", i, codesOf(r))
			}
			if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != time.Minute {
				t.Fatalf("next window: reset %v, want 60s", got)
			}
		}
		// Hits that cross the limit: 7 taken, 5 more over by 2.
		c.Add(time.Minute)
		f.call(request("apis", withHits(desc("generic_key", "slow"), 7)))
		if r := f.call(request("apis", withHits(desc("generic_key", "slow"), 5))); r.OverallCode != over {
			t.Fatalf("7 then 5 of 10: %v", codesOf(r))
		}
		// The counter holds the 12: a check (hits 0) is over too.
		if r := f.call(request("apis", withHits(desc("generic_key", "slow"), 0))); r.OverallCode != over {
			t.Fatalf("check after 12 of 10: %v", codesOf(r))
		}
		l := map[string]string{"domain": "apis", "descriptor": "generic_key_slow"}
		// envoyproxy/ratelimit's counts: window 1: 10 within (2 near), 1
		// over; window 2: 10 within (2 near); window 3: 7 within, then of
		// 5 hits 2 over and 2 near (8..10), then 0 hits over.
		for name, want := range map[string]float64{
			"limitd_rls_total_hits_total":   10 + 1 + 10 + 7 + 5,
			"limitd_rls_within_limit_total": 10 + 10 + 7,
			"limitd_rls_near_limit_total":   2 + 2 + 2,
			"limitd_rls_over_limit_total":   1 + 2,
		} {
			if got := f.counter(name, l); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
	})
}

// The counters are named as envoyproxy/ratelimit names them, so both can
// share a Redis during a cut-over.
func TestFixedWindowKeyNames(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	st, err := service.NewRedisStore(client, service.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := newClock(epoch.Add(61 * time.Second))
	f := start(t, featuresYAML, fixtureOpts{store: st, now: c.Now, algo: rlsconfig.FixedWindow})
	f.call(request("rl", desc("source_cluster", "proxy", "destination_cluster", "bkthomps"), desc("zero", "z")))
	start := epoch.Unix() + 60
	for _, k := range []string{
		"rl_source_cluster_proxy_destination_cluster_bkthomps_" + itoa(start),
		"rl_zero_z_" + itoa(start),
	} {
		if got, err := mr.Get(k); err != nil || got != "1" {
			t.Errorf("%s = %q (%v), want 1", k, got, err)
		}
		if ttl := mr.TTL(k); ttl != time.Minute {
			t.Errorf("%s: ttl %v, want 1m", k, ttl)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Exact under concurrency on a real redis-server: 300 concurrent calls on
// one key of 40 admit exactly 40, with token buckets and with fixed
// windows. The fixed window is 40 a minute with the service's clock held;
// the token bucket reads Redis's clock, so it is 40 an hour, which refills
// one token in 90 s: no slower machine makes the calls last that long.
func TestConcurrentExactRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 32})
			t.Cleanup(func() { client.Close() })
			st, err := service.NewRedisStore(client, service.RedisOptions{Batch: service.BatchOptions{MaxSize: 64, Workers: 4}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if _, err := st.Load(t.Context()); err != nil {
				t.Fatal(err)
			}
			// A fixed window must not cross an edge during the test: the
			// clock is held at the start of a minute.
			now := time.Now().Truncate(time.Minute)
			unit := "minute"
			if algo == rlsconfig.TokenBucket {
				unit = "hour"
			}
			f := start(t, `
domain: burst
descriptors:
  - key: k
    rate_limit: {unit: `+unit+`, requests_per_unit: 40}
`, fixtureOpts{store: st, algo: algo, now: func() time.Time { return now }, timeout: 10 * time.Second})
			key := algo.String() // a bucket of its own per algorithm
			var admitted, refused atomic.Int64
			var wg sync.WaitGroup
			startGate := make(chan struct{})
			errs := make(chan error, 300)
			for range 300 {
				wg.Go(func() {
					<-startGate
					r, err := f.try(context.Background(), request("burst", desc("k", key)))
					switch {
					case err != nil:
						errs <- err
					case r.OverallCode == pb.RateLimitResponse_OK:
						admitted.Add(1)
					default:
						refused.Add(1)
					}
				})
			}
			close(startGate)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if admitted.Load() != 40 || refused.Load() != 260 {
				t.Fatalf("admitted %d, refused %d; want 40 and 260", admitted.Load(), refused.Load())
			}
		})
	}
}

// With the real redis-server stopped, a call is Unavailable (so Envoy's
// failure_mode_deny decides) and the health turns NOT_SERVING; once Redis is
// back, both recover, with either algorithm.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	st, err := service.NewRedisStore(client, service.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, featuresYAML, fixtureOpts{store: st, timeout: 5 * time.Second})
	req := request("rl", desc("wild", "foo1"), withHits(desc("zero", "z"), 0)) // a bucket and a window
	if r := f.call(req); r.OverallCode != ok {
		t.Fatalf("with Redis: %v", codesOf(r))
	}
	if err := f.grpc.CheckStore(t.Context(), st, time.Second); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := f.try(t.Context(), req); status.Code(err) != codes.Unavailable {
		t.Fatalf("Redis stopped: %v, want Unavailable", err)
	}
	if err := f.grpc.CheckStore(t.Context(), st, time.Second); err == nil {
		t.Fatal("Redis stopped: the ping succeeded")
	}
	h := healthpb.NewHealthClient(f.conn)
	if r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health with Redis stopped: %v %v", r, err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if r := f.call(req); r.OverallCode != ok { // Redis restarted empty: a new bucket, an empty window
		t.Fatalf("after the restart: %v", codesOf(r))
	}
	if err := f.grpc.CheckStore(t.Context(), st, time.Second); err != nil {
		t.Fatalf("Redis back: %v", err)
	}
	if got := f.counter("limitd_rls_store_errors_total", nil); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
}

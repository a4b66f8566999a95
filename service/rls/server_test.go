package rls

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

var epoch = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

func memory(c *clock) *service.MemoryStore {
	return service.NewMemoryStore(service.MemoryOptions{Now: c.ns})
}

const basicYAML = `
domain: apis
descriptors:
  - key: generic_key
    value: slow
    rate_limit:
      unit: minute
      requests_per_unit: 10
`

// A limit of 10 a minute is a bucket of 10 refilled at 1/6 a second: ten
// calls at once are admitted, the eleventh refused; six seconds later one
// more is admitted. The answers carry the limit, the whole tokens left and
// the time to full.
func TestTokenBucketExact(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	for i := range 10 {
		r := f.call(request("apis", desc("generic_key", "slow")))
		st := r.Statuses[0]
		if r.OverallCode != ok || st.Code != ok {
			t.Fatalf("call %d: %v", i, codesOf(r))
		}
		if got, want := st.LimitRemaining, uint32(9-i); got != want {
			t.Errorf("call %d: remaining %d, want %d", i, got, want)
		}
		if got, want := st.CurrentLimit.GetRequestsPerUnit(), uint32(10); got != want || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
			t.Errorf("call %d: current limit %v", i, st.CurrentLimit)
		}
		// i+1 tokens taken, refilled at 6 s each.
		if got, want := st.DurationUntilReset.AsDuration(), time.Duration(i+1)*6*time.Second; got != want {
			t.Errorf("call %d: duration until reset %v, want %v", i, got, want)
		}
	}
	r := f.call(request("apis", desc("generic_key", "slow")))
	if !slices.Equal(codesOf(r), []pb.RateLimitResponse_Code{over, over}) {
		t.Fatalf("11th call: %v, want over limit", codesOf(r))
	}
	if r.Statuses[0].LimitRemaining != 0 || r.Statuses[0].DurationUntilReset.AsDuration() != time.Minute {
		t.Errorf("11th call: %v", r.Statuses[0])
	}
	c.Add(6*time.Second - time.Millisecond)
	if r := f.call(request("apis", desc("generic_key", "slow"))); r.OverallCode != over {
		t.Fatalf("before the refill: %v", codesOf(r))
	}
	c.Add(time.Millisecond)
	if r := f.call(request("apis", desc("generic_key", "slow"))); r.OverallCode != ok {
		t.Fatalf("after 6s: %v", codesOf(r))
	}
	if got := f.counter("limitd_rls_total_hits_total", map[string]string{"domain": "apis", "descriptor": "generic_key_slow"}); got != 13 {
		t.Errorf("total hits %v, want 13", got)
	}
	if got := f.counter("limitd_rls_over_limit_total", map[string]string{"descriptor": "generic_key_slow"}); got != 2 {
		t.Errorf("over limit %v, want 2", got)
	}
	if got := f.counter("limitd_rls_within_limit_total", map[string]string{"descriptor": "generic_key_slow"}); got != 11 {
		t.Errorf("within limit %v, want 11", got)
	}
	// Near limit: the takes that left fewer than 2 tokens (80% of 10 used):
	// the 9th and 10th call, and the one after the refill.
	if got := f.counter("limitd_rls_near_limit_total", map[string]string{"descriptor": "generic_key_slow"}); got != 3 {
		t.Errorf("near limit %v, want 3", got)
	}
}

// A request refused by one descriptor takes nothing from the others: on
// the memory store, on a real redis-server, and on a Redis Cluster where the
// two buckets fall in different slots (one script per slot, and what one
// took is given back when the other refuses).
func TestAtomicDescriptors(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	run := func(t *testing.T, st service.Store) {
		c := newClock(epoch)
		f := start(t, yaml, fixtureOpts{store: st, now: c.Now})
		for range 2 {
			if r := f.call(request("d", desc("user", "u1"), desc("route", "r"))); r.OverallCode != ok {
				t.Fatal(codesOf(r))
			}
		}
		r := f.call(request("d", desc("user", "u1"), desc("route", "r")))
		if !slices.Equal(codesOf(r), []pb.RateLimitResponse_Code{over, ok, over}) {
			t.Fatalf("third: %v", codesOf(r))
		}
		if got := r.Statuses[0].LimitRemaining; got != 98 {
			t.Errorf("user's bucket: %d left, want 98 (the refused request took nothing)", got)
		}
		if r := f.call(request("d", desc("user", "u1"))); r.Statuses[0].LimitRemaining != 97 {
			t.Errorf("user's bucket alone: %v, want 97 left", r.Statuses[0])
		}
	}
	t.Run("memory", func(t *testing.T) { run(t, memory(newClock(epoch))) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		run(t, redisStore(t, redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t)
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
		run(t, redisStore(t, client))
		slots := map[string]bool{}
		for _, addr := range cl.Addrs() {
			keys, err := redistest.Do(addr, "KEYS", "*")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range strings.Fields(keys) {
				slot, err := redistest.Do(addr, "CLUSTER", "KEYSLOT", k)
				if err != nil {
					t.Fatal(err)
				}
				slots[slot] = true
			}
		}
		if len(slots) != 2 {
			t.Errorf("the buckets are in %d slot(s), want 2: the test did not cross slots", len(slots))
		}
	})
}

// redisStore is a batching RedisStore on client, loaded.
func redisStore(t *testing.T, client redis.UniversalClient) *service.RedisStore {
	t.Helper()
	t.Cleanup(func() { client.Close() })
	st, err := service.NewRedisStore(client, service.RedisOptions{Batch: service.BatchOptions{MaxSize: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

// A store failure is a gRPC error (Unavailable), so Envoy's
// failure_mode_deny decides.
func TestStoreFailure(t *testing.T) {
	f := start(t, basicYAML, fixtureOpts{store: failing{errors.New("service: redis: dial tcp: connection refused")}})
	_, err := f.try(context.Background(), request("apis", desc("generic_key", "slow")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if got := f.counter("limitd_rls_store_errors_total", nil); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
	// A descriptor without a limit needs no store.
	if r := f.call(request("apis", desc("other", "x"))); r.OverallCode != ok {
		t.Errorf("unlimited descriptor: %v", codesOf(r))
	}
}

type failing struct{ err error }

func (f failing) Decide(context.Context, *wire.Request) (wire.Answer, error) {
	return wire.Answer{}, f.err
}

func (f failing) Lease(context.Context, *wire.LeaseRequest) (wire.LeaseAnswer, error) {
	return wire.LeaseAnswer{}, f.err
}

func (f failing) Charge(context.Context, *wire.ChargeRequest) (wire.ChargeAnswer, error) {
	return wire.ChargeAnswer{}, f.err
}

func (f failing) Count(context.Context, *service.CountRequest) (service.CountAnswer, error) {
	return service.CountAnswer{}, f.err
}
func (f failing) Ping(context.Context) error { return f.err }
func (f failing) Close() error               { return nil }

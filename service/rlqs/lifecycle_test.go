package rlqs

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rls"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// At shutdown each stream is told what Envoy should do without limitd:
// abandon its buckets (then its no_assignment_behavior applies), or keep
// its assignments until their TTL; the stream then ends Unavailable, and
// no new stream opens.
func TestShutdown(t *testing.T) {
	for _, abandon := range []bool{true, false} {
		f := start(t, quotaYAML, fixtureOpts{})
		s, _ := f.open("")
		exchange(t, s, "quota", usage(map[string]string{"api_key": "a"}, 0, 1, 0), usage(map[string]string{"free": "x"}, 0, 1, 0))
		f.srv.Shutdown(abandon)
		abandoned := 0
		var err error
		for {
			r, e := s.Recv()
			if e != nil {
				err = e
				break
			}
			for _, a := range r.BucketAction {
				if a.GetAbandonAction() != nil {
					abandoned++
				}
			}
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("abandon %v: the stream ended with %v, want Unavailable", abandon, err)
		}
		if want := map[bool]int{true: 2, false: 0}[abandon]; abandoned != want {
			t.Errorf("abandon %v: %d buckets abandoned, want %d", abandon, abandoned, want)
		}
		t.Logf("abandon %v: %v", abandon, err)
		s, _ = f.open("")
		if c := code(t, s, buckets(0, 1)); c != codes.Unavailable {
			t.Errorf("a stream opened after shutdown: %v, want Unavailable", c)
		}
	}
}

// A bucket reported idle for AbandonAfter is abandoned; what it was
// assigned stays counted until its TTL and grace have passed (Envoy may not
// have received the abandon), then nothing is.
func TestAbandonIdle(t *testing.T) {
	c := &clock{t: epoch}
	f := start(t, quotaYAML, fixtureOpts{store: memoryStore(c), clock: c})
	id := map[string]string{"api_key": "idle"}
	key := rls.BucketKey("quota", []rlsconfig.Entry{{Key: "api_key", Value: "idle"}}, nil)
	a := f.node(id, "")
	run(f, []*node{a}, []float64{1}, 5*time.Second, time.Second, func(time.Time) {})
	for i := 0; ; i++ {
		if i > int(DefaultAbandonAfter/time.Second)+1 {
			t.Fatalf("a bucket idle for %v was not abandoned", time.Duration(i)*time.Second)
		}
		c.Add(time.Second)
		r := exchange(t, a.s, "quota", a.e.report(c.Now()))
		if x := r.BucketAction[0]; x.GetAbandonAction() == nil {
			a.e.apply(x, c.Now())
			continue
		}
		t.Logf("abandoned after %v idle", time.Duration(i+1)*time.Second)
		break
	}
	if rate, _, _ := f.srv.alloc.Counted(key, c.Now()); rate == 0 {
		t.Errorf("abandoned: its last assignment is no longer counted before its TTL")
	}
	c.Add(DefaultTTL + DefaultGrace)
	if rate, m, _ := f.srv.alloc.Counted(key, c.Now()); rate != 0 || m != 0 {
		t.Errorf("abandoned, its TTL and grace past: still counted %.2f/s, %.0f max_tokens", rate, m)
	}
}

// The quota service leases nothing from the store: with Redis down, the
// stream goes on and every report is answered.
func TestStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	st, err := service.NewRedisStore(client, service.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, quotaYAML, fixtureOpts{store: st})
	s, _ := f.open("")
	id := map[string]string{"api_key": "down"}
	tokenBucket(t, exchange(t, s, "quota", usage(id, 0, 1, 0)).BucketAction[0])
	srv.Kill()
	f.clock.Add(time.Second)
	r := exchange(t, s, "quota", usage(id, 1, 0, time.Second), usage(map[string]string{"free": "x"}, 1, 0, time.Second))
	if len(r.BucketAction) != 2 {
		t.Fatalf("with Redis down, want both buckets answered, got %v", r)
	}
	tokenBucket(t, r.BucketAction[0])
}

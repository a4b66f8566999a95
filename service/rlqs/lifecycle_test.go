package rlqs

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/service"
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
	key := rlsconfig.Naming{}.BucketKey("quota", []rlsconfig.Entry{{Key: "api_key", Value: "idle"}}, nil)
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

// gauge reads a gauge's value.
func gauge(t *testing.T, g interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// Every stream's handler ends with its context: 10,000 streams, each
// answered once and then dropped by its client (its context cancelled, as
// an Envoy that restarts does), leave the streams gauge at its baseline,
// the goroutines near theirs, and no stream counted against its caller, so
// the 10,001st opens. The door's reset budget (which closes a connection
// that resets streams faster than a gateway does) is lifted: this test drops
// streams on one connection as fast as it can.
func TestStreamsEndWithTheirContext(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{tokens: callers, resetsPerSecond: 1e9, resetBurst: 1 << 30})
	base := gauge(t, f.srv.opts.Metrics.streams)
	goroutines := runtime.NumGoroutine()
	const n, workers = 10_000, 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer honest-token")
				s, err := rlqspb.NewRateLimitQuotaServiceClient(f.conn).StreamRateLimitQuotas(ctx)
				if err == nil {
					err = s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
						usage(map[string]string{"free": fmt.Sprint(i)}, 1, 0, 0)}})
				}
				if err == nil {
					_, err = s.Recv()
				}
				cancel()
				if err != nil {
					errs <- fmt.Errorf("stream %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The handlers end as their cancellations arrive: wait for that,
	// bounded.
	deadline := time.Now().Add(30 * time.Second)
	for gauge(t, f.srv.opts.Metrics.streams) != base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // waiting for the handlers, bounded by the deadline
	}
	if got := gauge(t, f.srv.opts.Metrics.streams); got != base {
		t.Fatalf("limitd_rlqs_streams after %d streams opened and dropped: %v, want %v", n, got, base)
	}
	// Each stream's reader goroutine ends too (a margin for gRPC's own).
	for runtime.NumGoroutine() > goroutines+50 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // waiting for the goroutines, bounded by the deadline
	}
	if got := runtime.NumGoroutine(); got > goroutines+50 {
		t.Errorf("%d goroutines after %d streams opened and dropped, %d before", got, n, goroutines)
	}
	f.srv.mu.Lock()
	open, held := len(f.srv.streams), f.srv.byCaller["honest"]
	f.srv.mu.Unlock()
	if open != 0 || held != 0 {
		t.Errorf("after %d streams dropped: %d open, %d counted against their caller, want 0", n, open, held)
	}
	s, _ := f.open("honest-token")
	exchange(t, s, "quota", usage(map[string]string{"free": "x"}, 1, 0, 0))
}

// Idle buckets of every kind are abandoned, not only those leased: a
// bucket answered with a blanket rule (unlimited, a limit of 0, a fixed
// window, shadow mode, unmatched) and reported idle for AbandonAfter is
// abandoned, so that ordinary traffic does not fill Envoy's reports and the
// stream's bound with buckets nobody uses.
func TestAbandonIdleBlanket(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{})
	s, _ := f.open("")
	ids := []map[string]string{{"free": "x"}, {"blocked": "x"}, {"counted": "x"}, {"watched": "x"}, {"nothing": "x"}}
	report := func(allowed uint64) *rlqspb.RateLimitQuotaResponse {
		var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		for _, id := range ids {
			us = append(us, usage(id, allowed, 0, 5*time.Second))
		}
		return exchange(t, s, "quota", us...)
	}
	if _, bl, _ := kinds(report(1)); bl != len(ids) {
		t.Fatalf("want %d blanket rules at the first report", len(ids))
	}
	for i := 0; ; i++ {
		if i > int(DefaultAbandonAfter/(5*time.Second))+1 {
			t.Fatalf("blanket buckets reported idle for %v were not abandoned", time.Duration(i)*5*time.Second)
		}
		f.clock.Add(5 * time.Second)
		r := report(0)
		_, bl, ab := kinds(r)
		if ab == 0 {
			continue
		}
		if ab != len(ids) || bl != 0 {
			t.Fatalf("after %v idle: %d abandoned, %d blanket rules; want all %d abandoned", time.Duration(i+1)*5*time.Second, ab, bl, len(ids))
		}
		t.Logf("abandoned after %v reported idle", time.Duration(i+1)*5*time.Second)
		break
	}
	if got := f.srv.tracked.Load(); got != 0 {
		t.Errorf("%d buckets kept after all were abandoned, want 0", got)
	}
}

// The quota service names a descriptor's bucket as the rate limit service
// does, whatever --max-key-bytes is: a value past the bound is hashed into
// the same name by both doors, so both count one bucket.
func TestNamingFollowsMaxKeyBytes(t *testing.T) {
	c := &clock{t: epoch}
	f := start(t, quotaYAML, fixtureOpts{store: memoryStore(c), clock: c, maxKeyBytes: 64})
	long := strings.Repeat("k", 200)
	entries := []rlsconfig.Entry{{Key: "api_key", Value: long}}
	want := rlsconfig.Naming{MaxKeyBytes: 64}.BucketKey("quota", entries, nil)
	if want == (rlsconfig.Naming{}).BucketKey("quota", entries, nil) {
		t.Fatal("the test's value is not past the bound it sets")
	}
	a := f.node(map[string]string{"api_key": long}, "")
	run(f, []*node{a}, []float64{1}, 10*time.Second, time.Second, func(time.Time) {})
	if rate, _, _ := f.srv.alloc.Counted(want, c.Now()); rate == 0 {
		t.Errorf("nothing counted under the rate limit service's name %q of the descriptor", want)
	}
}

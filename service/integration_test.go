package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Integration tests against real redis-server processes (package
// redistest): they skip when redis-server is missing, and fail then if
// CI=true.

func realClient(t *testing.T, addrs ...string) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: addrs, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func realStore(t *testing.T, c redis.UniversalClient, batch int) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(c, RedisOptions{Batch: BatchOptions{MaxSize: batch}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// admitConcurrently runs n concurrent single-cost decisions on one bucket
// and returns how many were admitted.
func admitConcurrently(t *testing.T, s Store, n int, req *wire.Request) int {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err := s.Decide(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	return int(admitted.Load())
}

func TestIntegrationRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	for _, batch := range []int{0, 64} {
		t.Run("batch"+strconv.Itoa(batch), func(t *testing.T) {
			s := realStore(t, c, batch)
			ctx := context.Background()
			key := "exact-" + strconv.Itoa(batch)
			if got := admitConcurrently(t, s, 300, one(key, 0.01, 40, 1)); got != 40 {
				t.Fatalf("admitted %d of 300 with burst 40, want exactly 40", got)
			}
			// Expiry: the time to be full again, +1ms, less what passed
			// between the write and the read (a loaded machine may take
			// tens of milliseconds between them: the bound is measured, not
			// assumed).
			began := time.Now()
			d, err := s.Decide(ctx, one("ttl-"+key, 10, 10, 10))
			if err != nil || !d.Allowed {
				t.Fatalf("Decide = %+v, %v", d, err)
			}
			pttl := c.PTTL(ctx, storageKey(DefaultKeyPrefix, "ttl-"+key, 10, 10)).Val()
			if passed := time.Since(began); pttl < 1001*time.Millisecond-passed-2*time.Millisecond || pttl > 1001*time.Millisecond {
				t.Fatalf("PTTL = %v, %v after the decision was sent: want 1001ms less at most that", pttl, passed)
			}
			// NOSCRIPT: the script cache flushed, decisions go on.
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Decide(ctx, one("after-flush", 1, 1, 1)); err != nil {
				t.Fatalf("Decide after SCRIPT FLUSH: %v", err)
			}
			if ok, _ := c.ScriptExists(ctx, s.ScriptSHA()).Result(); len(ok) != 1 || !ok[0] {
				t.Fatal("script not loaded again after NOSCRIPT")
			}
		})
	}
}

// TestIntegrationRedisArithmetic checks real Redis's Lua (5.1, C doubles)
// against package bucket: for every admitted decision, the state read
// before it, taken at the time the script stored, must give the tokens the
// script stored, to the bit.
func TestIntegrationRedisArithmetic(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 0)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 4))
	checked := 0
	for round := range 20 {
		lim := bucket.Limit{Rate: 1e3 * math.Pow(1e3, r.Float64()), Burst: 0}
		lim.Burst = lim.Rate * (0.001 + r.Float64()/10) // full within 0.1s: every branch of the refill
		key := "arith-" + strconv.Itoa(round)
		skey := storageKey(DefaultKeyPrefix, key, lim.Rate, lim.Burst)
		for range 50 {
			cost := float64(1+r.IntN(int(lim.Burst/4)+1)) + r.Float64()
			before, err := c.Get(ctx, skey).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			d, err := s.Decide(ctx, one(key, lim.Rate, lim.Burst, cost))
			if err != nil {
				t.Fatal(err)
			}
			after, err := c.Get(ctx, skey).Result()
			if !d.Allowed || errors.Is(err, redis.Nil) || before == "" {
				continue
			}
			old, err1 := parseStored(before)
			cur, err2 := parseStored(after)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			next, dec := lim.Take(old, cur.At, cost)
			if !dec.Allowed || math.Float64bits(next.Tokens) != math.Float64bits(cur.Tokens) ||
				math.Float64bits(d.Buckets[0].Tokens) != math.Float64bits(cur.Tokens) || dec.Remaining != d.Buckets[0].Remaining {
				t.Fatalf("limit %+v, %q -> %q, cost %g: bucket says %+v %+v, script %+v", lim, before, after, cost, next, dec, d.Buckets[0])
			}
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("only %d decisions checked", checked)
	}
}

// parseStored reads a stored bucket "<tokens> <at µs>" (and its ledger,
// which it skips).
func parseStored(v string) (bucket.State, error) {
	fields := strings.Fields(v)
	ok := len(fields) == 2 || len(fields) == 8
	tok, at := "", ""
	if ok {
		tok, at = fields[0], fields[1]
	}
	f, err1 := strconv.ParseFloat(tok, 64)
	us, err2 := strconv.ParseInt(at, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return bucket.State{}, fmt.Errorf("stored value %q", v)
	}
	return bucket.State{Tokens: f, At: us * 1000}, nil
}

// TestIntegrationRedisRestart kills Redis under a store: decisions fail fast
// (no hang), and succeed again soon after it is back, script reloaded.
func TestIntegrationRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	for _, batch := range []int{0, 16} {
		t.Run("batch"+strconv.Itoa(batch), func(t *testing.T) {
			s := realStore(t, c, batch)
			req := one("restart", 1, 5, 1)
			if _, err := s.Decide(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			srv.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			start := time.Now()
			_, err := s.Decide(ctx, req)
			cancel()
			if err == nil {
				t.Fatal("Decide with Redis killed succeeded")
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Fatalf("Decide with Redis killed took %v", d)
			}
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				d, err := s.Decide(ctx, req)
				cancel()
				if err == nil {
					if !d.Allowed || d.Buckets[0].Remaining != 4 {
						t.Fatalf("first decision after restart = %+v, want a fresh bucket", d)
					}
					break
				}
				if time.Since(back) > time.Second {
					t.Fatalf("still failing 1s after Redis came back: %v", err)
				}
				time.Sleep(10 * time.Millisecond) // polling a recovering server, bounded above
			}
		})
	}
}

func TestIntegrationCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := realClient(t, cl.Addrs()...)
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("client is %T, want a cluster client", c)
	}
	for _, batch := range []int{0, 64} {
		t.Run("batch"+strconv.Itoa(batch), func(t *testing.T) {
			s := realStore(t, c, batch)
			ctx := context.Background()
			prefix := "b" + strconv.Itoa(batch) + "-"
			// Keys spread over the three primaries.
			var wg sync.WaitGroup
			for i := range 60 {
				wg.Go(func() {
					if _, err := s.Decide(ctx, one(prefix+strconv.Itoa(i), 1, 5, 1)); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for _, addr := range cl.Addrs() {
				n, err := redistest.Do(addr, "DBSIZE")
				if err != nil || n == "0" {
					t.Errorf("node %s holds %s keys (%v): want keys on every primary", addr, n, err)
				}
			}
			// Exact under concurrency.
			if got := admitConcurrently(t, s, 200, one(prefix+"hot", 0.01, 40, 1)); got != 40 {
				t.Fatalf("admitted %d, want 40", got)
			}
			// Several buckets in different slots: all or none (what one
			// slot took is given back when another refuses).
			multi := &wire.Request{HashTag: prefix + "user", Buckets: []wire.Bucket{
				{Key: prefix + "second", Rate: 1, Burst: 1, Cost: 1},
				{Key: prefix + "minute", Rate: 0.1, Burst: 5, Cost: 1},
			}}
			if keySlot(storageKey(DefaultKeyPrefix, prefix+"second", 1, 1)) == keySlot(storageKey(DefaultKeyPrefix, prefix+"minute", 0.1, 5)) {
				t.Fatal("the two buckets share a slot: pick other keys")
			}
			if d, err := s.Decide(ctx, multi); err != nil || !d.Allowed {
				t.Fatalf("multi = %+v, %v", d, err)
			}
			d, err := s.Decide(ctx, multi)
			if err != nil || d.Allowed || d.Buckets[1].Remaining != 4 {
				t.Fatalf("second multi = %+v, %v; want refused, minute untouched at 4", d, err)
			}
			// A bucket's Redis key does not depend on the other rules: the
			// same key decided alone, without a hash tag, and beside a
			// second rule, with the plugin's old hash tag, is one bucket.
			alone := one(prefix+"rule", 1, 5, 1)
			if d, err := s.Decide(ctx, alone); err != nil || d.Buckets[0].Remaining != 4 {
				t.Fatalf("alone = %+v, %v", d, err)
			}
			pair := &wire.Request{HashTag: "tokenbucket", Buckets: []wire.Bucket{alone.Buckets[0], {Key: prefix + "other", Rate: 1, Burst: 5, Cost: 1}}}
			if d, err := s.Decide(ctx, pair); err != nil || !d.Allowed || d.Buckets[0].Remaining != 3 {
				t.Fatalf("beside a second rule = %+v, %v; want the same bucket, 3 left", d, err)
			}
			if v, err := c.Get(ctx, storageKey(DefaultKeyPrefix, prefix+"rule", 1, 5)).Result(); err != nil || !strings.HasPrefix(v, "3") {
				t.Fatalf("stored %q, %v: want the one key holding 3 tokens", v, err)
			}
			// Leases on a cluster: concurrent grants on one key never exceed
			// its burst, and several buckets under one hash tag are leased
			// atomically.
			var mu sync.Mutex
			var granted float64
			for range 30 {
				wg.Go(func() {
					a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: prefix + "leased", Rate: 0.01, Burst: 40, Want: 3, Min: 1}}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					granted += a.Buckets[0].Tokens
					mu.Unlock()
				})
			}
			wg.Wait()
			if granted < 40 || granted > 40.01 { // 0.01 token/s refills a little meanwhile
				t.Fatalf("30 leases of up to 3 on a burst of 40 granted %v, want 40", granted)
			}
			lm := &wire.LeaseRequest{HashTag: prefix + "user", Buckets: []wire.LeaseBucket{
				{Key: prefix + "lease-second", Rate: 1, Burst: 1, Want: 1, Min: 1},
				{Key: prefix + "lease-minute", Rate: 0.1, Burst: 5, Want: 2, Min: 1},
			}}
			if a, err := s.Lease(ctx, lm); err != nil || !a.Granted || a.Buckets[1].Tokens != 2 {
				t.Fatalf("multi lease = %+v, %v", a, err)
			}
			if a, err := s.Lease(ctx, lm); err != nil || a.Granted || a.Buckets[1].Remaining != 3 {
				t.Fatalf("second multi lease = %+v, %v; want refused, minute untouched at 3", a, err)
			}
			// The script cache flushed on every primary: decisions go on.
			for _, addr := range cl.Addrs() {
				if _, err := redistest.Do(addr, "SCRIPT", "FLUSH"); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 10 {
				if _, err := s.Decide(ctx, one(prefix+"flushed"+strconv.Itoa(i), 1, 1, 1)); err != nil {
					t.Fatalf("after SCRIPT FLUSH: %v", err)
				}
				if _, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{{Key: prefix + "flushed-lease" + strconv.Itoa(i), Rate: 1, Burst: 1, Want: 1}}}); err != nil {
					t.Fatalf("lease after SCRIPT FLUSH: %v", err)
				}
			}
		})
	}
}

// floodTimeout bounds each decision of the tests that flood limitd with
// concurrent calls over a real Redis to check what it admits, not how fast:
// under -race, at nice 10 beside the end-to-end tests, some of 300 waited
// more than the default second for their turn and were answered 503.
const floodTimeout = 30 * time.Second

// TestIntegrationHTTP drives the HTTP API over a real Redis: 300 concurrent
// requests on one key with burst 40 admit exactly 40.
func TestIntegrationHTTP(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 64)
	api, err := NewServer(Config{Store: s, StoreName: "redis", Token: "tok", Timeout: floodTimeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(api)
	defer hs.Close()
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	body := `{"buckets":[{"key":"http","tokens_per_second":0.01,"burst":40}]}`
	for range 300 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", hs.URL+"/v1/decide", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := hs.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode != 200:
				t.Errorf("%d %s", resp.StatusCode, b)
			case strings.HasPrefix(string(b), `{"allowed":true`):
				admitted.Add(1)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 40 || refused.Load() != 260 {
		t.Fatalf("admitted %d, refused %d; want 40 and 260", admitted.Load(), refused.Load())
	}
	resp, err := hs.Client().Get(hs.URL + "/readyz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestIntegrationLedger: on a real redis-server and a real Redis Cluster,
// the ledger is changed atomically with its bucket: 200 concurrent returns
// of 5 after one grant of 40 give back exactly 40, and 200 concurrent
// refunds of 5 after one decision of 40 give back exactly 40; on the
// cluster, a lease and a decision over buckets in different slots record
// (and give back) each bucket's own share.
func TestIntegrationLedger(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t)
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
	}{{"single", realClient(t, srv.Addr())}, {"cluster", realClient(t, cl.Addrs()...)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := realStore(t, tc.c, 64)
			ctx := context.Background()
			// A slow bucket of 100, drained by the grant of 40 and a
			// decision of 60, so that no return meets its burst.
			lim := wire.LeaseBucket{Key: "ledger-lease", Rate: 0.01, Burst: 100}
			g := lim
			g.Want, g.Min = 40, 40
			if a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{g}}); err != nil || a.Buckets[0].Tokens != 40 {
				t.Fatalf("grant = %+v, %v", a, err)
			}
			if d, err := s.Decide(ctx, one("ledger-lease", 0.01, 100, 60)); err != nil || !d.Allowed {
				t.Fatalf("decide 60 = %+v, %v", d, err)
			}
			var mu sync.Mutex
			var returned float64
			var wg sync.WaitGroup
			for range 200 {
				wg.Go(func() {
					ret := lim
					ret.Return = 5
					a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{ret}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					returned += a.Buckets[0].Returned
					mu.Unlock()
				})
			}
			wg.Wait()
			if returned != 40 {
				t.Fatalf("200 concurrent returns of 5 after a grant of 40 gave back %v, want 40", returned)
			}
			if d, err := s.Decide(ctx, refundable("ledger-refund", 0.01, 100, 40)); err != nil || !d.Allowed {
				t.Fatalf("decide 40 = %+v, %v", d, err)
			}
			drain := wire.LeaseBucket{Key: "ledger-refund", Rate: 0.01, Burst: 100, Want: 60, Min: 60}
			if a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: []wire.LeaseBucket{drain}}); err != nil || !a.Granted {
				t.Fatalf("lease 60 = %+v, %v", a, err)
			}
			if refunded := concurrentRefunds(ctx, t, s, wire.ChargeBucket{Key: "ledger-refund", Rate: 0.01, Burst: 100, Amount: -5}, 200); refunded != 40 {
				t.Fatalf("200 concurrent refunds of 5 after a decision of 40 gave back %v, want 40", refunded)
			}
			// Buckets in different slots (on the cluster): each records its
			// own grant; returning both gives back each one's share only.
			two := []wire.LeaseBucket{{Key: "ledger-a", Rate: 0.01, Burst: 100, Want: 4, Min: 4}, {Key: "ledger-b", Rate: 0.01, Burst: 100, Want: 6, Min: 6}}
			if a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: two}); err != nil || !a.Granted {
				t.Fatalf("lease over two buckets = %+v, %v", a, err)
			}
			drainBoth := &wire.Request{Buckets: []wire.Bucket{{Key: "ledger-a", Rate: 0.01, Burst: 100, Cost: 90}, {Key: "ledger-b", Rate: 0.01, Burst: 100, Cost: 90}}}
			if d, err := s.Decide(ctx, drainBoth); err != nil || !d.Allowed {
				t.Fatalf("drain = %+v, %v", d, err)
			}
			back := []wire.LeaseBucket{{Key: "ledger-a", Rate: 0.01, Burst: 100, Return: 10}, {Key: "ledger-b", Rate: 0.01, Burst: 100, Return: 10}}
			a, err := s.Lease(ctx, &wire.LeaseRequest{Buckets: back})
			// What went back into each bucket (tokens after less before: the
			// last bits may differ from the grant).
			if err != nil || math.Abs(a.Buckets[0].Returned-4) > 1e-9 || math.Abs(a.Buckets[1].Returned-6) > 1e-9 {
				t.Fatalf("returns of 10 each = %+v, %v; want 4 and 6 back", a, err)
			}
		})
	}
}

// TestIntegrationDelay: on a real redis-server and a real Redis Cluster,
// with pipelining: 200 concurrent decisions that may wait 10 s on a bucket
// of burst 5 at 1 a second admit burst + rate × max delay (plus what refills
// meanwhile), each within its bound; the script's delayed takes match
// package bucket's Reserve to the bit (real Redis's Lua); on the cluster, a
// delayed take in one slot is given back when a bucket in another slot
// refuses; 100 concurrent refunds of one held request give back exactly
// what it took.
func TestIntegrationDelay(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t)
	for _, tc := range []struct {
		name string
		c    redis.UniversalClient
	}{{"single", realClient(t, srv.Addr())}, {"cluster", realClient(t, cl.Addrs()...)}} {
		t.Run(tc.name, func(t *testing.T) {
			s := realStore(t, tc.c, 64)
			ctx := context.Background()

			// Bounded under concurrency.
			req := delayed("delay-hot", 1, 5, 10_000)
			var mu sync.Mutex
			var waits []int64
			start := time.Now()
			var wg sync.WaitGroup
			for range 200 {
				wg.Go(func() {
					d, err := s.Decide(ctx, req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						waits = append(waits, d.WaitMs)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			refill := int(math.Ceil(elapsed.Seconds())) // 1 a second
			if n := len(waits); n < 15 || n > 15+refill {
				t.Fatalf("admitted %d of 200 in %v, want 15 (burst 5 + 1/s × 10s) to %d", n, elapsed, 15+refill)
			}
			for _, w := range waits {
				if w > 10_000 {
					t.Fatalf("a wait of %dms past the bound of 10s", w)
				}
			}

			// Real Lua against package bucket.
			r := rand.New(rand.NewPCG(5, 6))
			checked := 0
			for round := range 10 {
				lim := bucket.Limit{Rate: 1e3 * math.Pow(1e2, r.Float64())}
				lim.Burst = max(1, math.Round(lim.Rate*(0.001+r.Float64()/20))) // bursts below the rate too
				key := "delay-arith-" + strconv.Itoa(round)
				skey := storageKey(DefaultKeyPrefix, key, lim.Rate, lim.Burst)
				for range 40 {
					cost := float64(1+r.IntN(int(lim.Burst)+1)) + r.Float64()/2
					cost = min(cost, lim.Burst)
					delay := int64(1 + r.IntN(100))
					b := wire.Bucket{Key: key, Rate: lim.Rate, Burst: lim.Burst, Cost: cost, MaxDelayMs: delay}
					before, err := tc.c.Get(ctx, skey).Result()
					if err != nil && !errors.Is(err, redis.Nil) {
						t.Fatal(err)
					}
					d, err := s.Decide(ctx, &wire.Request{Buckets: []wire.Bucket{b}})
					if err != nil {
						t.Fatal(err)
					}
					after, err := tc.c.Get(ctx, skey).Result()
					if !d.Allowed || errors.Is(err, redis.Nil) || before == "" {
						continue
					}
					old, err1 := parseStored(before)
					cur, err2 := parseStored(after)
					if err1 != nil || err2 != nil {
						t.Fatal(err1, err2)
					}
					next, dec := lim.Reserve(old, cur.At, cost, time.Duration(delay)*time.Millisecond)
					if !dec.Allowed || math.Float64bits(next.Tokens) != math.Float64bits(cur.Tokens) ||
						d.WaitMs != ceilMs(dec.Wait) || math.Float64bits(d.Buckets[0].Tokens) != math.Float64bits(cur.Tokens) {
						t.Fatalf("limit %+v, %q -> %q, cost %g, max delay %dms: bucket says %+v %+v, script %+v", lim, before, after, cost, delay, next, dec, d)
					}
					if dec.Wait > 0 {
						checked++
					}
				}
			}
			if checked < 20 {
				t.Fatalf("only %d delayed decisions checked", checked)
			}

			// A delayed take is given back when another slot refuses.
			fast := wire.Bucket{Key: "delay-fast", Rate: 10, Burst: 1, Cost: 1, MaxDelayMs: 1000}
			plain := wire.Bucket{Key: "delay-plain", Rate: 0.01, Burst: 1, Cost: 1}
			if tc.name == "cluster" && keySlot(storageKey(DefaultKeyPrefix, fast.Key, fast.Rate, fast.Burst)) == keySlot(storageKey(DefaultKeyPrefix, plain.Key, plain.Rate, plain.Burst)) {
				t.Fatal("the two buckets share a slot: pick other keys")
			}
			for _, r := range []*wire.Request{{Buckets: []wire.Bucket{fast}}, {Buckets: []wire.Bucket{plain}}} {
				if d, err := s.Decide(ctx, r); err != nil || !d.Allowed {
					t.Fatalf("drain: %+v, %v", d, err)
				}
			}
			if d, err := s.Decide(ctx, &wire.Request{Buckets: []wire.Bucket{fast, plain}}); err != nil || d.Allowed || d.WaitMs != 0 || d.Buckets[0].WaitMs != 0 {
				t.Fatalf("fast and plain: %+v, %v; want refused by plain, no wait", d, err)
			}
			if d, err := s.Decide(ctx, &wire.Request{Buckets: []wire.Bucket{fast}}); err != nil || !d.Allowed || d.WaitMs > 100 {
				t.Fatalf("fast alone: %+v, %v; want a wait of at most 100ms (its refused take given back)", d, err)
			}

			// A held request's refunds, concurrent: exactly what it took.
			mustDecide(t, s, one("delay-refund", 0.02, 40, 40))
			if d := mustDecide(t, s, delayed("delay-refund", 0.02, 40, 60_000)); !d.Allowed || d.WaitMs < 49_000 || d.WaitMs > 50_000 {
				t.Fatalf("held: %+v, want a wait of about 50s", d)
			}
			if refunded := concurrentRefunds(ctx, t, s, wire.ChargeBucket{Key: "delay-refund", Rate: 0.02, Burst: 40, Amount: -1}, 100); refunded != 1 {
				t.Fatalf("100 concurrent refunds of a held request of cost 1 gave back %v, want 1", refunded)
			}
		})
	}
}

// concurrentRefunds sends n charges of b (a refund: b.Amount < 0) at once
// and returns how much they gave back in all.
func concurrentRefunds(ctx context.Context, t *testing.T, s Store, b wire.ChargeBucket, n int) float64 {
	t.Helper()
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		refunded float64
	)
	for range n {
		wg.Go(func() {
			a, err := s.Charge(ctx, &wire.ChargeRequest{Buckets: []wire.ChargeBucket{b}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			refunded -= a.Buckets[0].Applied
			mu.Unlock()
		})
	}
	wg.Wait()
	return refunded
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package service

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// miniPair returns two miniredis servers on one clock (t0) and a client on
// each.
func miniPair(t *testing.T) (ma, mb *miniredis.Miniredis, ca, cb *redis.Client) {
	t.Helper()
	var ms [2]*miniredis.Miniredis
	var cs [2]*redis.Client
	for i := range ms {
		ms[i] = miniredis.RunT(t)
		ms[i].SetTime(t0)
		ms[i].ClockTTL(true)
		cs[i] = redis.NewClient(&redis.Options{Addr: ms[i].Addr(), MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { cs[i].Close() })
	}
	return ms[0], ms[1], cs[0], cs[1]
}

// sameData fails unless a and b hold the same keys, values and expiries.
func sameData(t *testing.T, step int, a, b *miniredis.Miniredis) {
	t.Helper()
	ka, kb := a.Keys(), b.Keys()
	if !slices.Equal(ka, kb) {
		t.Fatalf("step %d: keys batched %v, alone %v", step, ka, kb)
	}
	for _, k := range ka {
		va, _ := a.Get(k)
		vb, _ := b.Get(k)
		if va != vb || a.TTL(k) != b.TTL(k) {
			t.Fatalf("step %d: %s: batched %q (ttl %v), alone %q (ttl %v)", step, k, va, a.TTL(k), vb, b.TTL(k))
		}
	}
}

// runAlone runs each call with script on c, one after the other, and
// returns each one's reply or error.
func runAlone(ctx context.Context, c *redis.Client, script *redis.Script, calls []*call) ([]any, []error) {
	res, errs := make([]any, len(calls)), make([]error, len(calls))
	for i, cl := range calls {
		res[i], errs[i] = script.Run(ctx, c, cl.keys, cl.args...).Result()
	}
	return res, errs
}

// runMany runs calls as one run of multi on c (what a batcher's flush
// sends) and returns each one's reply or error.
func runMany(ctx context.Context, c *redis.Client, multi *redis.Script, calls []*call) ([]any, []error) {
	keys, args := packMany(calls)
	res, err := multi.Run(ctx, c, keys, args...).Result()
	unpackMany(calls, res, err)
	out, errs := make([]any, len(calls)), make([]error, len(calls))
	for i, cl := range calls {
		out[i], errs[i] = cl.res, cl.err
	}
	return out, errs
}

// sameReplies fails unless each call's reply batched equals its reply alone,
// an error being the same error.
func sameReplies(t *testing.T, step int, calls []*call, got, want []any, gotErr, wantErr []error) {
	t.Helper()
	for i := range calls {
		switch {
		case wantErr[i] != nil || gotErr[i] != nil:
			if wantErr[i] == nil || gotErr[i] == nil || errCore(wantErr[i]) == "" || errCore(gotErr[i]) != errCore(wantErr[i]) {
				t.Fatalf("step %d call %d (keys %v args %v): batched error %v, alone %v", step, i, calls[i].keys, calls[i].args, gotErr[i], wantErr[i])
			}
		case !reflect.DeepEqual(got[i], want[i]):
			t.Fatalf("step %d call %d (keys %v args %v): batched %v, alone %v", step, i, calls[i].keys, calls[i].args, got[i], want[i])
		}
	}
}

// errCore is what an error of the scripts says, without where in which
// script it arose (a run of many.lua has other line numbers).
func errCore(err error) string {
	s := err.Error()
	for _, m := range []string{"limitd: malformed bucket value at ", "WRONGTYPE"} {
		if i := strings.Index(s, m); i >= 0 {
			return strings.Fields(s[i+len(m):] + " .")[0]
		}
	}
	return ""
}

// TestManyDecideEqualsAlone: a batch of decisions in one run of many.lua
// answers and writes exactly what the same decisions make one after the
// other alone (decide.lua, held to package bucket by TestRedisDifferential),
// over random batches on a few keys (the same key decided several times in
// one batch, several buckets a decision, mixed costs and callers, refusals,
// delays, refundable costs, quotas, a malformed record mid-batch), on two
// miniredis servers on one clock. (A command's error raised mid-batch is
// TestManyRealRedis's: miniredis fails every later command of the run.)
func TestManyDecideEqualsAlone(t *testing.T) {
	seeds := uint64(12)
	if testing.Short() {
		seeds = 4
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Parallel()
			runManyDecide(t, seed)
		})
	}
}

func runManyDecide(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 43))
	ma, mb, ca, cb := miniPair(t)
	ctx := context.Background()
	alone := redis.NewScript(decideLua)
	window := strconv.FormatInt(DefaultLedgerWindow.Microseconds(), 10)
	names := []string{"a", "b", "c"}
	type rule struct {
		b      wire.Bucket
		period bool
	}
	rules := map[string]*rule{}
	newRule := func(name string) *rule {
		l := randomLimit(r)
		ru := &rule{b: wire.Bucket{Key: name, Rate: l.Rate, Burst: l.Burst}}
		if r.IntN(5) == 0 { // a quota: rate 0 over a period around now
			startMs := t0.UnixMilli() - int64(r.IntN(10_000))
			ru.b.Rate, ru.period = 0, true
			ru.b.Period = wire.Period{PeriodStartMs: startMs, PeriodEndMs: startMs + 5_000 + int64(r.IntN(60_000))}
		}
		return ru
	}
	for _, n := range names {
		rules[n] = newRule(n)
	}
	nowUs := t0.UnixMicro()
	admitted, refused, errored, sameKey := 0, 0, 0, 0
	for step := range 150 {
		if r.IntN(8) == 0 {
			n := names[r.IntN(len(names))]
			rules[n] = newRule(n) // another rule: another bucket
		}
		calls := make([]*call, 1+r.IntN(12))
		seen := map[string]bool{}
		for i := range calls {
			perm := r.Perm(len(names))[:1+r.IntN(2)]
			req := &wire.Request{Buckets: make([]wire.Bucket, len(perm))}
			idx := make([]int, len(perm))
			keys := make([]string, len(perm))
			for j, p := range perm {
				ru := rules[names[p]]
				b := ru.b
				b.Cost = randomCost(r, bucketLimit(b))
				b.Refundable = r.IntN(3) == 0
				if !ru.period && r.IntN(3) == 0 {
					b.MaxDelayMs = randomDelay(r, bucketLimit(b))
				}
				req.Buckets[j], idx[j] = b, j
				keys[j] = storageKey(DefaultKeyPrefix, b.Key, b.Rate, b.Burst)
				if seen[keys[j]] {
					sameKey++
				}
				seen[keys[j]] = true
			}
			caller := []string{DefaultCaller, "gw-1", "gw-2"}[r.IntN(3)]
			calls[i] = &call{keys: keys, args: decideArgs(req, idx, caller, window)}
		}
		if r.IntN(15) == 0 { // a malformed record
			k := calls[r.IntN(len(calls))].keys[0]
			_ = ma.Set(k, "garbage 1 2")
			_ = mb.Set(k, "garbage 1 2")
		}
		got, gotErr := runMany(ctx, ca, manyDecideScript, calls)
		want, wantErr := runAlone(ctx, cb, alone, calls)
		sameReplies(t, step, calls, got, want, gotErr, wantErr)
		sameData(t, step, ma, mb)
		for i := range calls {
			switch {
			case wantErr[i] != nil:
				errored++
				ma.Del(calls[i].keys[0])
				mb.Del(calls[i].keys[0])
			case want[i].([]any)[0] == int64(1):
				admitted++
			default:
				refused++
			}
		}
		nowUs += randomStep(r, bucketLimit(rules["a"].b), 1, false) / 4
		ma.SetTime(time.UnixMicro(nowUs))
		mb.SetTime(time.UnixMicro(nowUs))
	}
	if admitted == 0 || refused == 0 || errored == 0 || sameKey == 0 {
		t.Fatalf("admitted %d, refused %d, errored %d, same key twice in a batch %d: want each above 0", admitted, refused, errored, sameKey)
	}
}

// bucketLimit is b's limit as randomCost and randomDelay take it (a quota's
// rate, 0, counted as 1 for the delay's range).
func bucketLimit(b wire.Bucket) bucket.Limit {
	return bucket.Limit{Rate: max(b.Rate, 1), Burst: b.Burst}
}

// TestManyWindowEqualsAlone: a batch of Count calls in one run of many.lua
// (window.lua's) answers and writes what they make one after the other
// alone, over random batches on a few counters (the same counter counted
// several times in one batch, reads, mixed expiries).
func TestManyWindowEqualsAlone(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 44))
	ma, mb, ca, cb := miniPair(t)
	ctx := context.Background()
	sameKey := 0
	for step := range 100 {
		calls := make([]*call, 1+r.IntN(12))
		seen := map[string]bool{}
		for i := range calls {
			perm := r.Perm(4)[:1+r.IntN(3)]
			c := &call{}
			for _, p := range perm {
				k := "w:" + strconv.Itoa(p)
				if seen[k] {
					sameKey++
				}
				seen[k] = true
				c.keys = append(c.keys, k)
				c.args = append(c.args, strconv.Itoa(r.IntN(3)), strconv.Itoa(1+r.IntN(60)))
			}
			calls[i] = c
		}
		got, gotErr := runMany(ctx, ca, manyWindowScript, calls)
		want, wantErr := runAlone(ctx, cb, windowScript, calls)
		sameReplies(t, step, calls, got, want, gotErr, wantErr)
		sameData(t, step, ma, mb)
		d := time.Duration(r.IntN(5000)) * time.Millisecond
		ma.FastForward(d)
		mb.FastForward(d)
	}
	if sameKey == 0 {
		t.Fatal("no counter counted twice in a batch")
	}
}

// TestManyRealRedis runs many.lua on a real redis-server: a call that
// fails mid-batch (a malformed record; a key of another type, whose GET
// raises an error) answers its error, and the calls around it answer as
// alone, the later one after the earlier one's write; and a batch of Count
// calls, one of them on a counter that is not a number.
func TestManyRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr()).(*redis.Client)
	ctx := t.Context()
	window := strconv.FormatInt(DefaultLedgerWindow.Microseconds(), 10)
	dec := func(key string, burst float64) *call {
		req := &wire.Request{Buckets: []wire.Bucket{{Key: key, Rate: 0.001, Burst: burst, Cost: 2}}}
		return &call{keys: []string{storageKey(DefaultKeyPrefix, key, 0.001, burst)}, args: decideArgs(req, []int{0}, DefaultCaller, window)}
	}
	calls := []*call{dec("x", 5), dec("bad", 5), dec("hash", 5), dec("x", 5), dec("x", 5)}
	if err := c.Set(ctx, calls[1].keys[0], "garbage 1 2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, calls[2].keys[0], "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	got, errs := runMany(ctx, c, manyDecideScript, calls)
	if !strings.Contains(fmt.Sprint(errs[1]), "malformed") || !strings.Contains(fmt.Sprint(errs[2]), "WRONGTYPE") {
		t.Fatalf("errors %v: want a malformed record and WRONGTYPE for calls 1 and 2", errs)
	}
	for i, want := range map[int]int64{0: 1, 3: 1, 4: 0} { // burst 5, cost 2: two admitted
		if errs[i] != nil || got[i].([]any)[0] != want {
			t.Fatalf("call %d: %v, %v; want admitted %d", i, got[i], errs[i], want)
		}
	}
	if tok, _ := strconv.ParseFloat(got[4].([]any)[2].(string), 64); tok < 1 || tok > 1.01 {
		t.Fatalf("the refused call found %v tokens, want the 1 the two before it left (and a trace of refill)", tok)
	}
	if err := c.Set(ctx, "w:nan", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	win := func(key string) *call { return &call{keys: []string{key}, args: []any{"3", "60"}} }
	wcalls := []*call{win("w:1"), win("w:nan"), win("w:1")}
	got, errs = runMany(ctx, c, manyWindowScript, wcalls)
	if errs[0] != nil || errs[2] != nil || errs[1] == nil || !reflect.DeepEqual(got[0], []any{int64(3)}) || !reflect.DeepEqual(got[2], []any{int64(6)}) {
		t.Fatalf("Count batch: %v, %v; want [3], an error, [6]", got, errs)
	}
}

// redisCPU is Redis's own CPU time so far (INFO cpu: user + system).
func redisCPU(b *testing.B, c *redis.Client) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			sum += f
		}
	}
	return time.Duration(sum * float64(time.Second))
}

// redisScriptTime is the time Redis spent running scripts so far (INFO
// commandstats: EVALSHA's and EVAL's usec), and the runs.
func redisScriptTime(b *testing.B, c *redis.Client) (time.Duration, int64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var us, calls int64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "cmdstat_evalsha" && k != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch name {
			case "usec":
				us += n
			case "calls":
				calls += n
			}
		}
	}
	return time.Duration(us) * time.Microsecond, calls
}

// BenchmarkRedisManyCPU: Redis's CPU per decision (redis-µs/op, from INFO
// cpu), the time its scripts ran per decision (script-µs/op, INFO
// commandstats), the decisions per pipeline (per-batch) and per script run
// (per-run) with concurrent decisions
// batched, each call its own EVALSHA (one) or a slot's calls one run of
// many.lua (many).
func BenchmarkRedisManyCPU(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, PoolSize: 64})
	defer c.Close()
	for _, multi := range []bool{false, true} {
		b.Run(map[bool]string{false: "one", true: "many"}[multi], func(b *testing.B) {
			var batches, calls atomic.Int64
			s, err := NewRedisStore(c, RedisOptions{Batch: BatchOptions{MaxSize: 64}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.batch.onBatch = func(n int) { batches.Add(1); calls.Add(int64(n)) }
			if !multi {
				s.batch.multi = nil
			}
			b.SetParallelism(16)
			var next atomic.Int64
			cpu0 := redisCPU(b, c)
			script0, runs0 := redisScriptTime(b, c)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := one("bench-"+strconv.FormatInt(next.Add(1)%32, 10), 1e6, 1e6, 1)
				for pb.Next() {
					if _, err := s.Decide(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(redisCPU(b, c)-cpu0)/float64(time.Microsecond)/float64(b.N), "redis-µs/op")
			b.ReportMetric(float64(calls.Load())/float64(max(batches.Load(), 1)), "per-batch")
			script1, runs1 := redisScriptTime(b, c)
			b.ReportMetric(float64(script1-script0)/float64(time.Microsecond)/float64(b.N), "script-µs/op")
			b.ReportMetric(float64(b.N)/float64(max(runs1-runs0, 1)), "per-run")
		})
	}
}

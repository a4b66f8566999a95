package service

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// The Lua sources: bucket.lua (Redis's clock, reading and writing one
// bucket) runs before each script's own part; take.lua (decide.lua's plain
// decision, cheaper) before both in decisions.
var (
	//go:embed bucket.lua
	bucketLua string
	//go:embed decide.lua
	decidePart string
	//go:embed lease.lua
	leasePart string
	//go:embed charge.lua
	chargePart string

	decideLua = takeLua + bucketLua + decidePart
	leaseLua  = bucketLua + leasePart
	chargeLua = bucketLua + chargePart
)

// DecideScript is the Lua source run for every decision (take.lua, then
// bucket.lua and decide.lua).
func DecideScript() string { return decideLua }

// redisClient is what RedisStore needs from go-redis: scripts, pipelines and
// PING. redis.UniversalClient (a single node, Sentinel or Cluster) has it.
type redisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Ping(ctx context.Context) *redis.StatusCmd
}

// RedisOptions configure a RedisStore. Zero fields mean the defaults.
type RedisOptions struct {
	// KeyPrefix starts every stored key (default DefaultKeyPrefix). It may
	// not contain "{" or "}".
	KeyPrefix string
	// Batch groups concurrent decisions into pipelines; see BatchOptions.
	Batch BatchOptions
	// Registerer, when set, receives the store's own metrics
	// (limitd_redis_batch_size, when batching).
	Registerer prometheus.Registerer
	// LedgerWindow is how long what a lease grants or a decision reserves
	// can be given back: at least one window, at most two (default
	// DefaultLedgerWindow, at least a millisecond).
	LedgerWindow time.Duration
	// Now is limitd's clock (default time.Now). The scripts count by
	// Redis's TIME; only a quota's waits, to its period's end, are
	// reported by this clock, the gateways' periods being by theirs.
	Now func() time.Time
}

// RedisStore decides requests with one Lua script (decide.lua) per request,
// run by SHA (EVALSHA, falling back to EVAL once when Redis answers NOSCRIPT,
// which also loads it again). The script reads Redis's TIME, so the clocks of
// the service and the gateways never matter. With batching enabled,
// concurrent decisions share a pipeline; each is still its own script call,
// atomic on its own.
type RedisStore struct {
	client  redisClient
	script  *redis.Script
	lease   *redis.Script
	charge  *redis.Script
	prefix  string
	window  string // the ledger window in microseconds, every script's last ARGV
	cluster bool
	batch   *batcher
	windows *batcher // Count's pipelines (window.go), when batching
	now     func() time.Time
}

// NewRedisStore returns a store on client, typically a redis.UniversalClient.
// It does not contact Redis; call Load to load the script ahead of the first
// decision.
func NewRedisStore(client redis.UniversalClient, opts RedisOptions) (*RedisStore, error) {
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("service: key prefix: must not contain { or }, got %q", opts.KeyPrefix)
	}
	if opts.LedgerWindow == 0 {
		opts.LedgerWindow = DefaultLedgerWindow
	}
	if opts.LedgerWindow < time.Millisecond {
		return nil, fmt.Errorf("service: ledger window: must be >= 1ms, got %v", opts.LedgerWindow)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	_, cluster := client.(*redis.ClusterClient)
	s := &RedisStore{
		now:     opts.Now,
		client:  client,
		script:  redis.NewScript(decideLua),
		lease:   redis.NewScript(leaseLua),
		charge:  redis.NewScript(chargeLua),
		prefix:  opts.KeyPrefix,
		window:  strconv.FormatInt(opts.LedgerWindow.Microseconds(), 10),
		cluster: cluster,
	}
	if opts.Batch.MaxSize > 1 {
		var onBatch func(int)
		if opts.Registerer != nil {
			h := prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "limitd_redis_batch_size",
				Help:    "Decisions per Redis pipeline.",
				Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
			})
			if err := opts.Registerer.Register(h); err != nil {
				return nil, fmt.Errorf("service: redis: metrics: %w", err)
			}
			onBatch = func(n int) { h.Observe(float64(n)) }
		}
		s.batch = newBatcher(client, s.script, opts.Batch, onBatch)
		s.windows = newBatcher(client, windowScript, opts.Batch, nil)
	}
	return s, nil
}

// Load loads the scripts into Redis (every primary of a cluster) and
// returns the decide script's SHA1.
func (s *RedisStore) Load(ctx context.Context) (string, error) {
	if err := s.lease.Load(ctx, s.client).Err(); err != nil {
		return "", fmt.Errorf("service: redis: script load: %w", err)
	}
	if err := s.charge.Load(ctx, s.client).Err(); err != nil {
		return "", fmt.Errorf("service: redis: script load: %w", err)
	}
	if err := s.windowScript().Load(ctx, s.client).Err(); err != nil {
		return "", fmt.Errorf("service: redis: script load: %w", err)
	}
	sha, err := s.script.Load(ctx, s.client).Result()
	if err != nil {
		return "", fmt.Errorf("service: redis: script load: %w", err)
	}
	return sha, nil
}

// Batching reports whether decisions are pipelined.
func (s *RedisStore) Batching() bool { return s.batch != nil }

// Decide implements Store. On a single Redis (or Sentinel) the request is
// one run of decide.lua. On a Redis Cluster its buckets are grouped by slot
// and each group is one run, in request order; when any group refuses, the
// groups that admitted are given back (a refund of what they just reserved,
// with charge.lua), so a request whose buckets span slots never takes more
// than one decided atomically would: never over, briefly under (between a
// group's take and its give-back, another request may find it short).
func (s *RedisStore) Decide(ctx context.Context, req *wire.Request) (wire.Answer, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.Answer{}, err
	}
	keys := s.keys(len(req.Buckets), func(i int) (string, float64, float64) {
		b := &req.Buckets[i]
		return b.Key, b.Rate, b.Burst
	})
	d := wire.Answer{Buckets: make([]wire.BucketAnswer, len(req.Buckets))}
	groups := s.groups(keys)
	admitted := make([]bool, len(groups))
	for g, idx := range groups {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 5*len(idx)+2)
		for j, i := range idx {
			b := &req.Buckets[i]
			gkeys[j] = keys[i]
			refundable := "0"
			if b.Refundable {
				refundable = "1"
			}
			args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Cost), refundable, strconv.FormatInt(b.MaxDelayMs, 10))
		}
		args = appendPeriods(args, idx, func(i int) wire.Period { return req.Buckets[i].Period })
		args = append(args, caller, s.window)
		var res any
		var err error
		if s.batch != nil {
			res, err = s.batch.run(ctx, gkeys, args)
		} else {
			res, err = s.script.Run(ctx, s.client, gkeys, args...).Result()
		}
		if err == nil {
			admitted[g], err = parseResult(req, idx, res, s.now().UnixNano(), d.Buckets)
		}
		if err != nil {
			s.giveBack(req, caller, keys, groups[:g], admitted, d.Buckets)
			return wire.Answer{}, err
		}
	}
	d.Settle(req)
	if !d.Allowed {
		s.giveBack(req, caller, keys, groups, admitted, d.Buckets)
		for i := range d.Buckets {
			d.Buckets[i].WaitMs = 0 // nothing taken: nobody waits
		}
	}
	return d, nil
}

// giveBack gives back, with charge.lua in mode "undo", the costs the
// admitted groups of caller's refused (or failed) request just took (and
// drops their reservations), and reports their buckets as they are after it
// in out. A give-back that fails leaves the bucket short of those tokens
// until it refills: under, never over.
func (s *RedisStore) giveBack(req *wire.Request, caller string, keys []string, groups [][]int, admitted []bool, out []wire.BucketAnswer) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for g, idx := range groups {
		if !admitted[g] {
			continue
		}
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 3*len(idx)+3)
		for j, i := range idx {
			b := &req.Buckets[i]
			gkeys[j] = keys[i]
			args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(-b.Cost))
		}
		args = appendPeriods(args, idx, func(i int) wire.Period { return req.Buckets[i].Period })
		args = append(args, "undo", caller, s.window)
		vals, err := s.run(ctx, s.charge, "charge", gkeys, args, 3*len(idx))
		if err != nil {
			continue // under, never over: see above
		}
		for j, i := range idx {
			ts, _ := vals[3*j].(string)
			gap, _ := vals[3*j+1].(int64)
			if tokens, err := strconv.ParseFloat(ts, 64); err == nil {
				out[i] = report(&req.Buckets[i], true, tokens, gap, s.now().UnixNano(), 0)
			}
		}
	}
}

// Lease implements Store with one run of lease.lua per Redis Cluster slot
// of its buckets (one run on a single Redis). Lease calls are rare by design
// (one per lease, not per request), so they are never batched. When a slot's
// group grants and another's does not, the granted tokens go back at once (a
// return of what was just granted), so the call grants all or nothing.
func (s *RedisStore) Lease(ctx context.Context, req *wire.LeaseRequest) (wire.LeaseAnswer, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.LeaseAnswer{}, err
	}
	keys := s.keys(len(req.Buckets), func(i int) (string, float64, float64) {
		b := &req.Buckets[i]
		return b.Key, b.Rate, b.Burst
	})
	groups := s.groups(keys)
	a := wire.LeaseAnswer{Granted: true, Buckets: make([]wire.Grant, len(req.Buckets))}
	granted := make([]bool, len(groups))
	for g, idx := range groups {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 5*len(idx)+1)
		for j, i := range idx {
			b := &req.Buckets[i]
			gkeys[j] = keys[i]
			args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Want), formatFloat(b.Min), formatFloat(b.Return))
		}
		args = appendPeriods(args, idx, func(i int) wire.Period { return req.Buckets[i].Period })
		args = append(args, caller, s.window)
		vals, err := s.run(ctx, s.lease, "lease", gkeys, args, 1+4*len(idx))
		if err != nil {
			return wire.LeaseAnswer{}, err
		}
		all, _ := vals[0].(int64)
		granted[g] = all == 1
		a.Granted = a.Granted && granted[g]
		for j, i := range idx {
			v := vals[1+4*j : 5+4*j]
			gs, ok1 := v[0].(string)
			ts, ok2 := v[1].(string)
			gap, ok3 := v[2].(int64)
			rs, ok4 := v[3].(string)
			gr, err1 := strconv.ParseFloat(gs, 64)
			tokens, err2 := strconv.ParseFloat(ts, 64)
			ret, err3 := strconv.ParseFloat(rs, 64)
			if !ok1 || !ok2 || !ok3 || !ok4 || err1 != nil || err2 != nil || err3 != nil {
				return wire.LeaseAnswer{}, fmt.Errorf("service: redis: lease script reply: bucket %d: malformed %v", i, v)
			}
			a.Buckets[i] = grant(&req.Buckets[i], granted[g], gr, tokens, gap, s.now().UnixNano())
			a.Buckets[i].Returned = ret
		}
	}
	if !a.Granted && len(groups) > 1 {
		for g, idx := range groups {
			if !granted[g] {
				continue
			}
			gkeys := make([]string, len(idx))
			args := make([]any, 0, 5*len(idx)+1)
			for j, i := range idx {
				b := &req.Buckets[i]
				gkeys[j] = keys[i]
				args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), "0", "0", formatFloat(a.Buckets[i].Tokens))
				a.Buckets[i].Tokens = 0
			}
			args = appendPeriods(args, idx, func(i int) wire.Period { return req.Buckets[i].Period })
			args = append(args, caller, s.window)
			vals, err := s.run(ctx, s.lease, "lease", gkeys, args, 1+4*len(idx))
			if err != nil {
				continue // a lost give-back: under, never over
			}
			for j, i := range idx {
				ts, _ := vals[2+4*j].(string)
				gap, _ := vals[3+4*j].(int64)
				if tokens, err := strconv.ParseFloat(ts, 64); err == nil {
					ret := a.Buckets[i].Returned
					a.Buckets[i] = grant(&req.Buckets[i], false, 0, tokens, gap, s.now().UnixNano())
					a.Buckets[i].Returned = ret
				}
			}
		}
	}
	return a, nil
}

// Charge implements Store with one run of charge.lua per Redis Cluster slot
// of its buckets (one run on a single Redis). Charges come once per
// response of a rule whose cost is known from the response, after it, so
// they are never batched.
func (s *RedisStore) Charge(ctx context.Context, req *wire.ChargeRequest) (wire.ChargeAnswer, error) {
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.ChargeAnswer{}, err
	}
	keys := s.keys(len(req.Buckets), func(i int) (string, float64, float64) {
		b := &req.Buckets[i]
		return b.Key, b.Rate, b.Burst
	})
	a := wire.ChargeAnswer{Buckets: make([]wire.BucketAnswer, len(req.Buckets))}
	for _, idx := range s.groups(keys) {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 3*len(idx)+1)
		for j, i := range idx {
			b := &req.Buckets[i]
			gkeys[j] = keys[i]
			args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Amount))
		}
		args = appendPeriods(args, idx, func(i int) wire.Period { return req.Buckets[i].Period })
		args = append(args, "refund", caller, s.window)
		vals, err := s.run(ctx, s.charge, "charge", gkeys, args, 3*len(idx))
		if err != nil {
			return wire.ChargeAnswer{}, err
		}
		for j, i := range idx {
			v := vals[3*j : 3*j+3]
			ts, ok1 := v[0].(string)
			gap, ok2 := v[1].(int64)
			as, ok3 := v[2].(string)
			tokens, err1 := strconv.ParseFloat(ts, 64)
			applied, err2 := strconv.ParseFloat(as, 64)
			if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil {
				return wire.ChargeAnswer{}, fmt.Errorf("service: redis: charge script reply: bucket %d: malformed %v", i, v)
			}
			a.Buckets[i] = charged(&req.Buckets[i], tokens, gap, s.now().UnixNano())
			a.Buckets[i].Applied = applied
		}
	}
	return a, nil
}

// run runs one call's script (named name in errors) on keys, unbatched, and
// returns its reply of want values.
func (s *RedisStore) run(ctx context.Context, script *redis.Script, name string, keys []string, args []any, want int) ([]any, error) {
	res, err := script.Run(ctx, s.client, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("service: redis: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != want {
		return nil, fmt.Errorf("service: redis: %s script reply: want %d values, got %T of %v", name, want, res, res)
	}
	return vals, nil
}

// keys returns the Redis keys of n buckets, bucket i being at(i).
func (s *RedisStore) keys(n int, at func(i int) (key string, rate, burst float64)) []string {
	keys := make([]string, n)
	for i := range n {
		k, rate, burst := at(i)
		keys[i] = storageKey(s.prefix, k, rate, burst)
	}
	return keys
}

// groups returns the indexes of keys grouped by Redis Cluster slot, in order
// of first appearance: one group holding them all on a single Redis (or
// Sentinel), where one script reaches every key.
func (s *RedisStore) groups(keys []string) [][]int {
	all := make([]int, len(keys))
	for i := range keys {
		all[i] = i
	}
	if !s.cluster || len(keys) < 2 {
		return [][]int{all}
	}
	var groups [][]int
	slots := make([]int, 0, len(keys))
	for i, k := range keys {
		slot := keySlot(k)
		g := slices.Index(slots, slot)
		if g < 0 {
			slots = append(slots, slot)
			groups = append(groups, nil)
			g = len(groups) - 1
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// appendPeriods appends the period of each bucket i of idx, its start and
// end in Unix milliseconds ("0" "0" for a token bucket), the arguments every
// script reads after the buckets' own (bucket.lua's period_of).
func appendPeriods(args []any, idx []int, period func(i int) wire.Period) []any {
	for _, i := range idx {
		p := period(i)
		args = append(args, strconv.FormatInt(p.PeriodStartMs, 10), strconv.FormatInt(p.PeriodEndMs, 10))
	}
	return args
}

// formatFloat writes x so that Lua's tonumber reads back the same float64
// (plain decimals: miniredis's Lua reads no exponent).
func formatFloat(x float64) string {
	return strconv.FormatFloat(x, 'f', -1, 64)
}

// parseResult fills out[i] for each bucket i of idx from decide.lua's reply
// over those buckets (a quota's waits counted from now, Unix ns), and reports whether the script admitted them. A
// bucket's wait counts only when the script admitted (else nothing was
// taken).
func parseResult(req *wire.Request, idx []int, res any, now int64, out []wire.BucketAnswer) (bool, error) {
	const per = 4 // ok, tokens, gap, wait
	vals, ok := res.([]any)
	if !ok || len(vals) != 1+per*len(idx) {
		return false, fmt.Errorf("service: redis: script reply: want %d values, got %T of %v", 1+per*len(idx), res, res)
	}
	admitted, _ := vals[0].(int64)
	all := true
	for j, i := range idx {
		v := vals[1+per*j : 1+per*(j+1)]
		okv, ok1 := v[0].(int64)
		str, ok2 := v[1].(string)
		gap, ok3 := v[2].(int64)
		wait, ok4 := v[3].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || wait < 0 {
			return false, fmt.Errorf("service: redis: script reply: bucket %d: malformed %v", i, v)
		}
		tokens, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return false, fmt.Errorf("service: redis: script reply: bucket %d: tokens: %w", i, err)
		}
		if admitted != 1 {
			wait = 0
		}
		out[i] = report(&req.Buckets[i], okv == 1, tokens, gap, now, time.Duration(wait))
		all = all && okv == 1
	}
	if (admitted == 1) != all {
		return false, fmt.Errorf("service: redis: script reply: admitted %d disagrees with its buckets", admitted)
	}
	return all, nil
}

// Ping implements Store with Redis PING.
func (s *RedisStore) Ping(ctx context.Context) error {
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("service: redis: ping: %w", err)
	}
	return nil
}

// Close implements Store: it stops the batcher after the calls in flight.
// The client stays open; its owner closes it.
func (s *RedisStore) Close() error {
	if s.batch != nil {
		s.batch.close()
		s.windows.close()
	}
	return nil
}

// isNoScript reports whether err is Redis's NOSCRIPT reply.
func isNoScript(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOSCRIPT")
}

// quotaMargin is how long a quota's record outlives its period's end in
// Redis (bucket.lua's quota_margin): a gateway whose clock lags Redis's by
// less still counts against the period's record.
const quotaMargin = time.Minute

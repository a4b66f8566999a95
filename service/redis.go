package service

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// The Lua sources: bucket.lua (Redis's clock, reading and writing one
// bucket) runs before each script's own part.
var (
	//go:embed bucket.lua
	bucketLua string
	//go:embed decide.lua
	decidePart string
	//go:embed lease.lua
	leasePart string
	//go:embed charge.lua
	chargePart string

	decideLua = bucketLua + decidePart
	leaseLua  = bucketLua + leasePart
	chargeLua = bucketLua + chargePart
)

// DecideScript is the Lua source run for every decision (bucket.lua, then
// decide.lua).
func DecideScript() string { return decideLua }

// LeaseScript is the Lua source run for every lease call (bucket.lua, then
// lease.lua).
func LeaseScript() string { return leaseLua }

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
	cluster bool
	batch   *batcher
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
	_, cluster := client.(*redis.ClusterClient)
	s := &RedisStore{
		client:  client,
		script:  redis.NewScript(decideLua),
		lease:   redis.NewScript(leaseLua),
		charge:  redis.NewScript(chargeLua),
		prefix:  opts.KeyPrefix,
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
	sha, err := s.script.Load(ctx, s.client).Result()
	if err != nil {
		return "", fmt.Errorf("service: redis: script load: %w", err)
	}
	return sha, nil
}

// Batching reports whether decisions are pipelined.
func (s *RedisStore) Batching() bool { return s.batch != nil }

// Decide implements Store.
func (s *RedisStore) Decide(ctx context.Context, req *Request) (Answer, error) {
	keys, args := s.scriptArgs(req)
	if err := s.oneSlot(req.HashTag, keys); err != nil {
		return Answer{}, err
	}
	var res any
	var err error
	if s.batch != nil {
		res, err = s.batch.run(ctx, keys, args)
	} else {
		res, err = s.script.Run(ctx, s.client, keys, args...).Result()
	}
	if err != nil {
		return Answer{}, fmt.Errorf("service: redis: %w", err)
	}
	return parseResult(req, res)
}

// Lease implements Store with one run of lease.lua. Lease calls are rare by
// design (one per lease, not per request), so they are never batched.
func (s *RedisStore) Lease(ctx context.Context, req *LeaseRequest) (LeaseAnswer, error) {
	keys := make([]string, len(req.Buckets))
	args := make([]any, 0, 5*len(req.Buckets))
	for i := range req.Buckets {
		b := &req.Buckets[i]
		keys[i] = storageKey(s.prefix, req.HashTag, b.Key)
		args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Want), formatFloat(b.Min), formatFloat(b.Return))
	}
	vals, err := s.run(ctx, s.lease, "lease", req.HashTag, keys, args, 1+3*len(req.Buckets))
	if err != nil {
		return LeaseAnswer{}, err
	}
	all, _ := vals[0].(int64)
	a := LeaseAnswer{Granted: all == 1, Buckets: make([]Grant, len(req.Buckets))}
	for i := range req.Buckets {
		gs, ok1 := vals[1+3*i].(string)
		ts, ok2 := vals[2+3*i].(string)
		gap, ok3 := vals[3+3*i].(int64)
		granted, err1 := strconv.ParseFloat(gs, 64)
		tokens, err2 := strconv.ParseFloat(ts, 64)
		if !ok1 || !ok2 || !ok3 || err1 != nil || err2 != nil {
			return LeaseAnswer{}, fmt.Errorf("service: redis: lease script reply: bucket %d: malformed %v", i, vals[1+3*i:4+3*i])
		}
		a.Buckets[i] = grant(&req.Buckets[i], a.Granted, granted, tokens, gap)
	}
	return a, nil
}

// Charge implements Store with one run of charge.lua. Charges come once per
// response of a rule whose cost is known from the response, after it, so
// they are never batched.
func (s *RedisStore) Charge(ctx context.Context, req *ChargeRequest) (ChargeAnswer, error) {
	keys := make([]string, len(req.Buckets))
	args := make([]any, 0, 3*len(req.Buckets))
	for i := range req.Buckets {
		b := &req.Buckets[i]
		keys[i] = storageKey(s.prefix, req.HashTag, b.Key)
		args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Amount))
	}
	vals, err := s.run(ctx, s.charge, "charge", req.HashTag, keys, args, 2*len(req.Buckets))
	if err != nil {
		return ChargeAnswer{}, err
	}
	a := ChargeAnswer{Buckets: make([]BucketAnswer, len(req.Buckets))}
	for i := range req.Buckets {
		ts, ok1 := vals[2*i].(string)
		gap, ok2 := vals[2*i+1].(int64)
		tokens, err := strconv.ParseFloat(ts, 64)
		if !ok1 || !ok2 || err != nil {
			return ChargeAnswer{}, fmt.Errorf("service: redis: charge script reply: bucket %d: malformed %v", i, vals[2*i:2*i+2])
		}
		a.Buckets[i] = charged(&req.Buckets[i], tokens, gap)
	}
	return a, nil
}

// run runs one call's script (named name in errors) on keys, unbatched, and
// returns its reply of want values.
func (s *RedisStore) run(ctx context.Context, script *redis.Script, name, hashTag string, keys []string, args []any, want int) ([]any, error) {
	if err := s.oneSlot(hashTag, keys); err != nil {
		return nil, err
	}
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

// oneSlot refuses, on a Redis Cluster, a call whose keys fall in different
// slots (several buckets and no hash tag): one script cannot reach them.
func (s *RedisStore) oneSlot(hashTag string, keys []string) error {
	if !s.cluster || hashTag != "" || len(keys) < 2 {
		return nil
	}
	slot := keySlot(keys[0])
	for _, k := range keys[1:] {
		if keySlot(k) != slot {
			return &ValidationError{Field: "hash_tag",
				Msg: "required: the buckets fall in different Redis Cluster slots"}
		}
	}
	return nil
}

// scriptArgs returns the KEYS and ARGV of decide.lua for req.
func (s *RedisStore) scriptArgs(req *Request) ([]string, []any) {
	keys := make([]string, len(req.Buckets))
	args := make([]any, 0, 3*len(req.Buckets))
	for i := range req.Buckets {
		b := &req.Buckets[i]
		keys[i] = storageKey(s.prefix, req.HashTag, b.Key)
		args = append(args, formatFloat(b.Rate), formatFloat(b.Burst), formatFloat(b.Cost))
	}
	return keys, args
}

// formatFloat writes x so that Lua's tonumber reads back the same float64.
func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// parseResult turns the script's reply into an Answer.
func parseResult(req *Request, res any) (Answer, error) {
	vals, ok := res.([]any)
	if !ok || len(vals) != 1+3*len(req.Buckets) {
		return Answer{}, fmt.Errorf("service: redis: script reply: want %d values, got %T of %v", 1+3*len(req.Buckets), res, res)
	}
	d := Answer{Buckets: make([]BucketAnswer, len(req.Buckets))}
	for i := range req.Buckets {
		okv, ok1 := vals[1+3*i].(int64)
		str, ok2 := vals[2+3*i].(string)
		gap, ok3 := vals[3+3*i].(int64)
		if !ok1 || !ok2 || !ok3 {
			return Answer{}, fmt.Errorf("service: redis: script reply: bucket %d: malformed %v", i, vals[1+3*i:4+3*i])
		}
		tokens, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return Answer{}, fmt.Errorf("service: redis: script reply: bucket %d: tokens: %w", i, err)
		}
		d.Buckets[i] = report(&req.Buckets[i], okv == 1, tokens, gap)
	}
	d.Settle(req)
	if all, _ := vals[0].(int64); (all == 1) != d.Allowed {
		return Answer{}, fmt.Errorf("service: redis: script reply: admitted %d disagrees with its buckets", all)
	}
	return d, nil
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
	}
	return nil
}

// isNoScript reports whether err is Redis's NOSCRIPT reply.
func isNoScript(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOSCRIPT")
}

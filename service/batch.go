package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// BatchOptions configure how a RedisStore groups concurrent decisions.
type BatchOptions struct {
	// MaxSize is the most decisions in one pipeline; 0 or 1 turns batching
	// off (one round trip per decision).
	MaxSize int
	// Window is how long a worker that holds one decision waits for more
	// before sending. 0 (the default) waits for nothing: a pipeline takes
	// whatever is already queued, so a lone decision is never delayed and
	// batches grow only while other pipelines are in flight.
	Window time.Duration
	// Workers is the number of pipelines in flight at once (default 4).
	Workers int
	// Timeout bounds each pipeline's round trip (default 1s).
	Timeout time.Duration
}

// errBatcherClosed is returned for decisions that arrive after Close.
var errBatcherClosed = errors.New("service: redis: store closed")

// batcher sends concurrent script calls as pipelines of EVALSHA. Calls are
// handed to workers over an unbuffered channel: a worker takes one, then every
// call whose sender is already waiting (up to MaxSize, for up to Window), and
// sends them in one pipeline. With a multi script (many.lua around the
// script), the calls of a pipeline that share a Redis Cluster slot (all of
// them on a single Redis) are one run of it: Redis starts one script, reads
// TIME and defines the helpers once for them all. Each call is still decided
// as alone, in pipeline order, after the writes of those before it, at one
// instant of Redis's clock; one call's error is its own. A Cluster client
// splits a pipeline by node, so runs for different slots still go out in one
// round trip per node.
type batcher struct {
	client  redisClient
	script  *redis.Script
	multi   *redis.Script // the script's many.lua; nil: one run per call
	cluster bool          // group multi runs by Redis Cluster slot
	opts    BatchOptions
	onBatch func(int)

	in   chan *call
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// call is one script run waiting for its pipeline.
type call struct {
	ctx  context.Context
	keys []string
	args []any
	res  any
	err  error
	done chan struct{}
}

func newBatcher(client redisClient, script, multi *redis.Script, cluster bool, opts BatchOptions, onBatch func(int)) *batcher {
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	b := &batcher{
		client:  client,
		script:  script,
		multi:   multi,
		cluster: cluster,
		opts:    opts,
		onBatch: onBatch,
		in:      make(chan *call),
		quit:    make(chan struct{}),
	}
	b.wg.Add(opts.Workers)
	for range opts.Workers {
		go b.work()
	}
	return b
}

// run queues one script call and waits for its result or ctx.
func (b *batcher) run(ctx context.Context, keys []string, args []any) (any, error) {
	c := &call{ctx: ctx, keys: keys, args: args, done: make(chan struct{})}
	select {
	case b.in <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.quit:
		return nil, errBatcherClosed
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close stops the workers once their pipelines are answered.
func (b *batcher) close() {
	b.once.Do(func() { close(b.quit) })
	b.wg.Wait()
}

func (b *batcher) work() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.opts.MaxSize)
	var timer *time.Timer
	for {
		select {
		case c := <-b.in:
			batch = append(batch[:0], c)
		case <-b.quit:
			return
		}
		if b.opts.Window <= 0 {
		drain:
			for len(batch) < b.opts.MaxSize {
				select {
				case c := <-b.in:
					batch = append(batch, c)
				default:
					break drain
				}
			}
		} else {
			if timer == nil {
				timer = time.NewTimer(b.opts.Window)
			} else {
				timer.Reset(b.opts.Window)
			}
		wait:
			for len(batch) < b.opts.MaxSize {
				select {
				case c := <-b.in:
					batch = append(batch, c)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
		b.flush(batch)
		clear(batch)
	}
}

// flush sends batch in one pipeline. With a multi script, the calls that
// share a Redis Cluster slot (all of them on a single Redis) go as one run of
// it (many.lua) when there are two or more, a lone call as its own EVALSHA;
// without one, each call is its own EVALSHA. Runs answered NOSCRIPT (the
// script cache was flushed, or Redis restarted) are sent once more as EVAL,
// which also loads the script again.
func (b *batcher) flush(batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	if b.onBatch != nil {
		b.onBatch(len(batch))
	}
	live := make([]*call, 0, len(batch))
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err // its caller has gone: don't spend tokens on it
			continue
		}
		live = append(live, c)
	}
	runs := b.runsOf(live)
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(runs))
	for i, r := range runs {
		cmds[i] = pipe.EvalSha(ctx, r.script.Hash(), r.keys, r.args...)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // errors are per command
	}
	var retry redis.Pipeliner
	for i, cmd := range cmds {
		if !isNoScript(cmd.Err()) {
			continue
		}
		if retry == nil {
			retry = b.client.Pipeline()
		}
		cmds[i] = runs[i].script.Eval(ctx, retry, runs[i].keys, runs[i].args...) // this batcher's own script
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	for i, r := range runs {
		res, err := cmds[i].Result()
		if len(r.calls) == 1 && r.script == b.script {
			r.calls[0].res, r.calls[0].err = res, err
			continue
		}
		unpackMany(r.calls, res, err)
	}
	for _, c := range batch {
		close(c.done)
	}
}

// run is one script run of a pipeline: one call with the batcher's script,
// or several with its multi script.
type run struct {
	script *redis.Script
	calls  []*call
	keys   []string
	args   []any
}

// runsOf groups calls into script runs: those that share a Redis Cluster
// slot (every call's keys are in one slot) into one run of the multi script
// when there are two or more, in the order of their first call; each call
// alone without a multi script.
func (b *batcher) runsOf(calls []*call) []run {
	var runs []run
	if b.multi == nil || len(calls) < 2 {
		for _, c := range calls {
			runs = append(runs, run{script: b.script, calls: []*call{c}, keys: c.keys, args: c.args})
		}
		return runs
	}
	groups := [][]*call{calls}
	if b.cluster {
		groups = nil
		var slots []int
		for _, c := range calls {
			slot := -1
			if len(c.keys) > 0 {
				slot = keySlot(c.keys[0])
			}
			g := slices.Index(slots, slot)
			if g < 0 {
				slots = append(slots, slot)
				groups = append(groups, nil)
				g = len(groups) - 1
			}
			groups[g] = append(groups[g], c)
		}
	}
	for _, g := range groups {
		if len(g) < manyMin {
			for _, c := range g {
				runs = append(runs, run{script: b.script, calls: []*call{c}, keys: c.keys, args: c.args})
			}
			continue
		}
		keys, args := packMany(g)
		runs = append(runs, run{script: b.multi, calls: g, keys: keys, args: args})
	}
	return runs
}

// manyMin is the fewest calls sent as one run of the multi script: Redis
// spends more instructions a decision on a run of 2 than on 2 runs alone,
// about as many on 4, 14% fewer on 16 (callgrind, BenchmarkRedisManyCPU's
// workload).
const manyMin = 8

// packMany returns the keys and arguments of one run of many.lua over
// calls.
func packMany(calls []*call) ([]string, []any) {
	nk, na := 0, 1+2*len(calls)
	for _, c := range calls {
		nk += len(c.keys)
		na += len(c.args)
	}
	keys := make([]string, 0, nk)
	args := make([]any, 0, na)
	args = append(args, strconv.Itoa(len(calls)))
	for _, c := range calls {
		args = append(args, strconv.Itoa(len(c.keys)), strconv.Itoa(len(c.args)))
	}
	for _, c := range calls {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	return keys, args
}

// manyError is one call's error in a reply of many.lua.
type manyError string

func (e manyError) Error() string { return string(e) }

// unpackMany sets each call's result from many.lua's reply res (or the
// run's error err, which is every call's).
func unpackMany(calls []*call, res any, err error) {
	vals, ok := res.([]any)
	if err == nil && (!ok || len(vals) != len(calls)) {
		err = fmt.Errorf("service: redis: batch script reply: want %d replies, got %T of %v", len(calls), res, res)
	}
	for i, c := range calls {
		if err != nil {
			c.err = err
			continue
		}
		if s, ok := vals[i].(string); ok {
			c.err = manyError(s)
			continue
		}
		c.res = vals[i]
	}
}

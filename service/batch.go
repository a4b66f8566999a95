package service

import (
	"context"
	"errors"
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
// sends them in one pipeline. A Cluster client splits a pipeline by node, so
// calls for different slots still go out in one round trip per node.
type batcher struct {
	client  redisClient
	script  *redis.Script
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

func newBatcher(client redisClient, script *redis.Script, opts BatchOptions, onBatch func(int)) *batcher {
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	b := &batcher{
		client:  client,
		script:  script,
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

// flush runs batch as one pipeline of EVALSHA; calls answered NOSCRIPT (the
// script cache was flushed, or Redis restarted) are sent once more as EVAL,
// which also loads the script again.
func (b *batcher) flush(batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	if b.onBatch != nil {
		b.onBatch(len(batch))
	}
	sha := b.script.Hash()
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err // its caller has gone: don't spend tokens on it
			continue
		}
		cmds[i] = pipe.EvalSha(ctx, sha, c.keys, c.args...)
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx) // errors are per command
	}
	var retry redis.Pipeliner
	for i, cmd := range cmds {
		if cmd == nil || !isNoScript(cmd.Err()) {
			continue
		}
		if retry == nil {
			retry = b.client.Pipeline()
		}
		cmds[i] = b.script.Eval(ctx, retry, batch[i].keys, batch[i].args...) // this batcher's own script
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	for i, c := range batch {
		if cmd := cmds[i]; cmd != nil {
			c.res, c.err = cmd.Result()
		}
		close(c.done)
	}
}

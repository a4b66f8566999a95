package service

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed window.lua
var windowLua string

// WindowScript is the Lua source of a Count call (window.lua).
func WindowScript() string { return windowLua }

// Window is one fixed-window counter of a Count call: the counter stored
// under Key (its caller names it with the window's start, so a window's
// counter is a key of its own), incremented by Hits (0 reads it), and kept
// Expiry seconds after its last increment.
type Window struct {
	Key    string
	Hits   uint64
	Expiry int64
}

// CountRequest is one Count call over one or more counters.
type CountRequest struct {
	Windows []Window
}

// CountAnswer holds each counter's value after the call, in request order.
type CountAnswer struct {
	Counts []uint64
}

// validWindows checks a Count call's windows: keys non-empty, hits and
// expiries in range.
func validWindows(req *CountRequest) error {
	for i, w := range req.Windows {
		switch {
		case w.Key == "":
			return fmt.Errorf("service: count: windows[%d].key: required", i)
		case w.Expiry < 1:
			return fmt.Errorf("service: count: windows[%d].expiry: must be >= 1 second, got %d", i, w.Expiry)
		case w.Hits > MaxWindowHits:
			return fmt.Errorf("service: count: windows[%d].hits: must be <= %d, got %d", i, uint64(MaxWindowHits), w.Hits)
		}
	}
	return nil
}

// MaxWindowHits bounds the hits one Count adds to a counter (a uint32, as
// the rate limit service's hits_addend), so no counter can overflow Redis's
// 64-bit integers in fewer than 2^31 calls.
const MaxWindowHits = 1<<32 - 1

// Count implements Store with window.lua: one run per Redis Cluster slot of
// its counters (one run on a single Redis or Sentinel), pipelined with
// other calls' when the store batches. Window keys are
// stored as named, without the store's key prefix: they are the rate limit
// service's names, which its caller prefixes as it needs.
func (s *RedisStore) Count(ctx context.Context, req *CountRequest) (CountAnswer, error) {
	if err := validWindows(req); err != nil {
		return CountAnswer{}, err
	}
	keys := make([]string, len(req.Windows))
	for i := range req.Windows {
		keys[i] = req.Windows[i].Key
	}
	a := CountAnswer{Counts: make([]uint64, len(keys))}
	for _, idx := range s.groups(keys) {
		gkeys := make([]string, len(idx))
		args := make([]any, 0, 2*len(idx))
		for j, i := range idx {
			w := &req.Windows[i]
			gkeys[j] = keys[i]
			args = append(args, strconv.FormatUint(w.Hits, 10), strconv.FormatInt(w.Expiry, 10))
		}
		vals, err := s.runWindow(ctx, gkeys, args)
		if err != nil {
			return CountAnswer{}, err
		}
		for j, i := range idx {
			n, ok := vals[j].(int64)
			if !ok || n < 0 {
				return CountAnswer{}, fmt.Errorf("service: redis: window script reply: counter %d: malformed %v", i, vals[j])
			}
			a.Counts[i] = uint64(n)
		}
	}
	return a, nil
}

// runWindow runs window.lua on keys, pipelined with other calls' when the
// store batches.
func (s *RedisStore) runWindow(ctx context.Context, keys []string, args []any) ([]any, error) {
	if s.windows == nil {
		return s.run(ctx, windowScript, "window", keys, args, len(keys))
	}
	res, err := s.windows.run(ctx, keys, args)
	if err != nil {
		return nil, fmt.Errorf("service: redis: %w", err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) != len(keys) {
		return nil, fmt.Errorf("service: redis: window script reply: want %d values, got %T of %v", len(keys), res, res)
	}
	return vals, nil
}

var windowScript = redis.NewScript(windowLua)

func (s *RedisStore) windowScript() *redis.Script { return windowScript }

// windowEntry is a fixed-window counter of a MemoryStore.
type windowEntry struct {
	count     uint64
	expiresAt int64 // Unix ns
}

// Count implements Store under the store's mutex, as window.lua does: each
// counter incremented and given its expiry. Counters are held apart from
// the buckets, at most MaxKeys of them: a call that needs a new counter
// beyond that, once the expired ones are forgotten, fails with
// ErrMemoryFull.
func (m *MemoryStore) Count(ctx context.Context, req *CountRequest) (CountAnswer, error) {
	if err := ctx.Err(); err != nil {
		return CountAnswer{}, err
	}
	if err := validWindows(req); err != nil {
		return CountAnswer{}, err
	}
	a := CountAnswer{Counts: make([]uint64, len(req.Windows))}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if m.windows == nil {
		m.windows = map[string]windowEntry{}
	}
	added := 0
	for _, w := range req.Windows {
		if e, ok := m.windows[w.Key]; !ok || e.expiresAt <= now {
			added++
		}
	}
	if len(m.windows)+added > m.maxKeys {
		for k, e := range m.windows {
			if e.expiresAt <= now {
				delete(m.windows, k)
			}
		}
		if len(m.windows)+added > m.maxKeys {
			return CountAnswer{}, fmt.Errorf("%w: %d window counters live", ErrMemoryFull, len(m.windows))
		}
	}
	for i, w := range req.Windows {
		e := m.windows[w.Key]
		if e.expiresAt <= now {
			e = windowEntry{}
		}
		e.count += w.Hits
		e.expiresAt = now + w.Expiry*1e9
		m.windows[w.Key] = e
		a.Counts[i] = e.count
	}
	return a, nil
}

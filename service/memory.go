package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// ErrMemoryFull is returned by MemoryStore when a decision needs a new key
// while the store holds MaxKeys buckets that are all still refilling.
var ErrMemoryFull = errors.New("service: memory store: full")

// MemoryOptions configure a MemoryStore. Zero fields mean the defaults.
type MemoryOptions struct {
	// MaxKeys bounds the buckets held at once (default DefaultMemoryMaxKeys).
	MaxKeys int
	// Now is the clock, Unix nanoseconds (default time.Now).
	Now func() int64
	// LedgerWindow is the ledger window, as RedisOptions.LedgerWindow
	// (default DefaultLedgerWindow).
	LedgerWindow time.Duration
}

// DefaultMemoryMaxKeys is the default bound of a MemoryStore.
const DefaultMemoryMaxKeys = 1 << 20

// minSweep is the table size below which a MemoryStore never sweeps, and
// sweepEvery the least time between two sweeps, so a table full of buckets
// that are all refilling is not scanned on every decision.
const (
	minSweep   = 1024
	sweepEvery = int64(100 * time.Millisecond)
)

// MemoryStore keeps buckets in this process, with the semantics of the Redis
// store: the arithmetic is package bucket's, a request's buckets are decided
// under one mutex (all consumed or none), keys are named as in Redis, and a
// bucket is forgotten once it is full again (at once when a decision leaves it
// full, else by a sweep that runs whenever the table has doubled since the
// last one, at most every 100ms). It never holds more than MaxKeys buckets: a decision that needs
// a new key beyond that fails with ErrMemoryFull. It is for running without
// Redis; limits are then per process, not cluster-wide.
type MemoryStore struct {
	now     func() int64
	maxKeys int
	window  int64 // the ledger window, ns

	mu        sync.Mutex
	buckets   map[string]memoryEntry
	nextSweep int
	lastSweep int64
	windows   map[string]windowEntry // fixed-window counters (window.go)
	slots     map[string]slotTable   // concurrency slot tables (slots.go)
}

type memoryEntry struct {
	state  bucket.State
	ledger ledger
	fullAt int64 // Unix ns from which the bucket is full and can be forgotten (see put)
}

// before reports whether e is a quota's record of a period before p: full
// again, its ledger dropped, as bucket.lua reads it.
func (e memoryEntry) before(p wire.Period) bool {
	return p.IsQuota() && e.state.At > 0 && e.state.At < p.PeriodStartMs*int64(time.Millisecond)
}

// after reports whether st is a quota's state of a period after p (written
// at or past its end): it takes no return of p, as lease.lua's.
func after(st bucket.State, p wire.Period) bool {
	return p.IsQuota() && st.At >= p.PeriodEndMs*int64(time.Millisecond)
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMemoryMaxKeys
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return time.Now().UnixNano() }
	}
	if opts.LedgerWindow < time.Millisecond {
		opts.LedgerWindow = DefaultLedgerWindow
	}
	return &MemoryStore{
		now:       opts.Now,
		maxKeys:   opts.MaxKeys,
		window:    int64(opts.LedgerWindow),
		buckets:   make(map[string]memoryEntry),
		nextSweep: min(minSweep, opts.MaxKeys),
	}
}

// Decide implements Store.
func (m *MemoryStore) Decide(ctx context.Context, req *wire.Request) (wire.Answer, error) {
	if err := ctx.Err(); err != nil {
		return wire.Answer{}, err
	}
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.Answer{}, err
	}
	n := len(req.Buckets)
	keys := make([]string, n)
	for i := range req.Buckets {
		b := &req.Buckets[i]
		keys[i] = storageKey(DefaultKeyPrefix, b.Key, b.Rate, b.Burst)
	}
	type step struct {
		limit  bucket.Limit
		old    bucket.State
		next   bucket.State
		ledger ledger
		ok     bool
		wait   time.Duration
	}
	steps := make([]step, n)
	d := wire.Answer{Buckets: make([]wire.BucketAnswer, n)}

	m.mu.Lock()
	now := m.now()
	all, added := true, 0
	for i := range req.Buckets {
		b := &req.Buckets[i]
		st := &steps[i]
		st.limit = limitOf(b.Rate, b.Burst, b.Period)
		bn := periodNow(now, b.Period)
		e, found := m.buckets[keys[i]]
		if found && (e.fullAt <= now || e.before(b.Period)) {
			e = memoryEntry{} // full since: forgotten, as an expired Redis key
		}
		st.old = e.state
		st.ledger = e.ledger.at(now, m.window)
		if b.Refundable {
			st.ledger.reserve(caller, b.Cost) // kept only when admitted
		}
		var dec bucket.Decision
		st.next, dec = st.limit.Reserve(e.state, bn, b.Cost, time.Duration(b.MaxDelayMs)*time.Millisecond)
		st.ok, st.wait = dec.Allowed, dec.Wait
		all = all && st.ok
		if !found && st.limit.FullAt(st.next) > now {
			added++ // a new key to store
		}
	}
	if all && added > 0 && len(m.buckets)+added > m.maxKeys {
		m.maybeSweep(now, true)
		if len(m.buckets)+added > m.maxKeys {
			m.mu.Unlock()
			return wire.Answer{}, fmt.Errorf("%w: %d buckets still refilling", ErrMemoryFull, len(m.buckets))
		}
	}
	if all {
		for i := range steps {
			st := &steps[i]
			m.put(keys[i], st.limit, st.next, st.ledger, now)
		}
		m.maybeSweep(now, false)
	}
	m.mu.Unlock()

	for i := range req.Buckets {
		st := &steps[i]
		tokens, at, wait := st.next.Tokens, st.next.At, st.wait
		if !all {
			bn := periodNow(now, req.Buckets[i].Period)
			tokens, at, wait = st.limit.Tokens(st.old, bn), max(st.old.At, bn), 0
		}
		d.Buckets[i] = report(&req.Buckets[i], st.ok, tokens, at-now, now, wait)
	}
	d.Settle(req)
	return d, nil
}

// Lease implements Store under the store's mutex: each bucket's return is
// clamped to its ledger's grants outstanding to the caller (WithCaller) and
// to the window's return budget (a quota's record of a later period than
// the call's takes none, as lease.lua's); a dry run of package bucket's
// Limit.Lease on every bucket decides whether the call grants; then each
// bucket is leased (the grant recorded in its ledger), or, when refused,
// takes back only its return.
func (m *MemoryStore) Lease(ctx context.Context, req *wire.LeaseRequest) (wire.LeaseAnswer, error) {
	if err := ctx.Err(); err != nil {
		return wire.LeaseAnswer{}, err
	}
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.LeaseAnswer{}, err
	}
	n := len(req.Buckets)
	keys := make([]string, n)
	rets := make([]float64, n)
	leds := make([]ledger, n)
	states := make([]bucket.State, n)
	a := wire.LeaseAnswer{Granted: true, Buckets: make([]wire.Grant, n)}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for i, b := range req.Buckets {
		keys[i] = storageKey(DefaultKeyPrefix, b.Key, b.Rate, b.Burst)
		if e, ok := m.buckets[keys[i]]; ok && e.fullAt > now && !e.before(b.Period) {
			states[i], leds[i] = e.state, e.ledger
		}
		leds[i] = leds[i].at(now, m.window)
		if !after(states[i], b.Period) {
			rets[i] = leds[i].takeReturn(caller, b.Return, b.Burst)
		}
		lim := limitOf(b.Rate, b.Burst, b.Period)
		if _, _, ok, _ := lim.Lease(states[i], periodNow(now, b.Period), rets[i], b.Want, b.Min); !ok {
			a.Granted = false
		}
	}
	if len(m.buckets)+n > m.maxKeys {
		m.maybeSweep(now, true)
		if len(m.buckets)+n > m.maxKeys {
			return wire.LeaseAnswer{}, fmt.Errorf("%w: %d buckets still refilling", ErrMemoryFull, len(m.buckets))
		}
	}
	for i, b := range req.Buckets {
		lim, bn := limitOf(b.Rate, b.Burst, b.Period), periodNow(now, b.Period)
		st := states[i]
		next, granted := lim.Refund(st, bn, rets[i]), 0.0 // refused: only the return
		returned := 0.0
		if st.At > 0 {
			returned = returnTook(lim.Tokens(st, bn), rets[i], b.Burst)
		}
		if a.Granted {
			next, granted, _, _ = lim.Lease(st, bn, rets[i], b.Want, b.Min)
			leds[i].grant(caller, granted)
		}
		if a.Granted || rets[i] > 0 {
			m.put(keys[i], lim, next, leds[i], now)
		}
		a.Buckets[i] = grant(&req.Buckets[i], a.Granted, granted, lim.Tokens(next, bn), max(next.At, now)-now, now)
		a.Buckets[i].Returned = returned
	}
	return a, nil
}

// Charge implements Store under the store's mutex: package bucket's
// Limit.Charge on every bucket, a positive amount clamped to 2 × burst and a
// refund to the ledger's reservations outstanding to the caller (WithCaller)
// and to the window's refund budget.
func (m *MemoryStore) Charge(ctx context.Context, req *wire.ChargeRequest) (wire.ChargeAnswer, error) {
	if err := ctx.Err(); err != nil {
		return wire.ChargeAnswer{}, err
	}
	caller, err := callerOf(ctx)
	if err != nil {
		return wire.ChargeAnswer{}, err
	}
	n := len(req.Buckets)
	a := wire.ChargeAnswer{Buckets: make([]wire.BucketAnswer, n)}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if len(m.buckets)+n > m.maxKeys {
		m.maybeSweep(now, true)
		if len(m.buckets)+n > m.maxKeys {
			return wire.ChargeAnswer{}, fmt.Errorf("%w: %d buckets still refilling", ErrMemoryFull, len(m.buckets))
		}
	}
	for i, b := range req.Buckets {
		k := storageKey(DefaultKeyPrefix, b.Key, b.Rate, b.Burst)
		lim, bn := limitOf(b.Rate, b.Burst, b.Period), periodNow(now, b.Period)
		st, led := bucket.State{}, ledger{}
		if e, ok := m.buckets[k]; ok && e.fullAt > now && !e.before(b.Period) {
			st, led = e.state, e.ledger
		}
		led = led.at(now, m.window)
		amount := b.Amount
		if amount > 2*b.Burst {
			amount = 2 * b.Burst
		} else if amount < 0 {
			amount = -led.takeRefund(caller, -amount, b.Burst)
		}
		next, applied := st, 0.0
		if amount != 0 {
			applied = chargeTook(lim.Tokens(st, bn), amount, b.Burst)
			next = lim.Charge(st, bn, amount)
			m.put(k, lim, next, led, now)
		}
		a.Buckets[i] = charged(&req.Buckets[i], lim.Tokens(next, bn), max(next.At, now)-now, now)
		a.Buckets[i].Applied = applied
	}
	return a, nil
}

// put stores a bucket's state and ledger (callers with nothing outstanding
// dropped), or forgets it when it is full at now (a full bucket takes
// nothing back, so its ledger goes with it), unless the window's return or
// refund budget is in use: then it is kept to the window's end, as
// bucket.lua does. A quota short of full is kept to its period's end plus
// quotaMargin, never less than it already was. Called with m.mu held.
func (m *MemoryStore) put(k string, lim bucket.Limit, st bucket.State, led ledger, now int64) {
	led = led.at(now, m.window)
	keep := lim.FullAt(st)
	// A record of a later period than lim's (a lagging caller's write)
	// keeps its own expiry, as bucket.lua's PTTL does.
	if lim.Quota() && (keep > now || st.At >= lim.PeriodEnd) {
		keep = max(keep+int64(quotaMargin), m.buckets[k].fullAt)
	}
	if led.returned > 0 || led.refunded > 0 {
		keep = max(keep, (led.gen+1)*m.window)
	}
	if keep > now {
		m.buckets[k] = memoryEntry{state: st, ledger: led, fullAt: keep}
	} else {
		delete(m.buckets, k)
	}
}

// maybeSweep forgets every bucket that is full at now, when the table has
// reached the size of the next sweep (or force is set) and the last sweep is
// at least sweepEvery ago. Called with m.mu held.
func (m *MemoryStore) maybeSweep(now int64, force bool) {
	if !force && len(m.buckets) < m.nextSweep {
		return
	}
	if m.lastSweep != 0 && now-m.lastSweep < sweepEvery && now >= m.lastSweep {
		return
	}
	m.lastSweep = now
	for k, e := range m.buckets {
		if e.fullAt <= now {
			delete(m.buckets, k)
		}
	}
	m.nextSweep = min(max(minSweep, 2*len(m.buckets)), m.maxKeys)
}

// Ping implements Store; a MemoryStore is always ready.
func (m *MemoryStore) Ping(context.Context) error { return nil }

// Close implements Store.
func (m *MemoryStore) Close() error { return nil }

// What a return or a charge took from a bucket holding before tokens, said
// as the amount itself, as lease.lua and charge.lua say it: a difference of
// two token counts would carry their rounding, and amounts that add up
// exactly (returns of 5 to a grant of 40) would not.

// returnTook is what a return of ret adds: all of it, or what a full
// bucket leaves room for.
func returnTook(before, ret, burst float64) float64 {
	switch {
	case !(ret > 0) || before >= burst:
		return 0
	case before+ret > burst:
		return burst - before
	}
	return ret
}

// chargeTook is what a charge of amount (clamped) takes: the amount, or what
// the bucket's bounds, -burst and burst, leave (nothing from a debt deeper
// than -burst, which only delayed decisions leave).
func chargeTook(before, amount, burst float64) float64 {
	switch {
	case amount > 0 && before-amount < -burst:
		return max(before+burst, 0)
	case before-amount > burst:
		return before - burst
	}
	return amount
}

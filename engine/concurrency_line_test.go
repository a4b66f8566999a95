package engine_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// Lines for a slot across workers (concurrency_line.go): two fake workers
// (two Plugins, as two Envoy workers' VMs) on one shared data and clock.

const lineStreams = `{"rules": [{"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency",
  "algorithm_config": {"max_in_flight": %d, "max_delay_ms": %d, "max_waiting": %d}}]}`

const pollNs = 20e6 // the engine's slot poll

// lineEnvoy is one Envoy of several workers.
type lineEnvoy struct {
	t       *testing.T
	clock   *fakehost.Clock
	workers []*lineWorker
	arrived int // requests opened
}

type lineWorker struct {
	h *fakehost.Host
	p *engine.Plugin
}

// lineReq is one request on a worker.
type lineReq struct {
	n      int // arrival order
	w      *lineWorker
	s      *fakehost.Stream
	r      *engine.Request
	action engine.Action
	ended  bool
}

func newLineEnvoy(t *testing.T, workers int, cfg string) *lineEnvoy {
	t.Helper()
	e := &lineEnvoy{t: t, clock: fakehost.NewClock(1_000e9)}
	sd := shareddata.New()
	for range workers {
		h := fakehost.New()
		h.Clock, h.SD = e.clock, sd
		p, err := engine.New(h, []byte(cfg), "", engine.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e.workers = append(e.workers, &lineWorker{h: h, p: p})
	}
	return e
}

// open starts a request of tenant on worker i.
func (e *lineEnvoy) open(i int, tenant string) *lineReq {
	s := fakehost.NewStream("t", tenant)
	s.Clock = e.clock
	w := e.workers[i]
	e.arrived++
	q := &lineReq{n: e.arrived, w: w, s: s, r: w.p.NewRequest(s)}
	q.action = q.r.OnRequestHeaders()
	return q
}

func (q *lineReq) admitted() bool {
	return !q.ended && q.s.Replied == 0 && (q.action == engine.Continue || q.s.Resumed == 1)
}
func (q *lineReq) waiting() bool {
	return !q.ended && q.s.Replied == 0 && q.action == engine.Pause && q.s.Resumed == 0
}

// end ends the request (its response done, or its client gone).
func (q *lineReq) end() {
	q.ended, q.s.Done = true, true
	q.r.Done()
}

// step moves the clock by d and fires the timers due on the requests of
// the live workers.
func (e *lineEnvoy) step(d int64, qs []*lineReq, dead ...*lineWorker) {
	now := e.clock.Advance(d)
next:
	for _, q := range qs {
		for _, w := range dead {
			if q.w == w {
				continue next
			}
		}
		q.s.Fire(now)
	}
}

func (e *lineEnvoy) metric(name string) int64 {
	var n int64
	for _, w := range e.workers {
		n += w.h.Metric(engine.Name + "." + name).N
	}
	return n
}

// TestSlotLineOrderAcrossWorkers: one slot; b waits on worker 1, then c on
// worker 0, then d on worker 1. When a ends on worker 0, c (woken at once
// in its worker) does not take the slot ahead of b: b gets it at worker
// 1's next poll, then c, then d; a newcomer on worker 0 while they wait
// takes its place behind them.
func TestSlotLineOrderAcrossWorkers(t *testing.T) {
	e := newLineEnvoy(t, 2, fmt.Sprintf(lineStreams, 1, 5000, 10))
	a := e.open(0, "x")
	b := e.open(1, "x")
	c := e.open(0, "x")
	d := e.open(1, "x")
	all := []*lineReq{a, b, c, d}
	if !a.admitted() || !b.waiting() || !c.waiting() || !d.waiting() {
		t.Fatalf("a admitted, b, c, d waiting: %v %v %v %v", a.admitted(), b.waiting(), c.waiting(), d.waiting())
	}
	a.end()
	if c.admitted() {
		t.Fatal("c, on a's worker, took the slot a gave back ahead of b, which waited longer on the other worker")
	}
	late := e.open(0, "x")
	all = append(all, late)
	if !late.waiting() {
		t.Fatal("a newcomer took the free slot while others waited")
	}
	for want, q := range []*lineReq{b, c, d, late} {
		for range 3 {
			e.step(pollNs, all)
		}
		for i, o := range []*lineReq{b, c, d, late} {
			if o.admitted() != (i == want) {
				t.Fatalf("after the end before the %d-th: admitted b, c, d, late = %v %v %v %v", want, b.admitted(), c.admitted(), d.admitted(), late.admitted())
			}
		}
		q.end()
	}
	if n := e.metric("rule.streams.in_flight"); n != 0 {
		t.Fatalf("in_flight %d at the end, want 0", n)
	}
	for i, w := range e.workers {
		if n := w.p.SlotLinesWaiting(); n != 0 {
			t.Fatalf("worker %d: %d lines left in shared data, want 0", i, n)
		}
	}
}

// TestSlotLineAbandoned: the head of the line (worker 1) gives up, its
// client gone; the next (worker 0) gets the slot at its next poll, not
// after a lapse. A waiter behind that gives up is skipped the same way.
func TestSlotLineAbandoned(t *testing.T) {
	e := newLineEnvoy(t, 2, fmt.Sprintf(lineStreams, 1, 5000, 10))
	a := e.open(0, "x")
	b := e.open(1, "x")
	c := e.open(1, "x")
	d := e.open(0, "x")
	all := []*lineReq{a, b, c, d}
	a.end()
	b.end() // the head's client left
	c.end() // and the next's
	e.step(pollNs, all)
	if !d.admitted() {
		t.Fatal("d waits still: the tickets given up block the line")
	}
	if n := e.metric("rule.streams.delay_abandoned"); n != 2 {
		t.Fatalf("delay_abandoned %d, want 2", n)
	}
	d.end()
	if n := e.workers[0].p.SlotLinesWaiting(); n != 0 {
		t.Fatalf("%d lines left, want 0", n)
	}
}

// TestSlotLineWorkerVanished: the head's worker stops (its timers never
// fire again, as a worker gone): its ticket blocks the line for no more
// than its turn's lease, then the next is admitted; meanwhile the order
// holds.
func TestSlotLineWorkerVanished(t *testing.T) {
	e := newLineEnvoy(t, 2, fmt.Sprintf(lineStreams, 1, 5000, 10))
	a := e.open(0, "x")
	b := e.open(1, "x")
	c := e.open(0, "x")
	all := []*lineReq{a, b, c}
	gone := e.workers[1]
	e.step(pollNs/2, all, gone) // b's turn renewed by a poll, then its worker vanishes
	e.step(pollNs/2, all)
	a.end()
	t0 := e.clock.Now()
	for e.clock.Now() < t0+engine.LineLease-pollNs {
		e.step(pollNs/2, all, gone)
		if c.admitted() {
			t.Fatalf("c admitted %d ms after the slot freed, before b's turn lapsed (%d ms)", (e.clock.Now()-t0)/1e6, engine.LineLease/1e6)
		}
	}
	for e.clock.Now() < t0+engine.LineLease+2*pollNs && !c.admitted() {
		e.step(pollNs/2, all, gone)
	}
	if !c.admitted() {
		t.Fatalf("c still waits %d ms after the slot freed: the vanished worker's ticket blocks the line", (e.clock.Now()-t0)/1e6)
	}
	c.end()
	b.end()
	if n := e.workers[0].p.SlotLinesWaiting(); n != 0 {
		t.Fatalf("%d lines left, want 0", n)
	}
}

// TestSlotLineProperty: random interleavings of arrivals on three workers,
// ends of admitted requests, waiters that give up, and time, over two
// keys: never more than max_in_flight of a key admitted; every waiter
// admitted before any that came after it on its key, and no newcomer
// admitted while an older one waits; at the end every slot is back and no
// line is left in shared data.
func TestSlotLineProperty(t *testing.T) {
	const maxIn = 2
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 42))
		e := newLineEnvoy(t, 3, fmt.Sprintf(lineStreams, maxIn, 60_000, 1000))
		var all []*lineReq
		keyOf := map[*lineReq]string{}
		for step := range 300 {
			switch op := rng.IntN(10); {
			case op < 4:
				k := []string{"x", "y"}[rng.IntN(2)]
				q := e.open(rng.IntN(3), k)
				keyOf[q] = k
				all = append(all, q)
			case op < 6:
				if q := pick(rng, all, (*lineReq).admitted); q != nil {
					q.end()
				}
			case op < 7:
				if q := pick(rng, all, (*lineReq).waiting); q != nil {
					q.end()
				}
			default:
				e.step(rng.Int64N(pollNs)+1, all)
			}
			for _, k := range []string{"x", "y"} {
				in, oldestWaiting := 0, -1
				for _, q := range all {
					if keyOf[q] != k {
						continue
					}
					if q.waiting() && oldestWaiting < 0 {
						oldestWaiting = q.n
					}
				}
				for _, q := range all {
					if keyOf[q] != k || !q.admitted() {
						continue
					}
					in++
					if oldestWaiting >= 0 && q.n > oldestWaiting {
						t.Fatalf("seed %d step %d: %s's request %d admitted while %d, older, waits", seed, step, k, q.n, oldestWaiting)
					}
				}
				if in > maxIn {
					t.Fatalf("seed %d step %d: %d of %s admitted, max %d", seed, step, in, k, maxIn)
				}
			}
		}
		for range 10_000 { // end everything: the admitted, then those they admit
			q := pick(rng, all, func(q *lineReq) bool { return q.admitted() || q.waiting() })
			if q == nil {
				break
			}
			if q.admitted() || rng.IntN(2) == 0 {
				q.end()
			} else {
				e.step(pollNs, all)
			}
		}
		if n := e.metric("rule.streams.in_flight"); n != 0 {
			t.Fatalf("seed %d: in_flight %d at the end, want 0", seed, n)
		}
		if n := e.metric("rule.streams.waiting"); n != 0 {
			t.Fatalf("seed %d: waiting %d at the end, want 0", seed, n)
		}
		if n := e.workers[0].p.SlotLinesWaiting(); n != 0 {
			t.Fatalf("seed %d: %d lines left in shared data, want 0", seed, n)
		}
		for _, k := range []string{"x", "y"} {
			var qs []*lineReq
			for range maxIn + 1 {
				qs = append(qs, e.open(rng.IntN(3), k))
			}
			if !qs[0].admitted() || !qs[maxIn-1].admitted() || qs[maxIn].admitted() {
				t.Fatalf("seed %d: key %s does not have exactly %d slots free at the end", seed, k, maxIn)
			}
			for _, q := range qs {
				q.end()
			}
		}
	}
}

// pick is a random request of qs for which ok holds, nil when none.
func pick(rng *rand.Rand, qs []*lineReq, ok func(*lineReq) bool) *lineReq {
	var c []*lineReq
	for _, q := range qs {
		if ok(q) {
			c = append(c, q)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rng.IntN(len(c))]
}

// TestSlotLineStalledHeadRejoins: the head's worker stalls past its turn
// (its timers late): the next is admitted, and the stalled request, once
// its worker runs again, takes a new ticket at the back, before a later
// newcomer, and is admitted in its new turn.
func TestSlotLineStalledHeadRejoins(t *testing.T) {
	e := newLineEnvoy(t, 2, fmt.Sprintf(lineStreams, 1, 10_000, 10))
	a := e.open(0, "x")
	b := e.open(1, "x")
	c := e.open(0, "x")
	all := []*lineReq{a, b, c}
	stalled := e.workers[1]
	a.end()
	for range 2 * engine.LineLease / pollNs {
		e.step(pollNs, all, stalled)
	}
	if !c.admitted() || !b.waiting() {
		t.Fatalf("after b's turn lapsed: c admitted %v, b waiting %v; want both", c.admitted(), b.waiting())
	}
	e.step(pollNs, all) // b's worker runs again: b finds its turn gone
	d := e.open(0, "x")
	all = append(all, d)
	if !b.waiting() || !d.waiting() {
		t.Fatalf("b waiting %v, d waiting %v; want both", b.waiting(), d.waiting())
	}
	c.end()
	for range 3 {
		e.step(pollNs, all)
	}
	if !b.admitted() || d.admitted() {
		t.Fatalf("after c: b admitted %v, d admitted %v; want b (its new ticket first), not d", b.admitted(), d.admitted())
	}
	b.end()
	for range 3 {
		e.step(pollNs, all)
	}
	if !d.admitted() {
		t.Fatal("d still waits after b")
	}
	d.end()
	if n, f := e.workers[0].p.SlotLinesWaiting(), e.metric("rule.streams.in_flight"); n != 0 || f != 0 {
		t.Fatalf("%d lines left, in_flight %d; want 0, 0", n, f)
	}
}

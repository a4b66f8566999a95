package plugin

import (
	"container/heap"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// Holding requests (engine.Stream.After). proxy-wasm has no timer per
// request; a plugin context has one tick (proxy_set_tick_period). While no
// request is held the tick runs once a second (the engine's Tick), as it
// always has: an idle plugin pays nothing for holding. When a request is
// held the tick period drops to fastTickMS, and each tick runs the holds
// that are due, in the order of their moments (then of their arrival); the
// once-a-second work runs on the first tick a second after the last. When
// the last hold is gone the period goes back to a second. A hold runs at
// most fastTickMS after its moment (plus the worker's own delays), never
// before: it runs only once the host's clock has passed it.

const (
	// slowTickMS is the tick period when nothing is held.
	slowTickMS = 1000
	// fastTickMS is the tick period while a request is held: how late a
	// held request may go on, at most, beyond the worker's own delays.
	fastTickMS = 5
)

// hold is one held request: f runs at due (Unix ns) in context c, if c
// still serves the same request (gen).
type hold struct {
	due int64
	seq uint64
	c   *httpContext
	gen uint64
	f   func()
}

// holds is a plugin context's held requests, a min-heap by (due, seq).
type holds struct {
	h    holdHeap
	seq  uint64
	fast bool  // the tick runs every fastTickMS
	slow int64 // when the once-a-second work last ran (Unix ns)
	// compactAt is the heap's length at which add drops the holds of
	// requests that ended (they would otherwise stay until their moment).
	compactAt int
}

// minCompact is the smallest heap add compacts.
const minCompact = 256

type holdHeap []hold

func (h holdHeap) Len() int { return len(h) }
func (h holdHeap) Less(i, j int) bool {
	return h[i].due < h[j].due || h[i].due == h[j].due && h[i].seq < h[j].seq
}
func (h holdHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *holdHeap) Push(x any)   { *h = append(*h, x.(hold)) }
func (h *holdHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = hold{}
	*h = old[:len(old)-1]
	return x
}

// add holds f for context c until due, and speeds the tick up if it was
// slow.
func (hs *holds) add(due int64, c *httpContext, f func()) error {
	if !hs.fast {
		if err := proxywasm.SetTickPeriodMilliSeconds(fastTickMS); err != nil {
			return err
		}
		hs.fast = true
	}
	hs.seq++
	heap.Push(&hs.h, hold{due: due, seq: hs.seq, c: c, gen: c.gen, f: f})
	if len(hs.h) >= max(hs.compactAt, minCompact) {
		hs.compact()
	}
	return nil
}

// compact drops the holds of requests that ended, so the heap holds at
// most about twice the requests held (a client that connects and leaves
// again and again leaves nothing behind for long). Amortized: the next
// compaction waits for the heap to double.
func (hs *holds) compact() {
	live := hs.h[:0]
	for _, x := range hs.h {
		if x.c.gen == x.gen && x.c.id != 0 {
			live = append(live, x)
		}
	}
	clear(hs.h[len(live):])
	hs.h = live
	heap.Init(&hs.h)
	hs.compactAt = 2 * len(hs.h)
}

// runDue runs the holds due by now, each in its request's context, and
// slows the tick down once none is left. It runs in the plugin context's
// tick; it returns the number of holds run.
func (hs *holds) runDue(now int64, pluginID uint32) int {
	n := 0
	for len(hs.h) > 0 && hs.h[0].due <= now {
		x := heap.Pop(&hs.h).(hold)
		if x.c.gen != x.gen || x.c.id == 0 {
			continue // the request is done: the engine gave back what it took
		}
		if err := proxywasm.SetEffectiveContext(x.c.id); err != nil {
			continue
		}
		// Lent, as in stream.Run: a call f sends (a cluster slot's retry)
		// is filed under the plugin context, its answer made the
		// request's again.
		active, lent = x.c.id, true
		x.f()
		n++
	}
	lent = false
	if n > 0 {
		active = pluginID
		if err := proxywasm.SetEffectiveContext(pluginID); err != nil {
			proxywasm.LogWarn(Name + ": back to the plugin context: " + err.Error())
		}
	}
	// Holds of requests that ended wait in the heap until their moment;
	// the tick slows down once none is left.
	if len(hs.h) == 0 && hs.fast {
		if err := proxywasm.SetTickPeriodMilliSeconds(slowTickMS); err == nil {
			hs.fast = false
		}
	}
	return n
}

// slowDue reports whether the once-a-second work is due at now, and
// records that it runs.
func (hs *holds) slowDue(now int64) bool {
	if hs.fast && now-hs.slow < slowTickMS*1e6 {
		return false
	}
	hs.slow = now
	return true
}

// Package gcheadroom paces the Go collector of a process whose live heap is
// small, such as limitd over Redis, whose heap is mostly each call's garbage.
//
// At the runtime's default (GOGC=100) a collection starts when the heap has
// grown by as much as the collector scans: the live heap, the goroutine
// stacks and the globals, W. With a few MiB live, that is a collection every
// few MiB allocated: limitd over Redis at saturation collected dozens of
// times a second, and each collection also shrank the stacks of the
// goroutines that serve calls, which the next calls grew again.
//
// The model: the collector's percent p is raised so that the heap may grow
// by up to a headroom H between collections, and never by less than at the
// default:
//
//	p = max(100, 100·H / max(W, 4 MiB))
//
// The runtime's goal for the next collection is max(L + W·p/100, 4 MiB·p/100)
// for a live heap L (its heap minimum is 4 MiB at p = 100 and scales with
// p), so with this p:
//
//   - the goal is at most max(the default's goal, L + H): the heap never
//     grows more than H past the live heap, or more than at the default;
//   - once W reaches H, p is 100: a large live heap (the in-memory store's
//     buckets) is collected exactly as at the default.
//
// A memory limit (GOMEMLIMIT) still applies: the runtime collects earlier
// whenever the heap nears it. Percent is a pure function of what the
// collector last scanned; Run applies it at each tick (a second in limitd,
// so the bound holds for what was scanned up to a second before) and puts
// the default back when it stops.
package gcheadroom

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// DefaultHeadroom is limitd's headroom, H.
const DefaultHeadroom = 16 << 20

// heapMinimum is the runtime's heap minimum at the default percent.
const heapMinimum = 4 << 20

// defaultPercent is the runtime's default (GOGC=100).
const defaultPercent = 100

// Percent is the collector's percent for a heap whose last collection
// scanned work bytes (live heap, stacks and globals), given headroom bytes:
// max(100, 100·headroom / max(work, 4 MiB)). A headroom of 0 gives 100.
func Percent(work, headroom uint64) int {
	headroom = min(headroom, maxHeadroom)
	base := max(work, heapMinimum)
	if headroom <= base {
		return defaultPercent
	}
	return int(100*(headroom/base) + 100*(headroom%base)/base) // ⌊100·headroom/base⌋
}

// maxHeadroom bounds the headroom Percent reads (1 PiB), so that its
// arithmetic cannot overflow.
const maxHeadroom = 1 << 50

// workSamples are the runtime/metrics names of what the collector scanned
// at its last collection.
var workSamples = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// Work reads what the collector scanned at its last collection: the live
// heap, the goroutine stacks and the globals, in bytes. A figure this Go's
// runtime does not know (a later Go renaming one; TestWorkFigures) makes it
// all of memory, so Percent paces as the default instead of reading a large
// heap as an empty one.
func Work() uint64 {
	s := make([]metrics.Sample, len(workSamples))
	for i, name := range workSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	var w uint64
	for _, v := range s {
		if v.Value.Kind() != metrics.KindUint64 {
			return math.MaxUint64
		}
		w += v.Value.Uint64()
	}
	return w
}

// running keeps a second Run in one process (tests serve several limitds)
// from fighting the first over the one collector.
var running atomic.Bool

// Run sets the collector's percent to Percent(work(), headroom) now and at
// each tick until ctx is done, then puts the default back. set is
// debug.SetGCPercent in a process. It returns at once, doing nothing, when
// another Run is running in the process.
func Run(ctx context.Context, tick <-chan time.Time, headroom uint64, work func() uint64, set func(int) int) {
	if !running.CompareAndSwap(false, true) {
		return
	}
	defer running.Store(false)
	last := -1
	for {
		if p := Percent(work(), headroom); p != last {
			set(p)
			last = p
		}
		select {
		case <-ctx.Done():
			set(defaultPercent)
			return
		case <-tick:
		}
	}
}

// Start runs Run with debug.SetGCPercent, reading Work every second, on a
// goroutine of its own; it does nothing for a headroom of 0.
func Start(ctx context.Context, headroom uint64) {
	if headroom == 0 {
		return
	}
	t := time.NewTicker(time.Second)
	go func() {
		defer t.Stop()
		Run(ctx, t.C, headroom, Work, debug.SetGCPercent)
	}()
}

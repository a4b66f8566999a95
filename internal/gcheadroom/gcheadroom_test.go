package gcheadroom

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

// goal is the runtime's heap goal for percent p (mgcpacer.go's commit):
// max(live + (live+stacks+globals)·p/100, 4 MiB·p/100).
func goal(live, work uint64, p int) uint64 {
	return max(live+work*uint64(p)/100, heapMinimum*uint64(p)/100)
}

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		work, headroom uint64
		want           int
	}{
		{0, 0, 100},
		{2 * mib, 0, 100},
		{2 * mib, 16 * mib, 400}, // the heap minimum (4 MiB) sets the base
		{8 * mib, 16 * mib, 200},
		{16 * mib, 16 * mib, 100},
		{1 << 30, 16 * mib, 100}, // a large live heap: the default
		{5 * mib, 16 * mib, 320},
		{3 * mib, 1 << 62, 100 << 28}, // the headroom is bounded at 1 PiB
	} {
		if got := Percent(tc.work, tc.headroom); got != tc.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", tc.work, tc.headroom, got, tc.want)
		}
	}
}

// TestPercentBoundsTheGoal is the package's guarantee, over random heaps:
// the percent is never below the default, and the runtime's goal with it is
// at most the larger of the default's goal and the live heap plus the
// headroom.
func TestPercentBoundsTheGoal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		live := r.Uint64N(1 << uint(r.IntN(40)+1))
		work := live + r.Uint64N(1<<uint(r.IntN(30)+1)) // plus stacks and globals
		headroom := r.Uint64N(1 << uint(r.IntN(36)+1))
		p := Percent(work, headroom)
		if p < 100 {
			t.Fatalf("Percent(%d, %d) = %d, below the default", work, headroom, p)
		}
		if g, bound := goal(live, work, p), max(goal(live, work, 100), live+headroom); g > bound {
			t.Fatalf("live %d, work %d, headroom %d: percent %d gives a goal of %d, past %d", live, work, headroom, p, g, bound)
		}
		if work >= headroom && p != 100 {
			t.Fatalf("work %d ≥ headroom %d, percent %d, want the default", work, headroom, p)
		}
	}
}

// TestRun drives Run by hand: it sets the percent at once and at each tick
// only when it changes, puts the default back when stopped, and a second
// Run in the process does nothing.
func TestRun(t *testing.T) {
	const mib = 1 << 20
	work := make(chan uint64, 1)
	w := uint64(2 * mib)
	read := func() uint64 {
		select {
		case w = <-work:
		default:
		}
		return w
	}
	set := make(chan int, 10)
	ctx, cancel := context.WithCancel(t.Context())
	tick := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, tick, 16*mib, read, func(p int) int { set <- p; return 0 })
	}()
	if p := <-set; p != 400 {
		t.Fatalf("first percent %d, want 400", p)
	}
	tick <- time.Time{} // the same work: no call
	work <- 8 * mib
	tick <- time.Time{}
	if p := <-set; p != 200 {
		t.Fatalf("percent at 8 MiB %d, want 200", p)
	}
	// A second Run returns at once without setting anything.
	Run(t.Context(), nil, 16*mib, read, func(p int) int { t.Errorf("second Run set %d", p); return 0 })
	cancel()
	<-done
	if p := <-set; p != 100 {
		t.Fatalf("percent after stop %d, want the default", p)
	}
	if len(set) != 0 {
		t.Fatalf("unexpected calls: %d more", len(set))
	}
}

// TestStartSetsTheRuntime runs Start in this process and reads the
// runtime's own percent: Percent of what the collector last scanned, and
// 100 again once stopped.
func TestStartSetsTheRuntime(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	runtime.GC()
	ctx, cancel := context.WithCancel(t.Context())
	var seen uint64
	work := func() uint64 { seen = Work(); return seen }
	applied := make(chan int, 2)
	set := func(p int) int { prev := debug.SetGCPercent(p); applied <- p; return prev }
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, nil, 64<<20, work, set)
	}()
	p := <-applied // seen is written before set is called
	if want := Percent(seen, 64<<20); p != want || want <= 100 {
		t.Fatalf("Run set %d, want %d (above 100 for a test's small heap)", p, want)
	}
	if got := gogc(); got != p {
		t.Fatalf("runtime's percent %d, want %d", got, p)
	}
	cancel()
	<-done
	if got := gogc(); got != 100 {
		t.Fatalf("runtime's percent after stop %d, want 100", got)
	}
}

func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestWorkFigures: the figures Work reads exist in this Go's runtime/metrics
// (a later Go renaming one fails here, not silently as the default's
// pacing), and a test's heap reads as some, not all, of memory.
func TestWorkFigures(t *testing.T) {
	known := map[string]bool{}
	for _, d := range metrics.All() {
		known[d.Name] = d.Kind == metrics.KindUint64
	}
	for _, name := range workSamples {
		if !known[name] {
			t.Errorf("runtime/metrics has no uint64 %s", name)
		}
	}
	runtime.GC()
	if w := Work(); w == 0 || w == math.MaxUint64 {
		t.Errorf("Work() = %d, want a test's heap", w)
	}
}

package filter

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWorkersOnePerThread: every thread id gets one worker, built once,
// however many goroutines ask at once.
func TestWorkersOnePerThread(t *testing.T) {
	var ws workers
	var builds atomic.Int32
	build := func() (*worker, error) { builds.Add(1); return &worker{}, nil }
	const threads, askers = 4, 16
	got := make([][threads]*worker, askers)
	var wg sync.WaitGroup
	for a := range askers {
		wg.Go(func() {
			for tid := range threads {
				w, err := ws.get(100+tid, build)
				if err != nil {
					t.Error(err)
				}
				got[a][tid] = w
			}
		})
	}
	wg.Wait()
	if n := builds.Load(); n != threads {
		t.Fatalf("%d workers built for %d threads", n, threads)
	}
	for a := range askers {
		for tid := range threads {
			if got[a][tid] != got[0][tid] {
				t.Fatalf("thread %d got two workers", tid)
			}
			for other := range tid {
				if got[a][tid] == got[a][other] {
					t.Fatalf("threads %d and %d share a worker", tid, other)
				}
			}
		}
	}
	n := 0
	ws.each(func(*worker) { n++ })
	if n != threads {
		t.Fatalf("each visited %d workers, want %d", n, threads)
	}
}

// TestWorkerLockReentrant: a callback Envoy makes from inside one of ours
// on the worker's thread re-enters without deadlock and keeps the lock for
// the outer callback; the main thread waits until the worker lets go.
func TestWorkerLockReentrant(t *testing.T) {
	w := &worker{}
	h1 := w.enter()
	h2 := w.enter() // would deadlock with a plain mutex
	if !h2.nested {
		t.Fatal("the nested callback took the lock again")
	}
	w.exit(h2)
	if w.owner.Load() != ownedByWorker {
		t.Fatal("the nested callback's exit let go of the outer callback's lock")
	}
	entered := make(chan struct{})
	go func() {
		w.enterMain()
		close(entered)
		w.exitMain()
	}()
	select {
	case <-entered:
		t.Fatal("the main thread entered while the worker held its lock")
	case <-time.After(20 * time.Millisecond): // bounded: only proves the wait
	}
	w.exit(h1)
	<-entered
	if w.owner.Load() != ownedByNone {
		t.Fatalf("after both let go: owner %d", w.owner.Load())
	}
}

// TestWorkerKeepsItsP: a worker's thread whose callbacks keep coming
// yields its P to the Go scheduler once per keepPEvery and no more often,
// so that the P's schedule tick moves and the runtime's monitor does not
// take the P back between callbacks and poll every 20 µs (keepP). A
// nested callback never yields, nor does the main thread.
func TestWorkerKeepsItsP(t *testing.T) {
	var now time.Duration
	yields := 0
	defer swapPClock(func() time.Duration { return now }, func() { yields++ })()
	w := &worker{}
	step := keepPEvery / 10
	calls := 0
	for now = keepPEvery; now < 11*keepPEvery; now += step {
		h1 := w.enter()
		w.exit(w.enter()) // nested
		w.exit(h1)
		calls++
		w.enterMain()
		w.exitMain()
	}
	if want := 10; yields != want {
		t.Fatalf("%d callbacks over %v yielded %d times, want %d (one per %v)", calls, 10*keepPEvery, yields, want, keepPEvery)
	}
	// After a pause the first callback yields at once.
	now += 100 * keepPEvery
	w.exit(w.enter())
	if yields != 11 {
		t.Fatalf("the first callback after a pause did not yield (%d yields)", yields)
	}
}

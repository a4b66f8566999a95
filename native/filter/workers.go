package filter

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// workers is one configuration's engine Plugins, one per Envoy thread that
// runs the filter, found by its key (threadKey). Reads (every filter Envoy
// creates) load an immutable map without a lock; a thread seen for the
// first time builds its worker under mu and publishes a new map.
type workers struct {
	m  atomic.Pointer[map[int]*worker]
	mu sync.Mutex
}

// get returns the worker of thread tid, building it with build the first
// time.
func (ws *workers) get(tid int, build func() (*worker, error)) (*worker, error) {
	if m := ws.m.Load(); m != nil {
		if w := (*m)[tid]; w != nil {
			return w, nil
		}
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	old := ws.m.Load()
	var n int
	if old != nil {
		if w := (*old)[tid]; w != nil {
			return w, nil
		}
		n = len(*old)
	}
	w, err := build()
	if err != nil {
		return nil, err
	}
	next := make(map[int]*worker, n+1)
	if old != nil {
		for k, v := range *old {
			next[k] = v
		}
	}
	next[tid] = w
	ws.m.Store(&next)
	return w, nil
}

// each calls f with every worker.
func (ws *workers) each(f func(*worker)) {
	if m := ws.m.Load(); m != nil {
		for _, w := range *m {
			f(w)
		}
	}
}

// worker is the engine Plugin of one Envoy thread, with the lock held
// during every call into it: the engine's contract is one thread at a time.
// Its own thread takes it for filter callbacks and the answers of requests'
// callouts; Envoy's main thread takes it to deliver the answers of the
// Plugin's callouts and for the tick. A worker only ever takes its own
// lock, so no worker waits on another.
//
// The lock is reentrant for the worker's own thread only: Envoy may call a
// filter callback from inside one of ours (resuming a request can run its
// response at once, as a local reply of a later filter does), and a
// sync.Mutex would deadlock there. Only the worker's thread sets
// owner to ownedByWorker, so reading that value means this thread holds the
// lock.
type worker struct {
	mu    sync.Mutex
	owner atomic.Uint32
	// e is the engine, replaced by a new one after a panic (the buckets
	// live in the Store, so they survive).
	e engine.App
	// free holds filters whose stream is done, for reuse.
	free []*httpFilter
	// lastYield is when the worker's thread last yielded its P (keepP);
	// only that thread reads and writes it.
	lastYield time.Duration
}

const (
	ownedByNone uint32 = iota
	ownedByWorker
	ownedByMain
)

// hold is what enter returns for exit: whether the callback is nested in
// another of the same thread (which keeps the lock).
type hold struct{ nested bool }

// enter takes the worker for a callback on its own thread.
func (w *worker) enter() hold {
	if w.owner.Load() == ownedByWorker {
		return hold{nested: true}
	}
	w.mu.Lock()
	w.owner.Store(ownedByWorker)
	return hold{}
}

// exit ends what enter began, and keeps the thread's P (keepP).
func (w *worker) exit(h hold) {
	if !h.nested {
		w.owner.Store(ownedByNone)
		w.mu.Unlock()
		w.keepP()
	}
}

// enterMain takes the worker on Envoy's main thread.
func (w *worker) enterMain() {
	w.mu.Lock()
	w.owner.Store(ownedByMain)
}

func (w *worker) exitMain() {
	w.owner.Store(ownedByNone)
	w.mu.Unlock()
}

// Keeping the worker's P. An Envoy thread that calls the module holds a P
// between callbacks (the runtime counts it as in a system call), and no
// goroutine is ever scheduled on that P: callbacks run on the thread's own
// goroutine, outside the scheduler. The runtime's monitor (sysmon) takes
// a P whose schedule tick has not moved for 10 ms as it would preempt a
// goroutine running that long, and every P it takes resets its polling
// to every 20 µs. The thread then gets an idle P at its next callback, one
// whose tick has not moved either, which the monitor takes at once again:
// while requests flow, the monitor never slows down, and each of its
// wake-ups is a context switch on Envoy's CPU, whatever the request rate.
// A busy worker amortises those wake-ups over many requests; at ordinary
// load they cost more than the filter (docs/benchmarks/ordinary.md). So a
// worker's thread yields its P to the scheduler at the end of a callback
// once per keepPEvery (keepP), which moves the tick: the goroutine is
// scheduled again on the same thread through the runtime's locked-thread
// hand-off, a few µs that many times a second at most, and never when no
// request comes.
const keepPEvery = 5 * time.Millisecond

// monotonic and yieldP are keepP's clock and yield (tests swap them).
var (
	monotonicStart = time.Now()
	monotonic      = func() time.Duration { return time.Since(monotonicStart) }
	yieldP         = runtime.Gosched
)

// swapPClock replaces keepP's clock and yield, and returns what restores
// them. For tests.
func swapPClock(now func() time.Duration, yield func()) (restore func()) {
	oldNow, oldYield := monotonic, yieldP
	monotonic, yieldP = now, yield
	return func() { monotonic, yieldP = oldNow, oldYield }
}

// keepP yields the calling thread's P when keepPEvery has passed since
// the last yield. Only the worker's own thread calls it, outside the
// worker's lock (exit).
func (w *worker) keepP() {
	now := monotonic()
	if now-w.lastYield < keepPEvery && w.lastYield != 0 {
		return
	}
	w.lastYield = now
	yieldP()
}

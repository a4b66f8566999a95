package filter

import (
	"os"
	"runtime"
	"sync"
)

// The Go runtime's Ps. Every Envoy thread that calls the module needs a P
// for the length of each callback, and between callbacks it keeps its P as
// a thread "in a system call" as long as another P is idle; when none is,
// Go's monitor takes the P back and the next callback gets one through the
// scheduler's slow path, under its global lock. With fewer Ps than threads
// the workers wait on each other there (make bench's configurations 16 and
// 17 measure four workers against one). So the module gives the runtime a P for every
// Envoy thread that has run a filter, one for the main thread and one to
// spare (threadSeen), and at least minProcs from the start: with Envoy
// confined to one CPU (taskset, a container's CPU set) the runtime would
// take GOMAXPROCS=1. Idle Ps cost nothing. A GOMAXPROCS in Envoy's
// environment is left as it is.
const (
	minProcs   = 2
	spareProcs = 2 // the main thread's, and one idle
)

// threads are the Envoy threads seen running a filter, by threadKey.
var threads struct {
	sync.Mutex
	seen map[int]bool
}

// threadSeen records that thread key runs filters and raises GOMAXPROCS
// to a P per such thread plus spareProcs.
func threadSeen(key int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	threads.Lock()
	defer threads.Unlock()
	if threads.seen[key] {
		return
	}
	if threads.seen == nil {
		threads.seen = map[int]bool{}
	}
	threads.seen[key] = true
	if want := len(threads.seen) + spareProcs; runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}

var tuneOnce sync.Once

// tuneRuntime sets up the Go runtime once, when the first configuration
// loads.
func tuneRuntime() {
	tuneOnce.Do(func() {
		if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < minProcs {
			runtime.GOMAXPROCS(minProcs)
		}
	})
}

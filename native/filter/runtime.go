package filter

import (
	"os"
	"runtime"
	"sync"
)

// minProcs is the fewest Ps the module gives the Go runtime. With Envoy
// confined to one CPU (taskset, a container's CPU set) the runtime would
// take GOMAXPROCS=1: then Envoy's thread holds the only P during a callback
// while the runtime's own work (the collector's background marking,
// sysmon's hand-offs) waits for it, and each request pays for that. Two Ps
// let that work run beside the callback (docs/native.md has the
// measurement). A GOMAXPROCS in Envoy's environment is left as it is.
const minProcs = 2

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

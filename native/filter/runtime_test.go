package filter

import (
	"runtime"
	"testing"
)

// TestThreadsGetTheirPs: four Envoy threads running filters leave the Go
// runtime a P each, one for the main thread and one idle, so no worker
// waits for another's P; a thread seen again changes nothing.
func TestThreadsGetTheirPs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	threads.Lock()
	threads.seen = nil
	threads.Unlock()
	for _, key := range []int{0, 1, 2, 3, 2, 0} {
		threadSeen(key)
	}
	if got := runtime.GOMAXPROCS(0); got != 4+spareProcs {
		t.Errorf("GOMAXPROCS %d after 4 threads, want %d", got, 4+spareProcs)
	}
}

package filter

import (
	"runtime"
	"testing"
)

// TestTickEachConfiguration: two configurations in one process each show
// the process's memory in their own gauges (Envoy keeps a configuration's
// metrics apart): what one configuration reported does not hide it from
// the other, which would show only the change since.
func TestTickEachConfiguration(t *testing.T) {
	ch1, c1 := newConfig(t, demoConfig)
	ch2, c2 := newConfig(t, demoConfig)
	remaining(t, c1, "one")
	remaining(t, c2, "two")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c1.tick()
	c2.tick()
	for i, ch := range []*configHandle{ch1, ch2} {
		if n := ch.gauge(ch.id(Name + ".memory.heap_bytes")); n < int64(ms.HeapAlloc/2) {
			t.Errorf("configuration %d: %s.memory.heap_bytes = %d after its tick, want the heap's size (%d before the ticks)", i+1, Name, n, ms.HeapAlloc)
		}
	}
}

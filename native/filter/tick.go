package filter

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"time"
)

// The tick. The engine has work to do once a second for each worker's
// Plugin of each configuration (engine.Plugin.Tick): report the Go
// runtime's memory figures (the tokenbucket.memory.* metrics) and hand back
// expired leases. Envoy keeps a replaced configuration while its
// connections drain (up to --drain-time-s, 600 s by default), so after
// many listener updates a process holds hundreds of configurations. One
// ticker serves them all: a goroutine that exists while at least one
// configuration is live asks Envoy's main thread, once a second, through
// the scheduler of one live configuration, to tick every live
// configuration's workers, after one read of the memory figures.

// tickable is what the ticker needs of a configuration (*filterConfig):
// schedule runs a function on Envoy's main thread (an error: the
// configuration is gone and will not run it); tick runs the engine's tick
// of each of its workers there.
type tickable interface {
	schedule(func()) error
	tick(ms *runtime.MemStats)
}

// ticker is the process's one ticker. Configurations register when Envoy
// accepts them and unregister when Envoy destroys them; a goroutine waits
// for the clock's ticks while any is registered, and ends with the last.
// Safe for concurrent use.
type ticker struct {
	// clock starts a source of ticks: their channel and what stops it.
	clock func() (<-chan time.Time, func())

	mu   sync.Mutex
	live []tickable // in the order they registered
	// stop ends the goroutine; nil when none runs.
	stop chan struct{}
	// via is the configuration whose scheduler carries the tick asked for
	// and not yet run; nil when none waits. One tick waits at a time, so
	// a busy main thread never finds a queue of them. A tick whose
	// configuration is destroyed before it runs may never run (Envoy holds
	// a scheduler's work only while its configuration lives), so
	// unregister clears via and the next tick is asked for.
	via tickable
}

// processTicker is the ticker of every configuration in this process.
var processTicker = &ticker{clock: everySecond}

// everySecond is the production clock.
func everySecond() (<-chan time.Time, func()) {
	t := time.NewTicker(time.Second)
	return t.C, t.Stop
}

// register adds c to the configurations ticked, starting the goroutine if
// none runs.
func (tk *ticker) register(c tickable) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.live = append(tk.live, c)
	if tk.stop == nil {
		tk.stop = make(chan struct{})
		ticks, stop := tk.clock()
		go tk.run(ticks, stop, tk.stop)
	}
}

// unregister removes c; the goroutine ends with the last configuration.
func (tk *ticker) unregister(c tickable) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if i := slices.Index(tk.live, c); i >= 0 {
		tk.live = slices.Delete(tk.live, i, i+1)
	}
	if tk.via == c {
		tk.via = nil
	}
	if len(tk.live) == 0 && tk.stop != nil {
		close(tk.stop)
		tk.stop = nil
	}
}

// run asks for a tick at each of the clock's ticks until done is closed.
func (tk *ticker) run(ticks <-chan time.Time, stopClock func(), done chan struct{}) {
	defer stopClock()
	for {
		select {
		case <-done:
			return
		case <-ticks:
			tk.ask()
		}
	}
}

// ask schedules a tick on the main thread through the newest live
// configuration (the one Envoy will keep longest), unless one waits.
func (tk *ticker) ask() {
	tk.mu.Lock()
	if tk.via != nil || len(tk.live) == 0 {
		tk.mu.Unlock()
		return
	}
	via := tk.live[len(tk.live)-1]
	tk.via = via
	tk.mu.Unlock()
	if via.schedule(tk.tick) != nil {
		tk.mu.Lock()
		if tk.via == via {
			tk.via = nil
		}
		tk.mu.Unlock()
	}
}

// tick reads the memory figures once and ticks every live configuration,
// on the main thread. A configuration destroyed after the list is copied
// is skipped (filterConfig.tick).
func (tk *ticker) tick() {
	tk.mu.Lock()
	tk.via = nil
	live := slices.Clone(tk.live)
	tk.mu.Unlock()
	var ms runtime.MemStats
	readMemory(&ms)
	for _, c := range live {
		c.tick(&ms)
	}
}

// memorySamples are the runtime/metrics names of the three figures the
// engine's tick reads of runtime.MemStats: HeapAlloc, Sys and NumGC. Read
// only on Envoy's main thread (in the tick), one Read at a time.
var memorySamples = []rtmetrics.Sample{
	{Name: "/memory/classes/heap/objects:bytes"}, // HeapAlloc
	{Name: "/memory/classes/total:bytes"},        // Sys
	{Name: "/gc/cycles/total:gc-cycles"},         // NumGC
}

// readMemory fills the HeapAlloc, Sys and NumGC of ms, the only fields
// engine.Plugin.Tick reads, from runtime/metrics. Unlike
// runtime.ReadMemStats it does not stop the world: every Envoy thread
// inside a filter callback holds one of the runtime's Ps, and a
// stop-the-world waits for all of them. A figure the runtime does not know
// (a later Go renaming it; TestReadMemory) reads as 0.
func readMemory(ms *runtime.MemStats) {
	rtmetrics.Read(memorySamples)
	u := func(i int) uint64 {
		if v := memorySamples[i].Value; v.Kind() == rtmetrics.KindUint64 {
			return v.Uint64()
		}
		return 0
	}
	ms.HeapAlloc, ms.Sys, ms.NumGC = u(0), u(1), uint32(u(2))
}

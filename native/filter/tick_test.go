package filter

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"time"
)

// fakeClock is a ticker's clock whose ticks the test sends; it records the
// sources started and stopped.
type fakeClock struct {
	ticks   chan time.Time
	started int
	stopped chan struct{} // one value per source stopped
}

func newFakeClock() *fakeClock {
	return &fakeClock{ticks: make(chan time.Time), stopped: make(chan struct{}, 10)}
}

func (fc *fakeClock) start() (<-chan time.Time, func()) {
	fc.started++
	return fc.ticks, func() { fc.stopped <- struct{}{} }
}

// fakeConfig is a configuration as the ticker sees it: its schedule hands
// the function to the test's main thread (main), and refuses once it is
// destroyed, as filterConfig.schedule does.
type fakeConfig struct {
	name      string
	main      chan func()
	destroyed bool
	ticks     int
	heap      uint64 // HeapAlloc of the last tick
}

func (c *fakeConfig) schedule(f func()) error {
	if c.destroyed {
		return errStopped
	}
	c.main <- f
	return nil
}

func (c *fakeConfig) tick(ms *runtime.MemStats) { c.ticks++; c.heap = ms.HeapAlloc }

// TestOneTickerForTheProcess: configurations come and go; one goroutine
// ticks them all while any lives, asking the main thread once per tick of
// its clock (the time is the test's), and the tick runs each live
// configuration's duties once and none of a destroyed one. Before, every
// configuration had a goroutine and a main-thread dispatch of its own.
func TestOneTickerForTheProcess(t *testing.T) {
	clock := newFakeClock()
	tk := &ticker{clock: clock.start}
	main := make(chan func(), 10) // what waits for Envoy's main thread
	cfg := func(name string) *fakeConfig { return &fakeConfig{name: name, main: main} }
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// tickAt sends the clock's tick and runs what it asked of the main thread.
	tickAt := func(s int) {
		t.Helper()
		clock.ticks <- at(s)
		select {
		case f := <-main:
			f()
		case <-time.After(time.Minute):
			t.Fatalf("tick at %v: nothing was scheduled on the main thread", at(s))
		}
	}
	want := func(step string, counts map[*fakeConfig]int) {
		t.Helper()
		for c, n := range counts {
			if c.ticks != n {
				t.Errorf("%s: %s ticked %d times, want %d", step, c.name, c.ticks, n)
			}
		}
	}

	a, b, c := cfg("a"), cfg("b"), cfg("c")
	for _, x := range []*fakeConfig{a, b, c} {
		tk.register(x)
	}
	if clock.started != 1 {
		t.Fatalf("three configurations started %d tickers, want 1", clock.started)
	}
	tickAt(1)
	want("every configuration live", map[*fakeConfig]int{a: 1, b: 1, c: 1})
	if a.heap == 0 {
		t.Error("the tick gave no memory figures (HeapAlloc 0)")
	}

	b.destroyed = true
	tk.unregister(b)
	tickAt(2)
	want("b destroyed", map[*fakeConfig]int{a: 2, b: 1, c: 2})

	// c carries the next tick (the newest); destroyed before it runs, Envoy
	// drops it. The tick after asks through a.
	clock.ticks <- at(3)
	dropped := <-main
	c.destroyed = true
	tk.unregister(c)
	_ = dropped // never run: Envoy drops the work of a destroyed configuration
	tickAt(4)
	want("c destroyed with its tick waiting", map[*fakeConfig]int{a: 3, b: 1, c: 2})

	d := cfg("d")
	tk.register(d)
	tickAt(5)
	want("d registered", map[*fakeConfig]int{a: 4, b: 1, c: 2, d: 1})
	if clock.started != 1 {
		t.Fatalf("%d tickers started, want still 1", clock.started)
	}

	// The last configuration gone, the goroutine and its clock stop.
	tk.unregister(a)
	tk.unregister(d)
	select {
	case <-clock.stopped:
	case <-time.After(time.Minute):
		t.Fatal("the ticker still runs with no configuration")
	}
	if len(tk.live) != 0 || tk.stop != nil || tk.via != nil {
		t.Fatalf("after the last configuration: live %d, stop %v, via %v, want nothing", len(tk.live), tk.stop, tk.via)
	}
	e := cfg("e")
	tk.register(e)
	if clock.started != 2 {
		t.Fatalf("a configuration after none: %d tickers started in all, want 2", clock.started)
	}
	tickAt(6)
	want("e after none", map[*fakeConfig]int{a: 4, d: 1, e: 1})
	tk.unregister(e)
	<-clock.stopped
}

// TestTickWaitsForTheMainThread: while one tick waits for the main thread,
// the clock's next ticks ask for none more, so a busy main thread never
// finds a queue of them; once it has run, the next tick asks again.
func TestTickWaitsForTheMainThread(t *testing.T) {
	tk := &ticker{clock: func() (<-chan time.Time, func()) { return nil, func() {} }}
	main := make(chan func(), 10)
	a := &fakeConfig{name: "a", main: main}
	tk.register(a)
	defer tk.unregister(a)
	for range 3 {
		tk.ask() // what run does at each tick of the clock
	}
	if len(main) != 1 {
		t.Fatalf("three ticks with the main thread busy asked it %d times, want 1", len(main))
	}
	(<-main)()
	tk.ask()
	if len(main) != 1 || a.ticks != 1 {
		t.Fatalf("after the main thread ran the tick: %d asked, %d ticks, want 1 and 1", len(main), a.ticks)
	}
}

// TestConfigurationsRegister: a configuration Envoy accepts is ticked by the
// process's ticker until Envoy destroys it; one Envoy refuses never is.
func TestConfigurationsRegister(t *testing.T) {
	n := func() int {
		processTicker.mu.Lock()
		defer processTicker.mu.Unlock()
		return len(processTicker.live)
	}
	before := n()
	_, c1 := newConfig(t, demoConfig)
	_, c2 := newConfig(t, demoConfig)
	if got := n(); got != before+2 {
		t.Fatalf("two configurations: %d live, want %d", got, before+2)
	}
	t.Setenv("GODEBUG", "cgocheck=0")
	if _, err := (ConfigFactory{metricsFor: sinkOf}).Create(&configHandle{}, []byte(`{"rules": [`)); err == nil {
		t.Fatal("a broken configuration was accepted")
	}
	if got := n(); got != before+2 {
		t.Fatalf("after a refused configuration: %d live, want %d", got, before+2)
	}
	c1.OnDestroy()
	c2.OnDestroy()
	if got := n(); got != before {
		t.Fatalf("both destroyed: %d live, want %d", got, before)
	}
}

// TestReadMemory: the three figures the tick reports exist in this Go's
// runtime/metrics (a later Go renaming one fails here, not silently in
// /stats) and are plausible.
func TestReadMemory(t *testing.T) {
	var ms runtime.MemStats
	readMemory(&ms)
	for _, s := range memorySamples {
		if s.Value.Kind() != rtmetrics.KindUint64 {
			t.Errorf("%s: kind %v, want a uint64", s.Name, s.Value.Kind())
		}
	}
	if ms.HeapAlloc == 0 || ms.Sys < ms.HeapAlloc {
		t.Errorf("HeapAlloc %d, Sys %d: want 0 < HeapAlloc <= Sys", ms.HeapAlloc, ms.Sys)
	}
	runtime.GC()
	gc := ms.NumGC
	readMemory(&ms)
	if ms.NumGC <= gc {
		t.Errorf("NumGC %d after a collection, want more than %d", ms.NumGC, gc)
	}
}

// TestConfigurationsShareOneTicker: many live configurations (Envoy keeps
// replaced ones while they drain) add no goroutine each. Before, each
// configuration ran a ticker goroutine of its own.
func TestConfigurationsShareOneTicker(t *testing.T) {
	const configs = 100
	before := runtime.NumGoroutine()
	for range configs {
		newConfig(t, demoConfig) // destroyed at the test's end
	}
	if grew := runtime.NumGoroutine() - before; grew > configs/10 {
		t.Fatalf("%d live configurations added %d goroutines, want at most %d", configs, grew, configs/10)
	}
}

// TestDestroyedConfigurationNotTicked: a configuration Envoy destroyed
// during a tick (the tick runs through another configuration's scheduler)
// is not ticked after its OnDestroy: its engines would count into metrics
// Envoy has freed.
func TestDestroyedConfigurationNotTicked(t *testing.T) {
	ch, c := newConfig(t, demoConfig)
	remaining(t, c, "destroyed") // a worker, so that there is a Plugin to tick
	heap := ch.id(Name + ".memory.heap_bytes")
	// Figures no tick reported before: each tick that runs moves the gauge.
	ms := runtime.MemStats{HeapAlloc: 1 << 40}
	c.tick(&ms)
	before := ch.gauge(heap)
	if before == 0 {
		t.Fatal("a live configuration's tick reported nothing")
	}
	c.OnDestroy()
	ms.HeapAlloc = 1<<40 + 1<<20
	c.tick(&ms)
	if got := ch.gauge(heap); got != before {
		t.Fatalf("a destroyed configuration was ticked: heap gauge %d, want %d as before OnDestroy", got, before)
	}
}

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
	readMemory(&ms)
	c1.tick(&ms)
	c2.tick(&ms)
	for i, ch := range []*configHandle{ch1, ch2} {
		if n := ch.gauge(ch.id(Name + ".memory.heap_bytes")); n < int64(ms.HeapAlloc/2) {
			t.Errorf("configuration %d: %s.memory.heap_bytes = %d after its tick, want the heap's size (%d before the ticks)", i+1, Name, n, ms.HeapAlloc)
		}
	}
}

package e2e

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// memoryConfig bounds the table to 20 000 buckets (5 000 shared-data keys)
// and has three rules, each keyed by x-api-key:
//   - steady (/steady): 20 tokens, 0.5/s. Steady clients drain it every
//     round, so their buckets are far from full (full again 40 s later).
//   - flood (/flood): 1000 tokens, 1000/s. One request leaves a bucket that
//     is full again 1 ms later: its slot is reclaimed, never evicted.
//   - hold (/hold): 1 token, 0.1/s. One request leaves a bucket that is full
//     again 10 s later, sooner than any steady bucket: enough distinct keys
//     fill the table with buckets that are not full, and the store must
//     evict, choosing the closest to full (a hold bucket, never a steady one).
const memoryConfig = `{"max_keys": 20000, "rules": [
 {"name": "steady", "match": {"path": {"prefix": "/steady"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.5, "burst": 20}},
 {"name": "flood", "match": {"path": {"prefix": "/flood"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
 {"name": "hold", "match": {"path": {"prefix": "/hold"}}, "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.1, "burst": 1}}]}`

const (
	// memoryMaxKeys is memoryConfig's max_keys.
	memoryMaxKeys = 20000
	// defaultFloodKeys is the flood's distinct keys in a normal run: three
	// times the table's keys, so the second half of the flood, where the
	// trend is read, is all past the table (about 35 s a build on 2 busy
	// cores; the whole test takes about 2 minutes); E2E_FLOOD_KEYS overrides
	// it (`make bench-memory` floods up to a million).
	defaultFloodKeys = 3 * memoryMaxKeys
	maxFloodKeys     = 10_000_000
	// holdKeys is twice the table's slots: the table fills with buckets
	// that are not full.
	holdKeys = 2 * memoryMaxKeys
	// floodWorkers is the flood's concurrency (keep-alive connections).
	floodWorkers = 16
	// roundEvery is the number of flood requests between two rounds of the
	// steady clients (and two memory samples).
	roundEvery = 5000

	steadyCount = 50
	steadyBurst = 20
	steadyRate  = 0.5
	// steadyFullAfter is how long a drained steady bucket takes to refill:
	// between two rounds it must not refill to full, or refill is lost and
	// the lower bound of the exactness check does not hold.
	steadyFullAfter = steadyBurst / steadyRate * time.Second
	// steadyPerRound bounds each client's requests in one round: enough to
	// drain a full bucket and see a rejection.
	steadyPerRound = steadyBurst + 3

	// perKeyBytes is a low estimate of what Envoy keeps for one shared-data
	// key with a 16-byte value (`make bench-memory` measured about 90 bytes
	// with short keys): what one-key-per-client storage would add.
	perKeyBytes = 80
	// groupBytes is a high estimate of what Envoy keeps for one key of the
	// table (4 buckets; `make bench-memory` measured 270-320 bytes), and
	// allocSlack what its allocator may hold for requests in flight: the
	// table may add at most memoryMaxKeys/4 × groupBytes + allocSlack.
	groupBytes = 400
	allocSlack = 4 << 20
	// maxVMSys is the plugin's memory limit for one VM's Go runtime
	// (plugin.gcMemoryLimit): memory.sys_bytes stays under it.
	maxVMSys = 64 << 20
	// warmupRequests cycle over warmupKeys flood keys before the first
	// sample, so V8 has compiled the request path by then.
	warmupRequests = 5000
	warmupKeys     = 100
)

// TestMemoryBound floods Envoy with distinct keys while 50 steady clients
// spend their buckets at a controlled pace. Envoy's resident memory must
// level off once the table's keys exist (the bound max_keys implies) instead
// of growing with the keys; the steady clients must see exact limits
// throughout (no fresh burst from an eviction); the store must evict only
// when the table is full of buckets that are not full, and then never a
// steady client's.
//
// Alone: it measures Envoy's resident memory under a key flood, which any
// other process's load would disturb.
func TestMemoryBound(t *testing.T) {
	forEachBuild(t, testMemoryBound)
}

func testMemoryBound(t *testing.T, build envoytest.Build) {
	floodKeys := floodKeysFromEnv(t)
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	e := envoytest.Start(t, envoytest.Options{Build: build,
		Config: envoytest.DemoConfigYAML, PluginConfig: memoryConfig,
		UpstreamPort: up.Port(), Concurrency: 2,
	})
	c := e.Client()
	t.Cleanup(c.Close)
	stat := func(name string) uint64 { return e.PluginStat("tokenbucket." + name) }

	steady := newSteadyClients(steadyCount)
	// Warm up: the steady clients' first round creates their buckets;
	// requests cycling over a few keys run the request path until V8 has
	// compiled it, so its code is in the "before" sample.
	steady.round(t, c)
	warm := runFlood(c, "/flood", "warm-", warmupRequests, warmupKeys)
	<-warm.over
	if err := warm.err(); err != nil {
		t.Fatal(err)
	}
	before := sampleMemory(t, e, 0)
	sysBefore := stat("memory.sys_bytes")

	// Phase 1: the flood. Its buckets are full again 1 ms after their one
	// request, so their slots are reclaimed and nothing is evicted.
	flood := runFlood(c, "/flood", "flood-", floodKeys, 0)
	samples := paceSteady(t, e, c, flood, steady)
	if err := flood.err(); err != nil {
		t.Fatal(err)
	}
	end := sampleMemory(t, e, floodKeys)
	sysEnd := stat("memory.sys_bytes")
	mid := samples.at(floodKeys / 2)
	t.Logf("flood: %d distinct keys in %v (%.0f req/s); Envoy RSS / allocated: before %s, at %d keys %s, at %d keys %s",
		floodKeys, flood.elapsed, float64(floodKeys)/flood.elapsed.Seconds(),
		before, mid.keys, mid, floodKeys, end)
	t.Logf("samples (thousand keys: RSS/allocated MiB): %s", samples)
	t.Logf("the Go runtime of one worker's VM holds %.1f MiB before, %.1f MiB after (in Envoy's RSS, not allocated)",
		mib(sysBefore), mib(sysEnd))
	// Levels off: between half and all of the flood, what Envoy's
	// allocator holds (shared data: the table) grows by a small fraction
	// of what one key per client would add. Read as the trend of every
	// sample of that half (envoytest.Trend), not as two readings. Resident
	// memory is logged, not bounded: it also holds the VMs' Go heaps, which
	// grow toward their own limit whatever the keys (checked next).
	perKey := int64(floodKeys-mid.keys) * perKeyBytes
	var xs, ys []float64
	for _, x := range append(samples, end) {
		if x.keys >= mid.keys {
			xs, ys = append(xs, float64(x.keys)), append(ys, float64(x.alloc))
		}
	}
	trend, err := envoytest.Trend(xs, ys)
	if err != nil {
		t.Fatalf("allocated memory between %d and %d flood keys: %v", mid.keys, floodKeys, err)
	}
	if g := trend * float64(floodKeys-mid.keys); g > float64(perKey/4) {
		t.Errorf("allocated memory grew by %.1f bytes a key (%.2f MiB, the trend of %d samples) between %d and %d flood keys; want under %.2f MiB (a quarter of what one key per client would add)",
			trend, g/(1<<20), len(xs), mid.keys, floodKeys, float64(perKey/4)/(1<<20))
	}
	// The VMs: a worker's Go runtime stays within the plugin's memory
	// limit (64 MiB, plugin.gcMemoryLimit), however many keys passed. (The
	// native module's Go runtime is the process's, paced by GOGC.)
	if build == envoytest.Wasm && sysEnd > maxVMSys {
		t.Errorf("a worker's VM holds %.1f MiB after the flood, more than %d MiB", mib(sysEnd), maxVMSys>>20)
	}
	// At the bound: the whole flood added no more than the table's keys.
	bound := int64(memoryMaxKeys/4*groupBytes + allocSlack)
	if g := int64(end.alloc) - int64(before.alloc); g > bound {
		t.Errorf("allocated memory grew %.2f MiB over the flood; want at most %.2f MiB (%d table keys × %d bytes + %d MiB)",
			float64(g)/(1<<20), float64(bound)/(1<<20), memoryMaxKeys/4, groupBytes, allocSlack>>20)
	}
	if n := stat("rule.flood.allowed"); n != uint64(warmupRequests+floodKeys) {
		t.Errorf("flood allowed %d, want every one of %d", n, warmupRequests+floodKeys)
	}
	if n := stat("evictions"); n != 0 {
		t.Errorf("evictions after the flood = %d, want 0: flood buckets are full 1 ms after their request, so the table always had room", n)
	}
	steady.check(t, "after the flood")

	// Phase 2: hold keys keep their slots for 10 s each; 40 000 of them fill
	// the table's 20 000 slots, so the store evicts, always the bucket
	// closest to full: a hold bucket, never a steady one.
	hold := runFlood(c, "/hold", "hold-", holdKeys, 0)
	paceSteady(t, e, c, hold, steady)
	if err := hold.err(); err != nil {
		t.Fatal(err)
	}
	after := sampleMemory(t, e, holdKeys)
	evictions, retries := stat("evictions"), stat("cas_retries")
	t.Logf("hold: %d keys in %v; evictions %d, CAS retries %d; Envoy RSS / allocated %s",
		holdKeys, hold.elapsed, evictions, retries, after)
	if evictions == 0 || evictions >= holdKeys {
		t.Errorf("evictions after %d hold keys = %d, want some (the table was full of buckets that were not full) and fewer than the hold keys", holdKeys, evictions)
	}
	if n := stat("rule.hold.allowed"); n != holdKeys {
		t.Errorf("hold allowed %d, want %d (each key's one request)", n, holdKeys)
	}
	steady.check(t, "after the hold keys")
	for _, r := range []string{"steady", "flood", "hold"} {
		if n := stat("rule." + r + ".failed_open"); n != 0 {
			t.Errorf("rule %s failed open %d times, want 0", r, n)
		}
	}
	if g := int64(after.alloc) - int64(end.alloc); g > allocSlack {
		t.Errorf("allocated memory grew %.2f MiB over the hold keys; want at most %d MiB: the table's keys exist already",
			float64(g)/(1<<20), allocSlack>>20)
	}
}

func floodKeysFromEnv(t *testing.T) int {
	s := os.Getenv("E2E_FLOOD_KEYS")
	if s == "" {
		return defaultFloodKeys
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 4*roundEvery || n > maxFloodKeys {
		t.Fatalf("E2E_FLOOD_KEYS: want %d..%d, got %q", 4*roundEvery, maxFloodKeys, s)
	}
	return n
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// flood sends one request per distinct key from floodWorkers goroutines.
type flood struct {
	n       int
	done    atomic.Int64 // requests answered
	over    chan struct{}
	elapsed time.Duration // valid once over is closed

	mu     sync.Mutex
	failed error // the first request not answered 200
}

// runFlood starts sending GET path with x-api-key prefix<i> for i in [0, n),
// or prefix<i % cycle> when cycle > 0.
func runFlood(c *envoytest.Client, path, prefix string, n, cycle int) *flood {
	f := &flood{n: n, over: make(chan struct{})}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < floodWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || f.err() != nil {
					return
				}
				key := i
				if cycle > 0 {
					key %= int64(cycle)
				}
				r := c.Get(path, map[string]string{"x-api-key": prefix + strconv.FormatInt(key, 10)})
				if r.Status != 200 {
					f.mu.Lock()
					if f.failed == nil {
						f.failed = fmt.Errorf("%s key %d: %v, want 200", path, i, r)
					}
					f.mu.Unlock()
				}
				f.done.Add(1)
			}
		}()
	}
	go func() {
		wg.Wait()
		f.elapsed = time.Since(start)
		close(f.over)
	}()
	return f
}

func (f *flood) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// memorySample is Envoy's memory after keys requests of a flood: its RSS
// and the bytes its allocator (tcmalloc) has handed out, which include
// shared data but not the allocator's free pages nor the Wasm VMs' memory.
type memorySample struct {
	keys       int
	rss, alloc uint64
}

func (m memorySample) String() string { return fmt.Sprintf("%.1f/%.1f MiB", mib(m.rss), mib(m.alloc)) }

func sampleMemory(t *testing.T, e *envoytest.Envoy, keys int) memorySample {
	t.Helper()
	return memorySample{keys: keys, rss: e.RSS(), alloc: allocated(t, e)}
}

// allocated is what Envoy's allocator has handed out (admin /memory).
func allocated(t *testing.T, e *envoytest.Envoy) uint64 {
	t.Helper()
	m, err := e.Memory()
	if err != nil {
		t.Fatal(err)
	}
	return m.Allocated
}

type memorySamples []memorySample

// at returns the first sample at or after keys.
func (s memorySamples) at(keys int) memorySample {
	for _, x := range s {
		if x.keys >= keys {
			return x
		}
	}
	return s[len(s)-1]
}

func (s memorySamples) String() string {
	var b []byte
	for i, x := range s {
		if i > 0 {
			b = append(b, ' ')
		}
		b = fmt.Appendf(b, "%d:%.1f/%.1f", x.keys/1000, mib(x.rss), mib(x.alloc))
	}
	return string(b)
}

// paceSteady runs a steady round and samples memory every roundEvery requests
// of f, until f is over. It polls f's progress; the flood itself bounds it.
func paceSteady(t *testing.T, e *envoytest.Envoy, c *envoytest.Client, f *flood, steady *steadyGroup) memorySamples {
	t.Helper()
	var samples memorySamples
	next := int64(roundEvery)
	for {
		select {
		case <-f.over:
			steady.round(t, c)
			return append(samples, sampleMemory(t, e, int(f.done.Load())))
		default:
		}
		if d := f.done.Load(); d >= next {
			samples = append(samples, sampleMemory(t, e, int(d)))
			steady.round(t, c)
			next = d + roundEvery
			continue
		}
		time.Sleep(5 * time.Millisecond) // polling the flood's progress
	}
}

// steadyClient is one client that spends its bucket every round.
type steadyClient struct {
	key                string
	admitted, rejected int
	firstSend          time.Time // before the first request was sent
	firstRecv          time.Time // after its response arrived
	lastRecv           time.Time // after the last response arrived
	lastRejectSend     time.Time // before the last rejected request was sent
	err                error
}

type steadyGroup struct {
	clients []*steadyClient
	rounds  int
	last    time.Time // end of the last round
	maxGap  time.Duration
}

func newSteadyClients(n int) *steadyGroup {
	s := &steadyGroup{}
	for i := 0; i < n; i++ {
		s.clients = append(s.clients, &steadyClient{key: "steady-" + strconv.Itoa(i)})
	}
	return s
}

// round lets every client, concurrently, send requests until one is
// rejected (at most steadyPerRound).
func (s *steadyGroup) round(t *testing.T, c *envoytest.Client) {
	t.Helper()
	start := time.Now()
	if !s.last.IsZero() {
		s.maxGap = max(s.maxGap, start.Sub(s.last))
	}
	var wg sync.WaitGroup
	for _, sc := range s.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc.round(c)
		}()
	}
	wg.Wait()
	s.last = time.Now()
	s.rounds++
	for _, sc := range s.clients {
		if sc.err != nil {
			t.Fatalf("steady client %s: %v", sc.key, sc.err)
		}
	}
}

func (sc *steadyClient) round(c *envoytest.Client) {
	for i := 0; i < steadyPerRound; i++ {
		sent := time.Now()
		r := c.Get("/steady", map[string]string{"x-api-key": sc.key})
		recv := time.Now()
		if sc.firstSend.IsZero() {
			sc.firstSend, sc.firstRecv = sent, recv
		}
		sc.lastRecv = recv
		switch r.Status {
		case 200:
			sc.admitted++
		case 429:
			sc.rejected++
			sc.lastRejectSend = sent
			return
		default:
			sc.err = fmt.Errorf("request %d of a round: %v, want 200 or 429", i, r)
			return
		}
	}
}

// check compares each client's admitted requests with its bucket: at most
// burst + rate × (time from its first request to its last response), and,
// since every round drained the bucket before it could refill to full, at
// least burst + rate × (first response to the last rejected request) − 1.
// An evicted bucket would have handed out a fresh burst: 20 more.
func (s *steadyGroup) check(t *testing.T, when string) {
	t.Helper()
	lowerValid := s.maxGap < steadyFullAfter*3/4
	if !lowerValid {
		t.Logf("%s: a pause of %v between steady rounds let buckets refill to full: checking the upper bound only", when, s.maxGap)
	}
	for _, sc := range s.clients {
		upper := int(math.Floor(steadyBurst + steadyRate*sc.lastRecv.Sub(sc.firstSend).Seconds()))
		lower := int(math.Ceil(steadyBurst + steadyRate*sc.lastRejectSend.Sub(sc.firstRecv).Seconds() - 1))
		switch {
		case sc.rejected == 0:
			t.Errorf("%s: steady client %s was never rejected (%d admitted): its bucket was never drained", when, sc.key, sc.admitted)
		case sc.admitted > upper:
			t.Errorf("%s: steady client %s admitted %d, want at most %d (burst %d + %.1f/s over %v): a fresh burst",
				when, sc.key, sc.admitted, upper, steadyBurst, steadyRate, sc.lastRecv.Sub(sc.firstSend).Round(time.Millisecond))
		case lowerValid && sc.admitted < lower:
			t.Errorf("%s: steady client %s admitted %d, want at least %d", when, sc.key, sc.admitted, lower)
		}
	}
	a := s.clients[0]
	t.Logf("%s: %d steady rounds (longest pause %v); client %s admitted %d, rejected %d over %v",
		when, s.rounds, s.maxGap.Round(time.Millisecond), a.key, a.admitted, a.rejected, a.lastRecv.Sub(a.firstSend).Round(time.Millisecond))
}

package service

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// Count implements Store.
func (f failingStore) Count(context.Context, *CountRequest) (CountAnswer, error) {
	return CountAnswer{}, f.err
}

// countSteps is a sequence of Count calls and the counts each answers.
var countSteps = []struct {
	windows []Window
	want    []uint64
}{
	{[]Window{{Key: "w:a_1", Hits: 1, Expiry: 60}}, []uint64{1}},
	{[]Window{{Key: "w:a_1", Hits: 4, Expiry: 60}, {Key: "w:b_1", Hits: 2, Expiry: 1}}, []uint64{5, 2}},
	{[]Window{{Key: "w:a_1", Hits: 0, Expiry: 60}}, []uint64{5}},                                         // 0 reads
	{[]Window{{Key: "w:a_1", Hits: 1, Expiry: 60}, {Key: "w:a_1", Hits: 2, Expiry: 60}}, []uint64{6, 8}}, // one key twice: both count
	{[]Window{{Key: "w:a_2", Hits: MaxWindowHits, Expiry: 60}}, []uint64{MaxWindowHits}},
}

// The memory store and window.lua on a real redis-server count alike:
// increments, reads, a key twice in one call, and an expiry of the window's
// length from the last increment.
func TestCountMemoryAndRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	rs := realStore(t, c, 64) // pipelined; TestCountCluster runs unbatched
	now := time.Unix(1_800_000_000, 0).UnixNano()
	ms := NewMemoryStore(MemoryOptions{Now: func() int64 { return now }})
	for i, step := range countSteps {
		for name, st := range map[string]Store{"redis": rs, "memory": ms} {
			a, err := st.Count(t.Context(), &CountRequest{Windows: step.windows})
			if err != nil {
				t.Fatalf("%s step %d: %v", name, i, err)
			}
			if !slices.Equal(a.Counts, step.want) {
				t.Errorf("%s step %d: counts %v, want %v", name, i, a.Counts, step.want)
			}
		}
	}
	if ttl, err := c.TTL(t.Context(), "w:a_1").Result(); err != nil || ttl <= 55*time.Second || ttl > time.Minute {
		t.Errorf("w:a_1 expires in %v (%v), want about 60s", ttl, err)
	}
	if ttl, err := c.TTL(t.Context(), "w:b_1").Result(); err != nil || ttl > time.Second {
		t.Errorf("w:b_1 expires in %v (%v), want at most 1s", ttl, err)
	}
	// The memory store forgets a counter once it expires.
	now += int64(time.Second)
	if a, err := ms.Count(t.Context(), &CountRequest{Windows: []Window{{Key: "w:b_1", Hits: 1, Expiry: 1}, {Key: "w:a_1", Hits: 0, Expiry: 60}}}); err != nil || !slices.Equal(a.Counts, []uint64{1, 8}) {
		t.Errorf("after a second: %v %v, want [1 8]", a.Counts, err)
	}
}

// A Count call is refused before it reaches the store when a window has no
// key, no expiry or too many hits; the memory store refuses a new counter
// beyond its bound.
func TestCountRefuses(t *testing.T) {
	ms := NewMemoryStore(MemoryOptions{MaxKeys: 2})
	for _, w := range []Window{{Key: "", Hits: 1, Expiry: 1}, {Key: "k", Hits: 1, Expiry: 0}, {Key: "k", Hits: MaxWindowHits + 1, Expiry: 1}} {
		if _, err := ms.Count(t.Context(), &CountRequest{Windows: []Window{w}}); err == nil {
			t.Errorf("%+v accepted", w)
		}
	}
	if _, err := ms.Count(t.Context(), &CountRequest{Windows: []Window{{Key: "a", Hits: 1, Expiry: 60}, {Key: "b", Hits: 1, Expiry: 60}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Count(t.Context(), &CountRequest{Windows: []Window{{Key: "c", Hits: 1, Expiry: 60}}}); err == nil || !strings.Contains(err.Error(), "memory store: full") {
		t.Errorf("a third counter beyond MaxKeys 2: %v", err)
	}
}

// On a Redis Cluster a Count call is one window.lua run per slot: counters
// spread over every primary, each counted once.
func TestCountCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := realClient(t, cl.Addrs()...)
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("client is %T, want a cluster client", c)
	}
	s := realStore(t, c, 0)
	var ws []Window
	for i := range 30 {
		// Keys that differ in their first bytes, so their slots spread.
		ws = append(ws, Window{Key: defaultTag(strconv.Itoa(i)) + "_k_v_1800000000", Hits: uint64(i + 1), Expiry: 60})
	}
	for round := 1; round <= 2; round++ {
		a, err := s.Count(t.Context(), &CountRequest{Windows: ws})
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range a.Counts {
			if n != uint64(round*(i+1)) {
				t.Fatalf("round %d: counter %d = %d, want %d", round, i, n, round*(i+1))
			}
		}
	}
	for _, addr := range cl.Addrs() {
		if n, err := redistest.Do(addr, "DBSIZE"); err != nil || n == "0" {
			t.Errorf("node %s holds %s keys (%v): want counters on every primary", addr, n, err)
		}
	}
}

package service

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// slotStep is one step of a slot timeline: at ms after t0, caller calls op
// ("acquire", "renew", "release") on keys (acquire: "key/max" each, id id)
// or on slots ("key/max/id" each); want is the answer, written
// "true 1 2" (acquired, then in-flight counts) or "held lost ...".
type slotStep struct {
	at     int64
	caller string
	op     string
	id     string
	args   []string
	want   string
}

func acquireReq(id string, ttl int64, keys []string) *wire.AcquireRequest {
	r := &wire.AcquireRequest{ID: id, TTLMs: ttl}
	for _, k := range keys {
		var sk wire.SlotKey
		for i := len(k) - 1; i >= 0; i-- {
			if k[i] == '/' {
				sk.Key = k[:i]
				sk.MaxInFlight, _ = strconv.ParseInt(k[i+1:], 10, 64)
				break
			}
		}
		r.Keys = append(r.Keys, sk)
	}
	return r
}

func slotsReq(ttl int64, slots []string) *wire.SlotsRequest {
	r := &wire.SlotsRequest{TTLMs: ttl}
	for _, s := range slots {
		var sl wire.Slot
		var parts []string
		start := 0
		for i := 0; i <= len(s); i++ {
			if i == len(s) || s[i] == '/' {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
		sl.Key, sl.ID = parts[0], parts[2]
		sl.MaxInFlight, _ = strconv.ParseInt(parts[1], 10, 64)
		r.Slots = append(r.Slots, sl)
	}
	return r
}

// slotCall runs one step on st and returns its answer as a slotStep's want.
func slotCall(st SlotStore, s slotStep, ttl int64) (string, error) {
	ctx := WithCaller(context.Background(), s.caller)
	switch s.op {
	case "acquire":
		a, err := st.Acquire(ctx, acquireReq(s.id, ttl, s.args))
		if err != nil {
			return "", err
		}
		out := strconv.FormatBool(a.Acquired)
		for _, n := range a.InFlight {
			out += " " + strconv.FormatInt(n, 10)
		}
		return out, nil
	case "renew", "release":
		req := slotsReq(ttl, s.args)
		call := st.Renew
		if s.op == "release" {
			req.TTLMs = 0
			call = st.Release
		}
		a, err := call(ctx, req)
		if err != nil {
			return "", err
		}
		out := ""
		for i, x := range a.Slots {
			if i > 0 {
				out += " "
			}
			out += x.String()
		}
		return out, nil
	}
	panic("unknown op " + s.op)
}

// TestSlotsTimeline runs one timeline of slot calls against the Redis store
// (slots.lua on miniredis, its clock set at each step) and the memory store
// (its clock set alike), and requires the same answers of both: at most
// max_in_flight out, a retried acquire takes one slot, release gives back
// once, a caller releases only its own, an acquire over two tables takes
// both or neither, a slot's lease ends at its TTL unless renewed, and a
// renew takes again a slot found gone only while the table has room.
func TestSlotsTimeline(t *testing.T) {
	const ttl = 3000
	steps := []slotStep{
		{0, "gw-a", "acquire", "r1", []string{"k/2"}, "true 1"},
		{0, "gw-a", "acquire", "r1", []string{"k/2"}, "true 1"}, // a retry: no second slot
		{1, "gw-b", "acquire", "r2", []string{"k/2"}, "true 2"},
		{2, "gw-b", "acquire", "r3", []string{"k/2"}, "false 2"},
		{3, "gw-b", "release", "", []string{"k/2/r1"}, "lost"}, // gw-a's, not gw-b's
		{4, "gw-a", "release", "", []string{"k/2/r1"}, "held"},
		{5, "gw-a", "release", "", []string{"k/2/r1"}, "lost"}, // once
		{6, "gw-b", "acquire", "r3", []string{"k/2"}, "true 2"},
		// Atomic over tables: j is full, so k gives nothing either.
		{7, "gw-a", "acquire", "j1", []string{"j/1"}, "true 1"},
		{8, "gw-a", "acquire", "r4", []string{"k2/1", "j/1"}, "false 0 1"},
		{9, "gw-a", "acquire", "r5", []string{"k2/1"}, "true 1"},
		// Another max_in_flight is another table.
		{10, "gw-a", "acquire", "r6", []string{"k/3"}, "true 1"},
		// Leases: r2 renewed at 2000 lives to 5000; r3 ends at 3006.
		{2000, "gw-b", "renew", "", []string{"k/2/r2"}, "held"},
		{3005, "gw-b", "acquire", "r7", []string{"k/2"}, "false 2"},
		{3006, "gw-b", "acquire", "r7", []string{"k/2"}, "true 2"},
		// r3 expired and r7 took its place: renewing r3 finds no room.
		{3007, "gw-b", "renew", "", []string{"k/2/r3", "k/2/r2"}, "lost held"},
		{6006, "gw-b", "renew", "", []string{"k/2/r3"}, "restored"},
		{6007, "gw-b", "acquire", "r8", []string{"k/2"}, "true 2"},
		{6008, "gw-b", "acquire", "r9", []string{"k/2"}, "false 2"},
	}
	m, c, rs := newMini(t, RedisOptions{})
	clk := &fakeClock{}
	ms := NewMemoryStore(MemoryOptions{Now: clk.Now})
	for i, s := range steps {
		at := t0.Add(time.Duration(s.at) * time.Millisecond)
		m.SetTime(at)
		clk.Set(at)
		for name, st := range map[string]SlotStore{"redis": rs, "memory": ms} {
			got, err := slotCall(st, s, ttl)
			if err != nil || got != s.want {
				t.Fatalf("step %d (%s at %dms %s %s %v): %s = %q, %v; want %q", i, s.caller, s.at, s.op, s.id, s.args, name, got, err, s.want)
			}
		}
	}
	// Nothing left once every slot is released or expired.
	at := t0.Add(20 * time.Second)
	m.SetTime(at)
	clk.Set(at)
	for _, s := range []slotStep{
		{op: "release", caller: "gw-b", args: []string{"k/2/r3", "k/2/r8", "j/1/j1"}, want: "lost lost lost"},
	} {
		for name, st := range map[string]SlotStore{"redis": rs, "memory": ms} {
			if got, err := slotCall(st, s, ttl); err != nil || got != s.want {
				t.Fatalf("%s: %q, %v; want %q", name, got, err, s.want)
			}
		}
	}
	m.FastForward(20 * time.Second)
	if keys := m.Keys(); len(keys) != 0 {
		t.Fatalf("Redis keys left: %v", keys)
	}
	_ = c
}

// TestSlotsRedisExact runs acquirers concurrently against a real
// redis-server, several stores (as several limitd) sharing it: exactly
// max_in_flight of them get a slot; releasing every slot twice, concurrently,
// gives back exactly max_in_flight; the table then is gone. A table's
// expiry is its last lease's end.
func TestSlotsRedisExact(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	stores := []*RedisStore{realStore(t, c, 0), realStore(t, c, 0), realStore(t, c, 0)}
	ctx := context.Background()
	const n, max = 120, 7
	var got atomic.Int64
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := "r" + strconv.Itoa(i)
			a, err := stores[i%len(stores)].Acquire(WithCaller(ctx, "gw-"+strconv.Itoa(i%3)), acquireReq(id, 30_000, []string{"exact/7"}))
			if err != nil {
				t.Error(err)
				return
			}
			if a.InFlight[0] > max {
				t.Errorf("in flight %d > %d", a.InFlight[0], max)
			}
			if a.Acquired {
				got.Add(1)
				ids <- strconv.Itoa(i%3) + " " + id
			}
		})
	}
	wg.Wait()
	close(ids)
	if got.Load() != max {
		t.Fatalf("acquired %d of %d with max_in_flight %d, want exactly %d", got.Load(), n, max, max)
	}
	key := slotKey(DefaultKeyPrefix, "exact", max)
	if pttl := c.PTTL(ctx, key).Val(); pttl <= 29*time.Second || pttl > 30*time.Second {
		t.Fatalf("PTTL = %v, want the lease's 30s", pttl)
	}
	var held atomic.Int64
	for s := range ids {
		gw, id := s[:1], s[2:]
		for range 2 {
			wg.Go(func() {
				a, err := stores[0].Release(WithCaller(ctx, "gw-"+gw), slotsReq(0, []string{"exact/7/" + id}))
				if err != nil {
					t.Error(err)
					return
				}
				if a.Slots[0] == wire.SlotHeld {
					held.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if held.Load() != max {
		t.Fatalf("released %d, want each of %d once", held.Load(), max)
	}
	if n := c.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("table left after every slot was released")
	}
}

// TestSlotsRedisRestart restarts redis-server (no persistence) while slots
// are out: the tables are lost, so a new acquirer gets a slot the limit
// would have refused (the bound's excess), and the next renewals take back
// the running requests' slots while there is room and report the rest
// lost: the table never holds more than max_in_flight.
func TestSlotsRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	s := realStore(t, c, 0)
	ctx := WithCaller(context.Background(), "gw-a")
	for _, id := range []string{"r1", "r2"} {
		if a, err := s.Acquire(ctx, acquireReq(id, 30_000, []string{"rs/2"})); err != nil || !a.Acquired {
			t.Fatalf("acquire %s: %+v, %v", id, a, err)
		}
	}
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var a wire.AcquireAnswer
	var err error
	for range 50 { // the client's pool reconnects: bounded
		if a, err = s.Acquire(ctx, acquireReq("r3", 30_000, []string{"rs/2"})); err == nil {
			break
		}
	}
	if err != nil || !a.Acquired || a.InFlight[0] != 1 {
		t.Fatalf("acquire after restart: %+v, %v; want a slot in an empty table", a, err)
	}
	r, err := s.Renew(ctx, slotsReq(30_000, []string{"rs/2/r1", "rs/2/r2", "rs/2/r3"}))
	if err != nil {
		t.Fatal(err)
	}
	want := []wire.SlotState{wire.SlotRestored, wire.SlotLost, wire.SlotHeld}
	for i := range want {
		if r.Slots[i] != want[i] {
			t.Fatalf("renew after restart = %v, want %v", r.Slots, want)
		}
	}
	if n := c.ZCard(context.Background(), slotKey(DefaultKeyPrefix, "rs", 2)).Val(); n != 2 {
		t.Fatalf("table holds %d, want 2", n)
	}
}

// TestSlotsMemoryBounded fills a memory store's slot tables to MaxKeys: a
// new key beyond is refused with ErrMemoryFull, a released key's table is
// gone at once (room again), and expired tables are dropped for a new one.
func TestSlotsMemoryBounded(t *testing.T) {
	clk := &fakeClock{}
	clk.Set(t0)
	ms := NewMemoryStore(MemoryOptions{Now: clk.Now, MaxKeys: 8})
	ctx := context.Background()
	for i := range 8 {
		if a, err := ms.Acquire(ctx, acquireReq("r", 1000, []string{"k" + strconv.Itoa(i) + "/3"})); err != nil || !a.Acquired {
			t.Fatalf("key %d: %+v, %v", i, a, err)
		}
	}
	if _, err := ms.Acquire(ctx, acquireReq("r", 1000, []string{"new/3"})); !errors.Is(err, ErrMemoryFull) {
		t.Fatalf("a ninth table: %v, want ErrMemoryFull", err)
	}
	if a, err := ms.Release(ctx, slotsReq(0, []string{"k0/3/r"})); err != nil || a.Slots[0] != wire.SlotHeld {
		t.Fatalf("release: %+v, %v", a, err)
	}
	if a, err := ms.Acquire(ctx, acquireReq("r", 1000, []string{"new/3"})); err != nil || !a.Acquired {
		t.Fatalf("after a release: %+v, %v", a, err)
	}
	clk.Set(t0.Add(time.Second))
	if a, err := ms.Acquire(ctx, acquireReq("r", 1000, []string{"later/3"})); err != nil || !a.Acquired {
		t.Fatalf("after every lease ended: %+v, %v", a, err)
	}
	if n := len(ms.slots); n != 1 {
		t.Fatalf("%d tables held, want 1", n)
	}
}

// TestSlotsRedisClusterAllOrNone acquires over two tables in different
// slots of a real Redis Cluster: when the second is full, the first's slot,
// taken by its own script, is given back, so the call takes none; when
// both have room it takes both, and release frees both.
func TestSlotsRedisClusterAllOrNone(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := realClient(t, cl.Addrs()...)
	s := realStore(t, c, 0)
	ctx := context.Background()
	a, b := "first", "second"
	for i := 0; keySlot(slotKey(DefaultKeyPrefix, a, 1)) == keySlot(slotKey(DefaultKeyPrefix, b, 1)); i++ {
		b = "second" + strconv.Itoa(i)
	}
	if r, err := s.Acquire(ctx, acquireReq("other", 30_000, []string{b + "/1"})); err != nil || !r.Acquired {
		t.Fatalf("filling %s: %+v, %v", b, r, err)
	}
	r, err := s.Acquire(ctx, acquireReq("both", 30_000, []string{a + "/1", b + "/1"}))
	if err != nil || r.Acquired || r.InFlight[0] != 0 || r.InFlight[1] != 1 {
		t.Fatalf("acquire over a full table: %+v, %v; want refused, in flight [0 1]", r, err)
	}
	if n := c.ZCard(ctx, slotKey(DefaultKeyPrefix, a, 1)).Val(); n != 0 {
		t.Fatalf("%s holds %d after the refusal, want its slot given back", a, n)
	}
	if _, err := s.Release(ctx, slotsReq(0, []string{b + "/1/other"})); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Acquire(ctx, acquireReq("both", 30_000, []string{a + "/1", b + "/1"})); err != nil || !r.Acquired {
		t.Fatalf("acquire with room in both: %+v, %v", r, err)
	}
	rel, err := s.Release(ctx, slotsReq(0, []string{a + "/1/both", b + "/1/both"}))
	if err != nil || rel.Slots[0] != wire.SlotHeld || rel.Slots[1] != wire.SlotHeld {
		t.Fatalf("release: %+v, %v", rel, err)
	}
}

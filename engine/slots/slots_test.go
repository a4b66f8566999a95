package slots_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// counter is a layout of one uint64 per record, never free, evicted
// smallest first: enough to watch every write land exactly once.
var counter = slots.Layout{
	RecordLen: 8,
	Free:      func([]byte, int64) bool { return false },
	Before:    func(a, b []byte, _ int64) bool { return binary.LittleEndian.Uint64(a) < binary.LittleEndian.Uint64(b) },
}

func newTable(t testing.TB, sd slots.SharedData, n int) *slots.Table {
	t.Helper()
	tb, err := slots.New(sd, "test:", n, counter)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// incr adds 1 to id's counter; it returns the value written.
func incr(t testing.TB, tb *slots.Table, id uint64) uint64 {
	t.Helper()
	var s slots.Slot
	var buf [8]byte
	rec, wrote, _, err := tb.Update(&s, id, 1, func(s *slots.Slot) ([]byte, bool) {
		n := uint64(0)
		if r := s.Record(); r != nil {
			n = binary.LittleEndian.Uint64(r)
		}
		binary.LittleEndian.PutUint64(buf[:], n+1)
		return buf[:], true
	})
	if err != nil || !wrote {
		t.Fatalf("Update: %v, wrote %v", err, wrote)
	}
	return binary.LittleEndian.Uint64(rec)
}

func read(t testing.TB, tb *slots.Table, id uint64) uint64 {
	t.Helper()
	var s slots.Slot
	if err := tb.Load(&s, id, 1); err != nil {
		t.Fatal(err)
	}
	if r := s.Record(); r != nil {
		return binary.LittleEndian.Uint64(r)
	}
	return 0
}

// TestCreateRace replays the host's gap: two workers read a new group key
// as missing; the other creates it; then this one writes. A set on a
// missing key ignores the CAS, so a naive table would overwrite the other's
// write; ours fails the write, reads again and counts 2. Warm: the table
// has read other values before, so its creation CAS is a real one.
func TestCreateRace(t *testing.T) {
	for _, warm := range []bool{false, true} {
		sd := shareddata.New()
		a, b := newTable(t, sd, 100), newTable(t, sd, 100)
		if warm {
			incr(t, a, 1000003)
		}
		sd.Once(func() { incr(t, b, 42) })
		if got := incr(t, a, 42); got != 2 {
			t.Errorf("warm=%v: the counter reads %d after both workers' increments, want 2", warm, got)
		}
	}
}

// TestHammer runs several workers (one Table each, as Envoy's VMs) on
// identities that share groups; every increment lands exactly once.
func TestHammer(t *testing.T) {
	sd := shareddata.New()
	const workers, perWorker = 4, 300
	var wg sync.WaitGroup
	for range workers {
		tb := newTable(t, sd, 8) // two groups: the identities contend
		wg.Go(func() {
			for i := range perWorker {
				incr(t, tb, uint64(1+i%3))
			}
		})
	}
	wg.Wait()
	tb := newTable(t, sd, 8)
	if got := read(t, tb, 1) + read(t, tb, 2) + read(t, tb, 3); got != workers*perWorker {
		t.Fatalf("counters sum to %d, want %d", got, workers*perWorker)
	}
}

// TestEvictAndFree: a full group evicts the layout's first victim; a free
// record's slot is reused without an eviction.
func TestEvictAndFree(t *testing.T) {
	sd := shareddata.New()
	tb := newTable(t, sd, slots.SlotsPerGroup) // one group
	for id := uint64(1); id <= slots.SlotsPerGroup; id++ {
		for range id {
			incr(t, tb, id) // record id holds id
		}
	}
	var s slots.Slot
	if err := tb.Load(&s, 99, 1); err != nil || !s.Evicted || s.Found {
		t.Fatalf("a new identity in a full group: %+v, %v; want the smallest counter evicted", s, err)
	}
	incr(t, tb, 99)
	if read(t, tb, 1) != 0 || read(t, tb, 4) != 4 {
		t.Fatal("evicted another than the layout's first victim")
	}
}

// TestBounded: however many identities, the table holds Groups keys.
func TestBounded(t *testing.T) {
	sd := shareddata.New()
	tb := newTable(t, sd, 1000)
	for i := uint64(1); i <= 20000; i++ {
		incr(t, tb, i*0x9E3779B97F4A7C15)
	}
	if n := sd.Len(); n > tb.Groups() || tb.Groups() != 250 {
		t.Fatalf("%d keys for %d groups", n, tb.Groups())
	}
}

type failing struct{ err error }

func (f failing) Get(string) ([]byte, uint32, error) { return nil, 0, f.err }
func (f failing) Set(string, []byte, uint32) error   { return f.err }

// alwaysMismatch loses every write.
type alwaysMismatch struct{ *shareddata.Envoy }

func (alwaysMismatch) Set(string, []byte, uint32) error { return slots.ErrCASMismatch }

// TestErrors: a host error is returned as it is; contention ends after
// MaxAttempts lost races, having written nothing.
func TestErrors(t *testing.T) {
	boom := errors.New("boom")
	var s slots.Slot
	f := func(*slots.Slot) ([]byte, bool) { return make([]byte, 8), true }
	if _, _, _, err := newTable(t, failing{boom}, 10).Update(&s, 1, 1, f); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	sd := alwaysMismatch{shareddata.New()}
	_, wrote, retries, err := newTable(t, sd, 10).Update(&s, 1, 1, f)
	if !errors.Is(err, slots.ErrContention) || wrote || retries != slots.MaxAttempts || sd.Len() != 0 {
		t.Fatalf("under contention: %v, wrote %v, %d retries, %d keys", err, wrote, retries, sd.Len())
	}
}

// TestSeededPlacement: workers over the same shared data share one seed;
// identities that share a group unseeded (id % groups, computable by any
// client) are spread by the seed, and two Envoys place them differently.
func TestSeededPlacement(t *testing.T) {
	sd := shareddata.New()
	s1, err := slots.LoadSeed(sd, "seed")
	if err != nil {
		t.Fatal(err)
	}
	if s2, _ := slots.LoadSeed(sd, "seed"); s2 != s1 || s1 == 0 {
		t.Fatalf("seeds %d and %d over one shared data", s1, s2)
	}
	other, _ := slots.LoadSeed(shareddata.New(), "seed")
	const groups = 1024
	same := 0
	for i := uint64(0); i < 64; i++ {
		id := 7 + i*groups // all in group 7 unseeded
		if slots.Place(id, s1, groups) == slots.Place(7, s1, groups) {
			same++
		}
	}
	if same > 4 || slots.Place(7, s1, groups) == slots.Place(7, other, groups) && slots.Place(8, s1, groups) == slots.Place(8, other, groups) {
		t.Fatalf("%d of 64 chosen identities share a group under the seed", same)
	}
}

// TestLoadSecret: a secret is drawn once per shared data and read back by
// every later load (every worker); another process draws another; a value
// of another size under the key is never used.
func TestLoadSecret(t *testing.T) {
	sd := shareddata.New()
	a, err := slots.LoadSecret(sd, "secret", 16)
	if err != nil || len(a) != 16 {
		t.Fatalf("LoadSecret: %x, %v", a, err)
	}
	if b, err := slots.LoadSecret(sd, "secret", 16); err != nil || string(b) != string(a) {
		t.Fatalf("a second load: %x, %v; want %x", b, err, a)
	}
	if c, _ := slots.LoadSecret(shareddata.New(), "secret", 16); string(c) == string(a) {
		t.Fatalf("two processes drew the same secret %x", a)
	}
	if _, err := slots.LoadSecret(sd, "secret", 8); err == nil {
		t.Fatal("a 16-byte value was read as an 8-byte secret")
	}
}

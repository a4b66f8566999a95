package filter

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// TestStoreMatchesEnvoy runs the same random operations on a Store and on
// the model of Envoy's shared data (internal/testing/shareddata) and
// demands the same results: values, CAS values and errors.
func TestStoreMatchesEnvoy(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		s, model := NewStore(), shareddata.New()
		var seen []uint32 // CAS values read so far
		for step := range 2000 {
			key := "k" + strconv.Itoa(r.IntN(8))
			if r.IntN(2) == 0 {
				v1, c1, err1 := s.Get(key)
				v2, c2, err2 := model.Get(key)
				if !bytes.Equal(v1, v2) || c1 != c2 || !errors.Is(err1, err2) {
					t.Fatalf("seed %d step %d: Get(%q) = %q, %d, %v; Envoy: %q, %d, %v", seed, step, key, v1, c1, err1, v2, c2, err2)
				}
				if err1 == nil {
					seen = append(seen, c1)
					v1[0] ^= 0xff // a caller changing its copy changes nothing stored
				}
				continue
			}
			var cas uint32
			switch r.IntN(4) {
			case 0: // no CAS
			case 1: // one read earlier, maybe stale, maybe of another key
				if len(seen) > 0 {
					cas = seen[r.IntN(len(seen))]
				}
			case 2: // the latest read
				if len(seen) > 0 {
					cas = seen[len(seen)-1]
				}
			default:
				cas = r.Uint32()
			}
			value := []byte("v" + strconv.Itoa(step))
			err1 := s.Set(key, value, cas)
			err2 := model.Set(key, value, cas)
			if !errors.Is(err1, err2) {
				t.Fatalf("seed %d step %d: Set(%q, cas %d) = %v; Envoy: %v", seed, step, key, cas, err1, err2)
			}
			value[0] = 'x' // a caller reusing its buffer changes nothing stored
		}
		if s.Len() != model.Len() {
			t.Fatalf("seed %d: %d keys, Envoy %d", seed, s.Len(), model.Len())
		}
	}
}

// TestStoreMissingKeyAlwaysSet: a set on a missing key succeeds whatever
// its CAS (there is no create-if-absent), and no delete exists.
func TestStoreMissingKeyAlwaysSet(t *testing.T) {
	s := NewStore()
	if err := s.Set("a", []byte("1"), 12345); err != nil {
		t.Fatalf("Set on a missing key with cas 12345: %v, want success", err)
	}
	_, cas, err := s.Get("a")
	if err != nil || cas == 0 {
		t.Fatalf("Get = cas %d, %v", cas, err)
	}
	if err := s.Set("a", []byte("2"), cas+1); !errors.Is(err, slots.ErrCASMismatch) {
		t.Fatalf("Set with another cas = %v, want ErrCASMismatch", err)
	}
	if err := s.Set("a", []byte("3"), 0); err != nil {
		t.Fatalf("Set with cas 0 = %v, want success", err)
	}
	if _, _, err := s.Get("b"); !errors.Is(err, slots.ErrNotFound) {
		t.Fatalf("Get of a missing key = %v, want ErrNotFound", err)
	}
}

// TestStoreHammer: goroutines increment counters under compare-and-swap
// (the way package slots changes a group) and race to create a key with the
// CAS of a value read before; every increment that succeeded is counted
// exactly once, and exactly one creation wins.
func TestStoreHammer(t *testing.T) {
	const workers, perWorker, keys = 8, 500, 4
	s := NewStore()
	if err := s.Set("seed", []byte("s"), 0); err != nil {
		t.Fatal(err)
	}
	_, seedCAS, _ := s.Get("seed")
	var wg sync.WaitGroup
	created := make([]int, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.Set("created", []byte{byte(w)}, seedCAS) == nil {
				created[w]++
			}
			for i := range perWorker {
				key := "n" + strconv.Itoa((w+i)%keys)
				for {
					v, cas, err := s.Get(key)
					n := 0
					if err == nil {
						n, _ = strconv.Atoi(string(v))
					} else if !errors.Is(err, slots.ErrNotFound) {
						t.Error(err)
						return
					}
					if cas == 0 {
						cas = seedCAS // create with the CAS of a value read before, as slots does
					}
					err = s.Set(key, []byte(strconv.Itoa(n+1)), cas)
					if err == nil {
						break
					}
					if !errors.Is(err, slots.ErrCASMismatch) {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for k := range keys {
		v, _, err := s.Get("n" + strconv.Itoa(k))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(string(v))
		total += n
	}
	if total != workers*perWorker {
		t.Errorf("counted %d increments, want %d", total, workers*perWorker)
	}
	wins := 0
	for _, c := range created {
		wins += c
	}
	if wins != 1 {
		t.Errorf("%d workers created the key with a CAS read before it existed, want 1", wins)
	}
}

// TestStoreKeysFromReusedBuffer: slots.Table passes keys that alias a
// scratch buffer it rewrites for the next key (hosts copy keys). A second
// Set of an existing key must not leave the caller's buffer as the map's
// key: Go's map assignment stores the new key's string header for string
// keys, and the entry then changes name with the buffer (it vanishes, and
// its bucket starts afresh). Found as buckets lost across a listener update
// and steady clients given fresh bursts under a flood of keys.
func TestStoreKeysFromReusedBuffer(t *testing.T) {
	s := NewStore()
	buf := []byte("tokenbucket:v2::25000:10013")
	key := func() string { return unsafe.String(unsafe.SliceData(buf), len(buf)) }
	if err := s.Set(key(), []byte("v1"), 0); err != nil { // created: the Store copies the key
		t.Fatal(err)
	}
	_, cas, err := s.Get(key())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set(key(), []byte("v2"), cas); err != nil { // an update of the existing key
		t.Fatal(err)
	}
	copy(buf[len(buf)-5:], "15130") // the caller's next key
	if v, _, err := s.Get("tokenbucket:v2::25000:10013"); err != nil || string(v) != "v2" {
		t.Fatalf("after the caller reused its buffer: Get = %q, %v; want \"v2\"", v, err)
	}
	if _, _, err := s.Get("tokenbucket:v2::25000:15130"); !errors.Is(err, slots.ErrNotFound) {
		t.Fatalf("a key never set reads as %v, want slots.ErrNotFound", err)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

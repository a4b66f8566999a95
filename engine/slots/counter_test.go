package slots_test

import (
	"sync"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// TestNextCreateRace: two workers read the counter's key as missing; the
// other creates it first. A set on a missing key ignores the CAS, so a naive
// counter would hand both the number 1; Next fails the creation, reads
// again and hands out 2.
func TestNextCreateRace(t *testing.T) {
	sd := shareddata.New()
	var other uint64
	sd.Once(func() {
		n, err := slots.Next(sd, "c")
		if err != nil {
			t.Error(err)
		}
		other = n
	})
	n, err := slots.Next(sd, "c")
	if err != nil {
		t.Fatal(err)
	}
	if other != 1 || n != 2 {
		t.Fatalf("numbers %d (the other worker) and %d, want 1 and 2", other, n)
	}
}

// TestNextHammer: workers drawing at once get distinct numbers, 1 to n.
func TestNextHammer(t *testing.T) {
	sd := shareddata.New()
	const workers, perWorker = 4, 100
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				n, err := slots.Next(sd, "c")
				if err == slots.ErrContention {
					continue // bounded: a draw may give up, never repeat
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[n] {
					t.Errorf("number %d drawn twice", n)
				}
				seen[n] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := uint64(1); i <= uint64(len(seen)); i++ {
		if !seen[i] {
			t.Fatalf("%d numbers drawn, but not %d", len(seen), i)
		}
	}
}

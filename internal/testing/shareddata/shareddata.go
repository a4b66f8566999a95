// Package shareddata is proxy-wasm shared data for tests, with Envoy's exact
// semantics (proxy-wasm-cpp-host's SharedData::set): one process-wide CAS
// counter that skips 0; a set on an existing key fails iff cas != 0 and cas
// differs from the key's current CAS; a set on a missing key always
// succeeds. A hook can run another worker's writes between a read and a
// write, to force the interleavings the CAS must survive.
package shareddata

import (
	"strings"
	"sync"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// Envoy is shared data as Envoy keeps it. Safe for concurrent use.
type Envoy struct {
	mu      sync.Mutex
	m       map[string]entry
	counter uint32
	// BeforeSet, if set, runs before each Set (outside the lock): another
	// worker writing between this one's read and its write.
	BeforeSet func(key string)
}

type entry struct {
	value []byte
	cas   uint32
}

// New returns empty shared data.
func New() *Envoy { return &Envoy{m: map[string]entry{}, counter: 1} }

// Get implements slots.SharedData.
func (e *Envoy) Get(key string) ([]byte, uint32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.m[key]
	if !ok {
		return nil, 0, slots.ErrNotFound
	}
	return append([]byte(nil), v.value...), v.cas, nil
}

// Set implements slots.SharedData.
func (e *Envoy) Set(key string, value []byte, cas uint32) error {
	if f := e.BeforeSet; f != nil {
		f(key)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.m[key]; ok && cas != 0 && cas != v.cas {
		return slots.ErrCASMismatch
	}
	e.m[strings.Clone(key)] = entry{append([]byte(nil), value...), e.counter} // hosts copy keys
	e.counter++
	if e.counter == 0 {
		e.counter++
	}
	return nil
}

// Len is the number of keys.
func (e *Envoy) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
}

// Once runs f before the next Set only (then the hook is cleared).
func (e *Envoy) Once(f func()) {
	e.BeforeSet = func(string) {
		e.BeforeSet = nil
		f()
	}
}

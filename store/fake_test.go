package store

import (
	"strings"
	"sync"
)

// envoyData is SharedData with Envoy's exact semantics (proxy-wasm-cpp-host
// SharedData::set): one process-wide CAS counter that skips 0; a set on an
// existing key fails iff cas != 0 && cas != current; a set on a missing key
// always succeeds. Safe for concurrent use.
type envoyData struct {
	mu      sync.Mutex
	m       map[string]entry
	counter uint32
	// beforeSet, if set, runs before each Set (outside the lock).
	beforeSet func(key string)
}

type entry struct {
	value []byte
	cas   uint32
}

func newEnvoyData() *envoyData { return &envoyData{m: map[string]entry{}, counter: 1} }

func (e *envoyData) Get(key string) ([]byte, uint32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.m[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return append([]byte(nil), v.value...), v.cas, nil
}

func (e *envoyData) Set(key string, value []byte, cas uint32) error {
	if e.beforeSet != nil {
		e.beforeSet(key)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.m[key]; ok && cas != 0 && cas != v.cas {
		return ErrCASMismatch
	}
	e.m[strings.Clone(key)] = entry{append([]byte(nil), value...), e.counter} // hosts copy keys
	e.counter++
	if e.counter == 0 {
		e.counter++
	}
	return nil
}

func (e *envoyData) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
}

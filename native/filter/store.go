package filter

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// Store is shared data in process memory with exactly the semantics of
// Envoy's proxy-wasm shared data (engine.SharedData): Get returns a copy of
// the value and its CAS; Set on an existing key fails with
// engine.ErrCASMismatch iff cas != 0 and cas differs from the key's CAS; Set
// on a missing key always succeeds, whatever cas; nothing is ever deleted.
//
// As in Envoy, the CAS values come from one process-wide counter that skips
// 0, so a CAS once read is never given to a key created later (until the
// 32-bit counter wraps): package slots relies on it to create a missing key
// without overwriting one another worker created meanwhile.
//
// Keys are spread over storeShards maps by a hash of the key, each behind
// its own mutex held only for the map operation, so workers deciding
// different buckets rarely meet. The key count is bounded by the users of
// the store (package slots: a fixed set of group keys per table).
//
// A Store is safe for concurrent use; the zero value is not usable: use
// NewStore.
type Store struct {
	seed   maphash.Seed
	cas    atomic.Uint32
	shards [storeShards]storeShard
}

// storeShards is the number of independently locked maps.
const storeShards = 64

// A shard's map is assigned only when a key is created, with a copy of the
// caller's key; an existing entry is changed through its pointer. Assigning
// an existing string key again would store the caller's string as the map's
// key (Go updates string keys on assignment), and callers pass keys that
// alias a buffer they rewrite (package slots): the entry would change name
// with the buffer and vanish.
type storeShard struct {
	mu sync.Mutex
	m  map[string]*storeEntry
	_  [40]byte // keeps two shards' mutexes off one cache line
}

type storeEntry struct {
	value []byte
	cas   uint32
}

// NewStore returns an empty Store.
func NewStore() *Store {
	s := &Store{seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].m = map[string]*storeEntry{}
	}
	return s
}

func (s *Store) shard(key string) *storeShard {
	return &s.shards[maphash.String(s.seed, key)%storeShards]
}

// nextCAS is the process-wide counter's next value, never 0.
func (s *Store) nextCAS() uint32 {
	for {
		if c := s.cas.Add(1); c != 0 {
			return c
		}
	}
}

// Get implements engine.SharedData: a copy of the value (the caller may
// change it) and its CAS, or engine.ErrNotFound.
func (s *Store) Get(key string) ([]byte, uint32, error) {
	sh := s.shard(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	var value []byte
	var cas uint32
	if ok {
		value, cas = e.value, e.cas
	}
	sh.mu.Unlock()
	if !ok {
		return nil, 0, engine.ErrNotFound
	}
	// A value is never changed in place (Set stores a new slice), so it can
	// be copied outside the lock.
	return append([]byte(nil), value...), cas, nil
}

// Set implements engine.SharedData. It keeps a copy of value.
func (s *Store) Set(key string, value []byte, cas uint32) error {
	v := append([]byte(nil), value...)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	switch {
	case !ok:
		sh.m[strings.Clone(key)] = &storeEntry{value: v, cas: s.nextCAS()}
	case cas != 0 && cas != e.cas:
		return engine.ErrCASMismatch
	default:
		e.value, e.cas = v, s.nextCAS() // never sh.m[key] = ...: see storeShard
	}
	return nil
}

// Len is the number of keys.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

package slots

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
)

// Placement. A bucket's group is not its identity modulo the number of
// groups, which a client could compute from its own key values and so
// choose keys that share a group with its own bucket (to have it evicted):
// it is the identity mixed with a seed drawn once per Envoy process and
// kept in shared data, so every worker places a bucket in the same group
// and no client can tell which keys share one.

// LoadSeed returns the placement seed stored under key (never 0), creating it once:
// the first Table of the process draws it, and a worker that races it reads
// the winner's (a creation with a CAS no key can have fails once the key
// exists).
func LoadSeed(sd SharedData, key string) (uint64, error) {
	b, err := loadRandom(sd, key, 8, func(b []byte) {
		b[0] |= 1 // never 0 (Place's unseeded layout)
	})
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// LoadSecret returns the size random bytes stored under key, creating them
// once, as LoadSeed does: every worker of the process, and every
// configuration, reads the same bytes, and the first to find none draws
// them (crypto/rand). A value of another size under key is never used:
// the call fails (ErrContention).
func LoadSecret(sd SharedData, key string, size int) ([]byte, error) {
	return loadRandom(sd, key, size, nil)
}

// loadRandom reads the size bytes under key, or creates them with the
// exact-creation rule: adjust (when not nil) shapes what is drawn.
func loadRandom(sd SharedData, key string, size int, adjust func([]byte)) ([]byte, error) {
	for range MaxAttempts {
		v, _, err := sd.Get(key)
		switch {
		case err == nil && len(v) == size:
			return v, nil
		case err != nil && !errors.Is(err, ErrNotFound):
			return nil, err
		}
		b := make([]byte, size)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		if adjust != nil {
			adjust(b)
		}
		// noCAS: succeeds only while the key is missing (Envoy ignores the
		// CAS of a missing key) or holds a value with that CAS (none does).
		if err := sd.Set(key, b, noCAS); err != nil && !errors.Is(err, ErrCASMismatch) {
			return nil, err
		}
	}
	return nil, ErrContention
}

// Place is the group of id among groups under seed; seed 0 places by the
// identity alone (id % groups: what tests that lay out groups by hand use).
func Place(id, seed, groups uint64) uint64 {
	if seed == 0 {
		return id % groups
	}
	return mix(id^seed) % groups
}

// mix is a 64-bit finalizer (splitmix64's): every bit of the input moves
// every bit of the output.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

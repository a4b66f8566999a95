package fakehost

import "github.com/ratelimit-wasm/tokenbucket/engine"

// RefusingData is shared data whose next Refuse writes (every write while
// Refuse is negative) fail with Err (a host error; nil: a lost
// compare-and-swap), then write as SD does. The
// placement seed and the identity key pass through (engine.SeedKey,
// engine.IdentityKeyKey), so only records are refused. Not safe for
// concurrent use: one test's workers run in turn.
type RefusingData struct {
	SD     engine.SharedData
	Refuse int   // writes still to refuse; negative: every write
	Err    error // what a refused write returns (nil: engine.ErrCASMismatch)
}

func (r *RefusingData) Get(key string) ([]byte, uint32, error) { return r.SD.Get(key) }

func (r *RefusingData) Set(key string, value []byte, cas uint32) error {
	if r.Refuse != 0 && key != engine.SeedKey && key != engine.IdentityKeyKey {
		if r.Refuse > 0 {
			r.Refuse--
		}
		if r.Err != nil {
			return r.Err
		}
		return engine.ErrCASMismatch
	}
	return r.SD.Set(key, value, cas)
}

var _ engine.SharedData = (*RefusingData)(nil)

package slots

import (
	"encoding/binary"
	"errors"
)

// Next draws the next number of the counter stored under key: 1, then 2,
// and so on, each number to one caller only, whichever worker draws it. The
// key is created by the first draw with the creation rule of a Table (a CAS
// no key can have), so two workers that both read it as missing cannot both
// draw 1; a draw that loses a race reads again, at most MaxAttempts times,
// then fails with ErrContention having drawn nothing. A value of another
// length (not ours) reads as 0.
func Next(sd SharedData, key string) (uint64, error) {
	for range MaxAttempts {
		v, cas, err := sd.Get(key)
		var n uint64
		switch {
		case errors.Is(err, ErrNotFound):
			cas = noCAS
		case err != nil:
			return 0, err
		case len(v) == 8:
			n = binary.LittleEndian.Uint64(v)
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], n+1)
		err = sd.Set(key, b[:], cas)
		if err == nil {
			return n + 1, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return 0, err
		}
	}
	return 0, ErrContention
}

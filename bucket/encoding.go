package bucket

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
)

// EncodedLen is the length in bytes of an encoded State.
const EncodedLen = 16

// AppendBinary appends the EncodedLen-byte encoding of s to b and returns the
// extended slice: the IEEE 754 bits of Tokens, then At, both little-endian.
// It allocates only when b lacks the capacity. (Unlike
// encoding.BinaryAppender it cannot fail, so it returns no error.)
func (s State) AppendBinary(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Tokens))
	return binary.LittleEndian.AppendUint64(b, uint64(s.At))
}

// MaxDebt bounds the debt (negative tokens, see Limit.Charge) a decoded
// State may hold: the largest burst any configuration allows. A limit
// clamps any debt to its own −Burst.
const MaxDebt = 1e12

// DecodeState decodes a State written by AppendBinary. It rejects input of the
// wrong length, tokens that are NaN, infinite or below −MaxDebt, a negative
// time, and non-zero tokens with a zero time (the zero time marks the unused
// bucket). Tokens above a limit's burst, or below −burst, are accepted: the
// limit clamps them.
func DecodeState(b []byte) (State, error) {
	if len(b) != EncodedLen {
		return State{}, errors.New("bucket: state: must be " + strconv.Itoa(EncodedLen) + " bytes, got " + strconv.Itoa(len(b)))
	}
	s := State{
		Tokens: math.Float64frombits(binary.LittleEndian.Uint64(b)),
		At:     int64(binary.LittleEndian.Uint64(b[8:])),
	}
	switch {
	case math.IsNaN(s.Tokens) || math.IsInf(s.Tokens, 0) || s.Tokens < -MaxDebt:
		return State{}, errors.New("bucket: state tokens: must be a finite number >= -1e12 (the largest debt), got " + strconv.FormatFloat(s.Tokens, 'g', -1, 64))
	case s.At < 0:
		return State{}, errors.New("bucket: state at: must be >= 0, got " + strconv.FormatInt(s.At, 10))
	case s.At == 0 && s.Tokens != 0:
		return State{}, errors.New("bucket: state tokens: must be 0 when at is 0 (the unused bucket), got " + strconv.FormatFloat(s.Tokens, 'g', -1, 64))
	}
	return s, nil
}

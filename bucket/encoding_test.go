package bucket

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

// raw builds an encoding from its two words, valid or not.
func raw(tokens uint64, at uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, tokens)
	return binary.LittleEndian.AppendUint64(b, at)
}

func TestEncodingRoundTrip(t *testing.T) {
	tests := []State{
		{},
		{Tokens: 0, At: 1},
		{Tokens: 49.5, At: t0},
		{Tokens: math.SmallestNonzeroFloat64, At: math.MaxInt64},
		{Tokens: math.MaxFloat64, At: 1},
		{Tokens: -70, At: t0},      // a debt left by Charge
		{Tokens: -MaxDebt, At: t0}, // the largest debt
	}
	for _, s := range tests {
		b := s.AppendBinary([]byte("prefix"))
		if len(b) != len("prefix")+EncodedLen || !bytes.HasPrefix(b, []byte("prefix")) {
			t.Fatalf("AppendBinary(%+v) = %x, want the prefix and %d bytes", s, b, EncodedLen)
		}
		got, err := DecodeState(b[len("prefix"):])
		if err != nil || got != s {
			t.Errorf("DecodeState(AppendBinary(%+v)) = %+v, %v", s, got, err)
		}
	}
	if b := (State{}).AppendBinary(nil); !bytes.Equal(b, make([]byte, EncodedLen)) {
		t.Errorf("the zero State encodes as %x, want %d zero bytes", b, EncodedLen)
	}
	// The layout is part of the contract: float64 bits, then At, little-endian.
	if b, want := (State{Tokens: 1, At: 2}).AppendBinary(nil), raw(math.Float64bits(1), 2); !bytes.Equal(b, want) {
		t.Errorf("State{1, 2} encodes as %x, want %x", b, want)
	}
}

func TestDecodeStateErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "bucket: state: must be 16 bytes, got 0"},
		{"short", make([]byte, 15), "bucket: state: must be 16 bytes, got 15"},
		{"long", make([]byte, 17), "bucket: state: must be 16 bytes, got 17"},
		{"NaN tokens", raw(math.Float64bits(math.NaN()), 1), "bucket: state tokens: must be a finite number >= -1e12 (the largest debt), got NaN"},
		{"infinite tokens", raw(math.Float64bits(math.Inf(1)), 1), "bucket: state tokens: must be a finite number >= -1e12 (the largest debt), got +Inf"},
		{"debt beyond any burst", raw(math.Float64bits(-2e12), 1), "bucket: state tokens: must be a finite number >= -1e12 (the largest debt), got -2e+12"},
		{"negative at", raw(0, uint64(1)<<63), "bucket: state at: must be >= 0, got -9223372036854775808"},
		{"tokens without at", raw(math.Float64bits(3), 0), "bucket: state tokens: must be 0 when at is 0 (the unused bucket), got 3"},
	}
	for _, tt := range tests {
		s, err := DecodeState(tt.in)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: DecodeState(%x) = %+v, %v; want error %q", tt.name, tt.in, s, err, tt.want)
		}
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, EncodedLen))
	f.Add(State{Tokens: 12.25, At: t0}.AppendBinary(nil))
	f.Add(raw(math.Float64bits(math.NaN()), 1))
	f.Add(raw(math.Float64bits(math.Copysign(0, -1)), 5))
	f.Add(raw(math.Float64bits(-2), 5))
	f.Add(raw(0, uint64(1)<<63))
	f.Add(raw(math.Float64bits(1), 0))
	f.Add(make([]byte, EncodedLen+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeState(b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "bucket: ") {
				t.Errorf("DecodeState(%x): error %q lacks the package prefix", b, err)
			}
			return
		}
		if again := s.AppendBinary(nil); !bytes.Equal(again, b) {
			t.Errorf("DecodeState(%x) = %+v, which re-encodes as %x", b, s, again)
		}
		// Any accepted state is safe to decide on.
		lim := Limit{Rate: 3, Burst: 10}
		next, _ := lim.Take(s, t0, 1)
		if _, err := DecodeState(next.AppendBinary(nil)); err != nil {
			t.Errorf("Take on decoded %+v gave %+v, which does not decode: %v", s, next, err)
		}
	})
}

// same reports whether two states are bit-for-bit equal (NaN tokens included).
func same(a, b State) bool {
	return math.Float64bits(a.Tokens) == math.Float64bits(b.Tokens) && a.At == b.At
}

func FuzzTake(f *testing.F) {
	f.Add(10.0, 50.0, 3.0, t0, t0+sec, 1.0)
	f.Add(0.5, 2.0, 0.0, int64(0), int64(-5), 2.5)
	f.Add(1e-300, 1e300, 1e300, int64(1), int64(math.MaxInt64), 1e300)
	f.Add(math.Inf(1), math.NaN(), math.NaN(), int64(math.MinInt64), int64(1), math.Inf(-1))
	f.Fuzz(func(t *testing.T, rate, burst, tokens float64, at, now int64, cost float64) {
		lim := Limit{Rate: rate, Burst: burst}
		s := State{Tokens: tokens, At: at}
		next, d := lim.Take(s, now, cost)
		if !d.Allowed {
			if !same(next, s) {
				t.Fatalf("%+v.Take(%+v, %d, %v) rejected but changed the state to %+v", lim, s, now, cost, next)
			}
			if d.RetryAfter < 1 {
				t.Fatalf("%+v.Take(%+v, %d, %v) = %+v: RetryAfter below 1 on rejection", lim, s, now, cost, d)
			}
		} else {
			if !(next.Tokens >= 0) || next.At < 1 || math.IsInf(next.Tokens, 0) {
				t.Fatalf("%+v.Take(%+v, %d, %v) = %+v, an invalid state", lim, s, now, cost, next)
			}
			if d.RetryAfter != 0 {
				t.Fatalf("%+v.Take(%+v, %d, %v) = %+v: RetryAfter on admission", lim, s, now, cost, d)
			}
		}
		if d.Remaining < 0 || d.ResetAfter < 0 {
			t.Fatalf("%+v.Take(%+v, %d, %v) = %+v: negative counts", lim, s, now, cost, d)
		}
		if got := lim.Refund(s, now, cost); !same(got, s) && !(got.Tokens >= -lim.capacity() && got.At >= 1) {
			t.Fatalf("%+v.Refund(%+v, %d, %v) = %+v, an invalid state", lim, s, now, cost, got)
		}
		for _, amount := range []float64{cost, -cost} {
			got := lim.Charge(s, now, amount)
			if same(got, s) {
				continue
			}
			if !(got.Tokens >= -lim.capacity() && got.Tokens <= lim.capacity()) || got.At < 1 {
				t.Fatalf("%+v.Charge(%+v, %d, %v) = %+v, outside [-burst, burst]", lim, s, now, amount, got)
			}
			if _, err := DecodeState(got.AppendBinary(nil)); err != nil && lim.capacity() <= MaxDebt {
				t.Fatalf("%+v.Charge(%+v, %d, %v) = %+v, which does not decode: %v", lim, s, now, amount, got, err)
			}
		}
		_ = lim.FullAt(s)
	})
}

package grpcdoor

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// The scanner counts the RST_STREAM frames of a client's byte stream
// however the reads split it: the preface, frames of every length, a
// header split across reads.
func TestFrameScannerCountsResets(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	want := 0
	for i := range 50 {
		id := uint32(2*i + 1)
		_ = fr.WriteSettings()
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: bytes.Repeat([]byte{0x88}, i), EndHeaders: true})
		_ = fr.WriteData(id, false, bytes.Repeat([]byte{byte(frameRSTStream)}, 300*i)) // payload bytes that look like a type
		if i%3 == 0 {
			_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
			want++
		}
		_ = fr.WritePing(false, [8]byte{3, 3, 3})
	}
	stream := b.Bytes()
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		var s frameScanner
		got := 0
		for p := stream; len(p) > 0; {
			n := min(len(p), 1+r.IntN(40))
			if seed == 0 {
				n = 1 // byte by byte
			}
			got += s.feed(p[:n])
			p = p[n:]
		}
		if got != want {
			t.Errorf("seed %d: %d resets counted, want %d", seed, got, want)
		}
	}
}

// The reset budget is a token bucket: the burst at once, then the rate; a
// clock that goes backwards refills nothing.
func TestResetBudget(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC)
	b := resetBudget{rate: 10, burst: 20}
	steps := []struct {
		at   time.Duration
		n    int
		want bool
	}{
		{0, 20, true},                      // the burst
		{0, 1, false},                      // none left
		{time.Second, 9, true},             // 10 refilled, one owed
		{500 * time.Millisecond, 1, false}, // backwards: nothing refilled
		{10 * time.Second, 20, true},       // full again, no more than the burst
		{10 * time.Second, 1, false},
	}
	for i, s := range steps {
		if got := b.spend(s.n, t0.Add(s.at)); got != s.want {
			t.Errorf("step %d: spend(%d) at +%v = %v, want %v", i, s.n, s.at, got, s.want)
		}
	}
}

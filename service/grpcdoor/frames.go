package grpcdoor

import "time"

// clientPrefaceLen is the length of the HTTP/2 client connection preface,
// "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", which precedes the client's frames.
const clientPrefaceLen = 24

// frameRSTStream is the type of an HTTP/2 RST_STREAM frame.
const frameRSTStream = 0x3

// frameScanner follows the frames a client sends on an HTTP/2 connection,
// from the bytes the server reads, without keeping them: it skips the
// preface and each frame's payload, and counts RST_STREAM frames. It only
// reads the 9-byte frame headers, so it costs a few operations per frame,
// whatever the frames hold; malformed input is the HTTP/2 server's to
// refuse. The zero value expects the preface. Not safe for concurrent use
// (a connection has one reader).
type frameScanner struct {
	started bool
	skip    int // bytes still to skip: the preface, then a frame's payload
	hdr     [9]byte
	n       int // bytes of hdr read
}

// feed follows p, the next bytes read, and returns how many RST_STREAM
// frames' headers it completed.
func (s *frameScanner) feed(p []byte) (resets int) {
	if !s.started {
		s.started, s.skip = true, clientPrefaceLen
	}
	for len(p) > 0 {
		if s.skip > 0 {
			k := min(s.skip, len(p))
			s.skip -= k
			p = p[k:]
			continue
		}
		k := copy(s.hdr[s.n:], p)
		s.n += k
		p = p[k:]
		if s.n < len(s.hdr) {
			continue
		}
		if s.hdr[3] == frameRSTStream {
			resets++
		}
		s.skip = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
		s.n = 0
	}
	return resets
}

// resetBudget is a token bucket of stream resets: burst at most, refilled at
// rate a second; a connection that spends more than it holds is closed.
// Time is passed in; a clock that goes backwards refills nothing. The zero
// value with rate and burst set starts full.
type resetBudget struct {
	rate, burst float64
	tokens      float64
	at          time.Time
	started     bool
}

// spend takes n resets at now and reports whether the budget covered them.
func (b *resetBudget) spend(n int, now time.Time) bool {
	switch {
	case !b.started:
		b.started, b.tokens, b.at = true, b.burst, now
	case now.After(b.at):
		b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.rate)
		b.at = now
	}
	b.tokens -= float64(n)
	return b.tokens >= 0
}

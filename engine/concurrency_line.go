package engine

import (
	"encoding/binary"
	"math/bits"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// Lines for a slot across workers (max_delay_ms on a concurrency rule).
//
// Model: a key whose requests wait for a slot has a line record in shared
// data, in a table of its own (slotLines, bounded like the buckets'), that
// every worker reads and writes by compare-and-swap: next, the ticket the
// next request to wait takes; serving, the ticket of the line's head (the
// tickets in [serving, next) wait, in the order they came); headUntil, the
// moment the head's turn lapses unless it tries again; and gone, a bitmap
// of the 64 oldest tickets whose requests gave up. Every change is a pure
// function of the record and the time (lineRec's methods), so a lost race
// is tried again from a fresh read.
//
// Only the head may take a slot; a request that arrives while anyone
// waits takes a ticket behind them rather than a slot (behindSlotLine),
// so newcomers do not jump the line, whichever worker they are on. The
// head tries at each poll (slotPoll) and at each end in its worker, and
// each try renews its turn for lineLease; once admitted it leaves the
// line, and the next ticket's turn starts then.
//
// A waiter that gives up (its max_delay_ms passed, its client or Envoy
// ended it) leaves the line: its ticket is marked gone and skipped at
// once when it is among the 64 oldest, else its turn lapses lineLease
// after it reaches the head; the tickets of a worker that vanished lapse
// the same way, one lineLease each at the head. A live head too slow to
// try within lineLease (a worker stalled) loses its turn and takes a new
// ticket at the back: the order yields, the bound on slots does not (the
// slot itself is the bucket's, taken by the same compare-and-swap as
// always, so at most max_in_flight are ever out whatever the line does).
//
// Bounds: at most max_waiting tickets wait per key across workers (and
// per rule in each worker, as for token buckets). A record with no ticket
// waiting, or whose tickets have all lapsed, is free for another key, so
// a key's entry is gone when nobody waits. A table full of keys with
// waiters evicts the one whose head lapses first; its waiters find their
// ticket unknown and take a new one. When shared data fails, a request
// waits without a ticket (it tries as a head would, the order of one
// worker's line only): ordering degrades, the bound on slots does not.

// lineLease is how long the head of a line keeps its turn without trying:
// fifty polls (1 s), so that a worker slowed by its load keeps its turn.
const lineLease = 50 * slotPoll

// lineLen is the length of an encoded lineRec.
const lineLen = 32

// lineRec is one key's line (see the model above).
type lineRec struct {
	next, serving uint64
	headUntil     int64
	gone          uint64 // bit i: ticket serving+i gave up
}

func decodeLine(b []byte) lineRec {
	return lineRec{
		next:      binary.LittleEndian.Uint64(b),
		serving:   binary.LittleEndian.Uint64(b[8:]),
		headUntil: int64(binary.LittleEndian.Uint64(b[16:])),
		gone:      binary.LittleEndian.Uint64(b[24:]),
	}
}

func (r lineRec) encode(b []byte) []byte {
	binary.LittleEndian.PutUint64(b, r.next)
	binary.LittleEndian.PutUint64(b[8:], r.serving)
	binary.LittleEndian.PutUint64(b[16:], uint64(r.headUntil))
	binary.LittleEndian.PutUint64(b[24:], r.gone)
	return b
}

// waiters is the number of tickets in the line, gone ones included.
func (r lineRec) waiters() uint64 { return r.next - r.serving }

// settle is the line at now: heads that gave up are skipped, and a head
// whose turn lapsed; each new head's turn starts now.
func (r lineRec) settle(now int64) lineRec {
	for r.serving < r.next && (r.gone&1 != 0 || now > r.headUntil) {
		r.serving++
		r.gone >>= 1
		r.headUntil = now + lineLease
	}
	if r.serving == r.next {
		r.gone = 0
	}
	return r
}

// lineFree: nobody waits in the line at now, or every ticket in it would
// have lapsed by now (their workers are gone): the record may be reused.
func lineFree(b []byte, now int64) bool {
	r := decodeLine(b)
	n := r.waiters() - uint64(bits.OnesCount64(r.gone))
	return r.serving >= r.next || n > 1<<20 || now > r.headUntil+int64(n)*lineLease
}

// lineBefore: a's line lapses before b's (evicted first).
func lineBefore(a, b []byte, _ int64) bool {
	return decodeLine(a).headUntil < decodeLine(b).headUntil
}

// join takes a ticket at the back of the line (a new record, its tickets
// numbered from now, when the key has none); full when max tickets wait.
func (r lineRec) join(found bool, now int64, max int) (rec lineRec, ticket uint64, full bool) {
	if !found {
		r = lineRec{next: uint64(now), serving: uint64(now)}
	}
	r = r.settle(now)
	if r.waiters() >= uint64(max) {
		return r, 0, true
	}
	if r.serving == r.next {
		r.headUntil = now + lineLease
	}
	ticket = r.next
	r.next++
	return r, ticket, false
}

// lineTurn is where a ticket stands.
type lineTurn uint8

const (
	lineBehind lineTurn = iota // others are ahead of it
	lineHead                   // its turn: it may take a slot
	lineLost                   // skipped (its turn lapsed) or unknown (the record was reused)
)

// turn is where ticket stands at now; the head's turn is renewed.
func (r lineRec) turn(found bool, ticket uint64, now int64) (lineRec, lineTurn) {
	if !found {
		return r, lineLost
	}
	r = r.settle(now)
	switch {
	case ticket < r.serving || ticket >= r.next:
		return r, lineLost
	case ticket == r.serving:
		r.headUntil = now + lineLease
		return r, lineHead
	}
	return r, lineBehind
}

// leave takes ticket out of the line (admitted, or given up): the head's
// successor's turn starts; a ticket behind is marked gone when among the
// 64 oldest (else it lapses at the head). write: the record changed.
func (r lineRec) leave(found bool, ticket uint64, now int64) (rec lineRec, write bool) {
	if !found || ticket < r.serving || ticket >= r.next {
		return r, false
	}
	if d := ticket - r.serving; d < 64 {
		r.gone |= 1 << d
	}
	return r.settle(now), true
}

// waiting: someone waits in the line at now.
func (r lineRec) waiting(found bool, now int64) bool {
	return found && r.settle(now).serving < r.next
}

// slotLines is this Plugin's view of the line records in shared data.
type slotLines struct {
	t      *slots.Table
	prefix string
	s      slots.Slot
	buf    [lineLen]byte
}

func newSlotLines(sd slots.SharedData, rootID string, maxKeys int) (*slotLines, error) {
	prefix := Name + ":line:v1:" + rootID + ":"
	t, err := slots.New(sd, prefix, maxKeys, slots.Layout{RecordLen: lineLen, Free: lineFree, Before: lineBefore})
	if err != nil {
		return nil, err
	}
	t.WithSeed(SeedKey)
	return &slotLines{t: t, prefix: prefix}, nil
}

// update changes id's line by f (a pure function of the record as read;
// found: the key has one).
func (l *slotLines) update(id uint64, now int64, f func(r lineRec, found bool) (lineRec, bool)) error {
	_, _, _, err := l.t.Update(&l.s, id, now, func(s *slots.Slot) ([]byte, bool) {
		var r lineRec
		if s.Found {
			r = decodeLine(s.Record())
		}
		r, write := f(r, s.Found)
		return r.encode(l.buf[:]), write
	})
	return err
}

// join gives a ticket of id's line (ok false: the line is full).
func (l *slotLines) join(id uint64, now int64, max int) (ticket uint64, ok bool, err error) {
	full := false
	err = l.update(id, now, func(r lineRec, found bool) (lineRec, bool) {
		r, ticket, full = r.join(found, now, max)
		return r, !full
	})
	return ticket, !full, err
}

// turn is where ticket stands in id's line.
func (l *slotLines) turn(id, ticket uint64, now int64) (lineTurn, error) {
	var at lineTurn
	err := l.update(id, now, func(r lineRec, found bool) (lineRec, bool) {
		r, at = r.turn(found, ticket, now)
		return r, at == lineHead
	})
	return at, err
}

// leave takes ticket out of id's line.
func (l *slotLines) leave(id, ticket uint64, now int64) error {
	return l.update(id, now, func(r lineRec, found bool) (lineRec, bool) {
		return r.leave(found, ticket, now)
	})
}

// waiting: someone waits in id's line (false when it cannot be read).
func (l *slotLines) waiting(id uint64, now int64) bool {
	if l.t.Load(&l.s, id, now) != nil {
		return false
	}
	return l.s.Found && decodeLine(l.s.Record()).waiting(true, now)
}

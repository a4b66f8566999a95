package store

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

const (
	// RecordLen is one bucket's record: bucket.State (16), FullAt (8).
	RecordLen = bucket.EncodedLen + 8
	// MaxAttempts bounds the read-decide-write attempts per bucket per decision.
	MaxAttempts = slots.MaxAttempts
)

// Request is one bucket of a decision.
type Request struct {
	ID    uint64 // bucket identity: hash of rule and key values (0 is mapped to 1)
	Limit bucket.Limit
	Cost  float64
	// MaxWait > 0 lets Decide reserve the cost when the bucket is short
	// (bucket.Limit.Reserve): the decision's Wait says how long to hold
	// the request.
	MaxWait time.Duration
	// GoesAt, in a Refund, is when the request that took Cost was to go
	// on (the decision's now plus its Wait): before then the refund is
	// bucket.Limit.Cancel, which gives back only what no later holder
	// counts on. 0: a plain refund.
	GoesAt int64
}

// Outcome reports what a decision did besides deciding.
type Outcome struct {
	Retries   int // CAS writes that lost a race
	Evictions int // buckets evicted before they were full
	Refunds   int // buckets refunded because a later one rejected
}

// Table is a bounded table of buckets in shared data. Build it with New.
type Table struct {
	t    *slots.Table
	refs []slotRef
	rec  [RecordLen]byte // scratch: a record being written
}

// slotRef is where phase one found a request's bucket.
type slotRef struct {
	slot   slots.Slot
	before bucket.State
	after  bucket.State
	fullAt int64
	goesAt int64 // when the decision's request goes on (now + its Wait)
}

// layout is a bucket record's: free once full (a full bucket and a new one
// decide alike); evicted closest to full, buckets in debt last.
var layout = slots.Layout{
	RecordLen: RecordLen,
	Free:      func(rec []byte, now int64) bool { return fullAt(rec) <= now },
	Before: func(a, b []byte, _ int64) bool {
		// A bucket left in debt by its last write (a cost known from the
		// response) is evicted only when every bucket of the group is:
		// evicting it would forgive its debt on top of a burst.
		if da, db := state(a).Tokens < 0, state(b).Tokens < 0; da != db {
			return db
		}
		return fullAt(a) < fullAt(b)
	},
}

func fullAt(rec []byte) int64 { return int64(binary.LittleEndian.Uint64(rec[bucket.EncodedLen:])) }

// state decodes a record's bucket; a damaged one starts afresh.
func state(rec []byte) bucket.State {
	if rec == nil {
		return bucket.State{}
	}
	st, err := bucket.DecodeState(rec[:bucket.EncodedLen])
	if err != nil {
		return bucket.State{}
	}
	return st
}

// New returns a Table of at least maxKeys buckets (rounded up to whole
// groups) whose shared-data keys start with prefix. Tables with the same
// prefix and size see the same buckets.
func New(sd slots.SharedData, prefix string, maxKeys int) (*Table, error) {
	if maxKeys < 1 {
		return nil, errors.New("store: max keys must be >= 1, got " + strconv.Itoa(maxKeys))
	}
	t, err := slots.New(sd, prefix, maxKeys, layout)
	if err != nil {
		return nil, err
	}
	return &Table{t: t}, nil
}

// WithSeed places buckets by the seed stored under key (slots.LoadSeed) and
// returns t.
func (t *Table) WithSeed(key string) *Table {
	t.t.WithSeed(key)
	return t
}

// Groups is the number of shared-data keys the table owns.
func (t *Table) Groups() int { return t.t.Groups() }

// load reads id's bucket into ref.
func (t *Table) load(ref *slotRef, id uint64, now int64) error {
	*ref = slotRef{slot: ref.slot}
	if err := t.t.Load(&ref.slot, id, now); err != nil {
		return err
	}
	ref.before = state(ref.slot.Record())
	return nil
}

// write stores state s into ref's slot.
func (t *Table) write(ref *slotRef, s bucket.State, full int64) error {
	return t.t.Write(&ref.slot, t.encode(s, full))
}

// encode is the record of state s, full at full (in t's scratch).
func (t *Table) encode(s bucket.State, full int64) []byte {
	s.AppendBinary(t.rec[:0])
	binary.LittleEndian.PutUint64(t.rec[bucket.EncodedLen:], uint64(full))
	return t.rec[:]
}

// Decide takes each request's cost from its bucket, all or nothing, at time
// now (Unix ns). out must have len(reqs) elements; out[i] receives the
// decision for reqs[i]. When any bucket rejects, ok is false, no bucket keeps
// a consumed token, and the rejecting buckets' decisions say so (the others'
// report their tokens as they are). On an error every bucket is left as it was.
func (t *Table) Decide(now int64, reqs []Request, out []bucket.Decision) (ok bool, o Outcome, err error) {
	if cap(t.refs) < len(reqs) {
		t.refs = make([]slotRef, len(reqs))
	}
	refs := t.refs[:len(reqs)]
	ok = true
	for i := range reqs {
		if err := t.load(&refs[i], reqs[i].ID, now); err != nil {
			return false, o, err
		}
		if !t.decide(&refs[i], &reqs[i], now, &out[i]) {
			ok = false
		}
	}
	if !ok {
		return false, o, nil
	}
	for i := range reqs {
		allowed, err := t.commit(&refs[i], &reqs[i], now, &out[i], &o)
		if err != nil || !allowed {
			o.Refunds += t.refund(refs[:i], reqs[:i], now)
			if err != nil {
				return false, o, err
			}
			return false, o, nil
		}
	}
	for i := range refs {
		if refs[i].slot.Evicted {
			o.Evictions++
		}
	}
	return true, o, nil
}

// decide computes the decision for ref's bucket; it returns whether it allows.
func (t *Table) decide(ref *slotRef, req *Request, now int64, d *bucket.Decision) bool {
	var next bucket.State
	next, *d = req.Limit.Reserve(ref.before, now, req.Cost, req.MaxWait)
	ref.after = next
	ref.fullAt = req.Limit.FullAt(next)
	ref.goesAt = now + int64(d.Wait)
	return d.Allowed
}

// commit writes ref's bucket, re-reading and deciding again after lost races.
func (t *Table) commit(ref *slotRef, req *Request, now int64, d *bucket.Decision, o *Outcome) (bool, error) {
	for attempt := 1; ; attempt++ {
		err := t.write(ref, ref.after, ref.fullAt)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, slots.ErrCASMismatch) {
			return false, err
		}
		o.Retries++
		if attempt == MaxAttempts {
			return false, slots.ErrContention
		}
		if err := t.load(ref, req.ID, now); err != nil {
			return false, err
		}
		if !t.decide(ref, req, now, d) {
			return false, nil
		}
	}
}

// Refund gives back the cost of requests that an earlier Decide admitted
// (for a request that a later check, such as the limit service, rejected).
// It returns how many buckets it refunded; see refund.
func (t *Table) Refund(now int64, reqs []Request) int {
	if cap(t.refs) < len(reqs) {
		t.refs = make([]slotRef, len(reqs))
	}
	refs := t.refs[:len(reqs)]
	for i := range refs {
		refs[i].goesAt = reqs[i].GoesAt
	}
	return t.refund(refs, reqs, now)
}

// refund gives back the cost of buckets already written. It returns how many
// it refunded; a refund that cannot be written within MaxAttempts is dropped
// (the bucket keeps the token: under-admission, never over-admission).
func (t *Table) refund(refs []slotRef, reqs []Request, now int64) int {
	n := 0
	for i := range refs {
		req := &reqs[i]
		_, wrote, _, err := t.t.Update(&refs[i].slot, req.ID, now, func(s *slots.Slot) ([]byte, bool) {
			if !s.Found {
				return nil, false // the bucket is gone: nothing to give back
			}
			st := req.Limit.Cancel(state(s.Record()), now, req.Cost, refs[i].goesAt)
			return t.encode(st, req.Limit.FullAt(st)), true
		})
		if err == nil && wrote {
			n++
		}
	}
	return n
}

// Charge applies each request's Cost to its bucket as a signed adjustment
// (bucket.Limit.Charge): a positive cost takes more tokens, into debt down
// to −Burst; a negative one gives tokens back. It is for costs known only
// after the request was admitted (the response). A charge cannot be
// refused, so each bucket is written on its own, in a CAS loop of at most
// MaxAttempts. A debit of a bucket the table no longer holds (full and
// reclaimed, or evicted) starts it from full; a refund of one is dropped
// (a missing bucket is already full). It returns how many buckets it wrote
// and the first error; a bucket whose write failed keeps its state (for a
// refund, under-admission; for a debit, the charge is lost, counted by the
// caller). When out is not nil (len(reqs) elements), out[i] receives what
// reqs[i]'s bucket holds after the charge, as an admitted Decision of cost 0
// (bucket.Limit.ReportAt): the response headers of a charged request.
func (t *Table) Charge(now int64, reqs []Request, out []bucket.Decision) (charged int, o Outcome, err error) {
	if cap(t.refs) < 1 {
		t.refs = make([]slotRef, 1)
	}
	ref := &t.refs[0]
	for i := range reqs {
		req := &reqs[i]
		rec, wrote, retries, e := t.t.Update(&ref.slot, req.ID, now, func(s *slots.Slot) ([]byte, bool) {
			if !(req.Cost > 0 || req.Cost < 0) || !s.Found && req.Cost < 0 {
				return nil, false // nothing to charge, or nothing to give back
			}
			st := req.Limit.Charge(state(s.Record()), now, req.Cost)
			return t.encode(st, req.Limit.FullAt(st)), true
		})
		o.Retries += retries
		after := state(ref.slot.Record()) // as read: the report when nothing was written
		switch {
		case e != nil:
			err = firstErr(err, e)
		case wrote:
			after = state(rec)
			charged++
			if ref.slot.Evicted {
				o.Evictions++
			}
		}
		if out != nil {
			at := max(now, after.At)
			out[i] = req.Limit.ReportAt(req.Limit.Tokens(after, at), now, at-now, 0, true)
		}
	}
	return charged, o, err
}

// firstErr returns the first non-nil error.
func firstErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}

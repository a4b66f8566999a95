// Package lease keeps the token leases of one Envoy in proxy-wasm shared
// data: per cluster bucket, the tokens the limit service granted this Envoy
// and not yet spent, with what the plugin needs to refill, return and
// report them. It is pure: the host's shared data is a slots.SharedData,
// time is passed in.
//
// # Model
//
// A Record is one lease. Requests spend its Tokens (Spend), all of a
// request's leases or none, through compare-and-swap writes like package
// store's, so the lease is exact across Envoy's workers: a token is spent
// once. Tokens enter a lease only from a grant of the limit service (Add),
// and leave it only by being spent or handed back (Take), so an Envoy never
// admits more than the service granted it.
//
// A quota's lease belongs to one calendar period (Record.Period: the one
// the service answered for, which the call carried): its tokens are spent
// only by requests of that period (Spend.Period), a grant of a later
// period replaces what an earlier one left, a grant of an earlier period
// than the lease holds is dropped, and at the boundary what the lease
// holds of the ended period is dropped, never handed back (Policy.Return):
// the period's counter restarted. So every token spent in a period came
// from that period's remainder in the limit service.
//
// Refills are single-flight per lease across the workers: the write that
// spends a lease below half its Size also claims Pending (the moment the
// refill call left), and no other write claims it until the answer clears
// it (Add or Settle) or it is older than a call can be (stale).
//
// # Memory
//
// A Table is a bounded table of package slots, as package store's is: a
// fixed set of shared-data keys, whatever the number of client keys. A
// slot is free when its lease is empty, expired and has no call in flight;
// when a group has no free slot, the lease that expires first is evicted
// and its unspent tokens are lost to this Envoy (never granted twice: the
// limit service refills them at its own rate). Evictions are counted.
//
// A Table is used by one VM (one Envoy worker) and is not safe for
// concurrent use; the VMs share leases only through shared data.
package lease

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"

	"github.com/ratelimit-wasm/tokenbucket/engine/slots"
)

// Record is one lease: what this Envoy holds of one cluster bucket.
type Record struct {
	Tokens  float64 // granted and not yet spent
	Expires int64   // Unix ns after which unspent tokens go back (the last grant + ttl)
	Pending int64   // Unix ns at which a refill or return call left; 0: none in flight
	Size    float64 // tokens the next refill asks for
	Rate    float64 // this Envoy's recent spend, tokens per second
	Mark    int64   // start of the spend window behind Rate
	Spent   float64 // tokens spent since Mark
	// What the last answer of the limit service said of the global bucket.
	Remaining float64 // its tokens
	ResetAt   int64   // Unix ns at which it is full again
	RetryAt   int64   // the bucket refused: when it will hold the cost asked (Retry-After)
	AskAt     int64   // the bucket refused: until then, a request whose cost it could not hold is refused without a call
	DownUntil int64   // the call failed: until then, a request that finds no token gets failure_mode without a call
	Answered  int64   // Unix ns of the last answer (Remaining was the global bucket's tokens then)
	// Period is, for a quota, the end (Unix ms, as the wire carries it) of
	// the calendar period whose remainder granted Tokens: the period the
	// limit service answered for, which the call carried. Tokens are spent
	// only in that period (Held). 0 for a token bucket.
	Period int64
}

// Held is what r holds for a request of period (Spend.Period): its Tokens
// when they are that period's, else none (a lease of an ended period is
// worthless: the period's counter restarted).
func (r *Record) Held(period int64) float64 {
	if r.Period != period {
		return 0
	}
	return r.Tokens
}

// RecordLen is a lease record: the fields of Record in order, 8 bytes each.
const RecordLen = 14 * 8

// MaxAttempts bounds the read-modify-write attempts of one update.
const MaxAttempts = slots.MaxAttempts

// Table is a bounded table of leases in shared data. Build it with New.
type Table struct {
	t    *slots.Table
	slot slots.Slot
	rec  [RecordLen]byte // scratch: a record being written
	// Evictions counts leases evicted with tokens or a call in flight.
	Evictions int
}

// layout is a lease record's: free once empty, expired and with no call in
// flight; evicted the one that expires first.
var layout = slots.Layout{
	RecordLen: RecordLen,
	Free:      func(rec []byte, now int64) bool { r := decode(rec); return Free(&r, now) },
	Before:    func(a, b []byte, _ int64) bool { return decode(a).Expires < decode(b).Expires },
}

// New returns a Table of at least maxLeases leases whose shared-data keys
// start with prefix.
func New(sd slots.SharedData, prefix string, maxLeases int) (*Table, error) {
	if maxLeases < 1 {
		return nil, errors.New("lease: max leases must be >= 1, got " + strconv.Itoa(maxLeases))
	}
	t, err := slots.New(sd, prefix, maxLeases, layout)
	if err != nil {
		return nil, err
	}
	return &Table{t: t}, nil
}

// WithSeed places leases by the seed stored under key (slots.LoadSeed) and
// returns t.
func (t *Table) WithSeed(key string) *Table {
	t.t.WithSeed(key)
	return t
}

// Get returns id's lease as stored (the zero Record when there is none).
func (t *Table) Get(id uint64, now int64) (Record, error) {
	if err := t.t.Load(&t.slot, id, now); err != nil {
		return Record{}, err
	}
	return record(&t.slot), nil
}

// record is the lease a slot holds (the zero Record for a new one).
func record(s *slots.Slot) Record {
	if b := s.Record(); b != nil {
		return decode(b)
	}
	return Record{}
}

// Change is what one Update did, as the attempt that counted saw it: the
// record it read (Before), the record it wrote (After; Before when it wrote
// nothing), whether it wrote, and whether the write evicted another lease.
type Change struct {
	Before, After Record
	Wrote         bool
	Evicted       bool
}

// Update reads id's lease and writes f(record) back when f says so,
// retrying from the read when another worker wrote the group in between
// (at most MaxAttempts times). f must be a pure function of the record: it
// may run several times, and only the attempt whose write succeeded (or
// that declined to write) is reported. Whatever a caller does after an
// update (send a return, a refill) it derives from the Change, never from
// what an earlier attempt of f saw.
func (t *Table) Update(id uint64, now int64, f func(Record) (Record, bool)) (Change, error) {
	rec, wrote, _, err := t.t.Update(&t.slot, id, now, func(s *slots.Slot) ([]byte, bool) {
		after, write := f(record(s))
		if !write {
			return nil, false
		}
		encode(t.rec[:], &after)
		return t.rec[:], true
	})
	if err != nil {
		return Change{}, err
	}
	ch := Change{Before: record(&t.slot)}
	ch.After = ch.Before
	if wrote {
		ch.After, ch.Wrote, ch.Evicted = decode(rec), true, t.slot.Evicted
		if ch.Evicted {
			t.Evictions++
		}
	}
	return ch, nil
}

// Claimed reports whether the change claimed the lease's call marker: it
// wrote a Pending that the lease did not have. The claim is ch.After.Pending;
// only an answer to that call clears it (Release).
func (ch Change) Claimed() bool {
	return ch.Wrote && ch.After.Pending != 0 && ch.After.Pending != ch.Before.Pending
}

// Release clears r's call marker if it is still claim (the stamp a claiming
// Change wrote): an answer never clears the marker of another call.
func Release(r *Record, claim int64) {
	if claim != 0 && r.Pending == claim {
		r.Pending = 0
	}
}

// Spend is one lease a request spends from: Cost tokens of lease ID, whose
// calls take at most Stale nanoseconds (after that a claimed refill counts
// as lost: see InFlight), in Period (a quota's, as Record.Period; 0 for a
// token bucket): only tokens of that period are spent, and a refund goes
// back only to a lease that still holds that period's tokens.
type Spend struct {
	ID     uint64
	Cost   float64
	Stale  int64
	Period int64
}

// Result is what Spend did to one lease.
type Result struct {
	Record  Record // after the spend (or as found, when the request did not spend)
	Lacked  bool   // the lease held less than the cost
	Refill  int64  // this spend claimed the lease's refill (the claim's stamp): the caller sends it; 0: none
	Evicted bool   // the spend's write evicted another lease
}

// Spend takes each spend's cost from its lease, all or none: when a lease
// lacks its cost, the leases already spent are refunded, ok is false, and
// out tells every lease that lacks. out[i] receives spend i's result
// (len(out) == len(spends)). A spend that leaves its lease below half its
// Size claims the refill when none is in flight.
func (t *Table) Spend(now int64, spends []Spend, out []Result) (ok bool, err error) {
	for i, sp := range spends {
		ch, err := t.Update(sp.ID, now, func(r Record) (Record, bool) { return spend(r, now, sp) })
		out[i] = Result{Record: ch.After, Lacked: err == nil && !ch.Wrote, Evicted: ch.Evicted}
		if ch.Claimed() {
			out[i].Refill = ch.After.Pending
		}
		if err != nil || out[i].Lacked {
			t.refund(now, spends[:i], out[:i])
			if err == nil {
				err = t.look(now, spends[i+1:], out[i+1:])
			}
			return false, err
		}
	}
	return true, nil
}

// spend is one lease's part of Spend, a pure function of the record.
func spend(r Record, now int64, sp Spend) (Record, bool) {
	if r.Held(sp.Period)+1e-9 < sp.Cost {
		return r, false
	}
	r.Tokens = max(r.Tokens-sp.Cost, 0)
	r.Spent += sp.Cost
	if r.Tokens < r.Size/2 && !InFlight(&r, now, sp.Stale) {
		r.Pending = max(now, 1)
	}
	return r, true
}

// look fills out with the leases of spends as they are, and which lack
// their cost, writing nothing: the rest of a request that is already short.
func (t *Table) look(now int64, spends []Spend, out []Result) error {
	for i, sp := range spends {
		r, err := t.Get(sp.ID, now)
		if err != nil {
			return err
		}
		out[i] = Result{Record: r, Lacked: r.Held(sp.Period)+1e-9 < sp.Cost}
	}
	return nil
}

// Refund gives spends back to their leases (a request that a later check
// rejected). A refund that cannot be written, or whose lease now holds
// another period's tokens (a grant of the next period landed meanwhile),
// is dropped: under-admission.
func (t *Table) Refund(now int64, spends []Spend) {
	t.refund(now, spends, nil)
}

// refund gives spends back; a refill a spend claimed (out[i].Refill) was
// never sent and will not be, so its marker is released, if still its own.
func (t *Table) refund(now int64, spends []Spend, out []Result) {
	for i, sp := range spends {
		var claim int64
		if out != nil {
			claim, out[i].Refill = out[i].Refill, 0
		}
		_, _ = t.Update(sp.ID, now, func(r Record) (Record, bool) {
			if r.Period == sp.Period {
				r.Tokens += sp.Cost
				r.Spent = max(r.Spent-sp.Cost, 0)
			}
			Release(&r, claim)
			return r, true
		})
	}
}

// InFlight reports whether r has a refill or return call in flight: one left
// less than stale nanoseconds ago. A call's answer arrives within its
// timeout, if only as a failure, and clears Pending; stale (the timeout and
// a margin) covers an answer that never lands, such as one for a plugin
// configuration replaced while its call was in flight. A marker further ahead of now than stale was
// set before the clock stepped back: it is stale too.
func InFlight(r *Record, now, stale int64) bool {
	return r.Pending != 0 && within(r.Pending, now, stale)
}

// within reports whether the marker at is less than span away from now,
// either side: every marker of a Record is set at most its span ahead of
// the time it was set, so one further ahead outlived a backward step of the
// clock and is ignored, rather than holding the lease for the step's length.
func within(at, now, span int64) bool { return at-now < span && now-at < span }

// expired reports whether an expiry set at most ttl ahead has passed, or
// lies further ahead than ttl (it was set before a backward clock step).
func expired(at, now, ttl int64) bool { return at <= now || at-now > ttl }

// maxStale is the longest a call may be in flight (config bounds a
// service's timeout at 60 s), and maxTTL the longest a grant may stay
// (config's ttl_ms bound).
const (
	maxStale = 61e9
	maxTTL   = 60e9
)

// Free reports whether a lease can be forgotten: nothing in it, no call in
// flight, expired.
func Free(r *Record, now int64) bool {
	return r.Tokens <= 0 && !InFlight(r, now, maxStale) && expired(r.Expires, now, maxTTL)
}

func encode(b []byte, r *Record) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], math.Float64bits(r.Tokens))
	le.PutUint64(b[8:], uint64(r.Expires))
	le.PutUint64(b[16:], uint64(r.Pending))
	le.PutUint64(b[24:], math.Float64bits(r.Size))
	le.PutUint64(b[32:], math.Float64bits(r.Rate))
	le.PutUint64(b[40:], uint64(r.Mark))
	le.PutUint64(b[48:], math.Float64bits(r.Spent))
	le.PutUint64(b[56:], math.Float64bits(r.Remaining))
	le.PutUint64(b[64:], uint64(r.ResetAt))
	le.PutUint64(b[72:], uint64(r.RetryAt))
	le.PutUint64(b[80:], uint64(r.DownUntil))
	le.PutUint64(b[88:], uint64(r.AskAt))
	le.PutUint64(b[96:], uint64(r.Answered))
	le.PutUint64(b[104:], uint64(r.Period))
}

// decode reads a record; a damaged one (NaN, infinite or negative amounts)
// reads as empty, so a bad value can never grant tokens.
func decode(b []byte) Record {
	le := binary.LittleEndian
	f := func(o int) float64 { return math.Float64frombits(le.Uint64(b[o:])) }
	r := Record{
		Tokens: f(0), Expires: int64(le.Uint64(b[8:])), Pending: int64(le.Uint64(b[16:])),
		Size: f(24), Rate: f(32), Mark: int64(le.Uint64(b[40:])), Spent: f(48),
		Remaining: f(56), ResetAt: int64(le.Uint64(b[64:])), RetryAt: int64(le.Uint64(b[72:])),
		DownUntil: int64(le.Uint64(b[80:])), AskAt: int64(le.Uint64(b[88:])), Answered: int64(le.Uint64(b[96:])),
		Period: int64(le.Uint64(b[104:])),
	}
	for _, x := range []float64{r.Tokens, r.Size, r.Rate, r.Spent, r.Remaining} {
		if !(x >= 0 && x <= math.MaxFloat64) {
			return Record{}
		}
	}
	return r
}

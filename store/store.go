package store

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unsafe"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
)

// SharedData is the host's shared key/value store with Envoy's semantics: Get
// returns ErrNotFound for a missing key; Set fails with ErrCASMismatch only when
// the key exists, cas != 0 and cas differs from the key's current CAS.
type SharedData interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// Errors a SharedData returns, and ErrContention.
var (
	ErrNotFound    = errors.New("store: key not found")
	ErrCASMismatch = errors.New("store: cas mismatch")
	// ErrContention means a bucket's write lost the CAS race MaxAttempts times.
	ErrContention = errors.New("store: too much contention")
)

const (
	// SlotsPerGroup is the number of buckets one shared-data key holds.
	SlotsPerGroup = 4
	// RecordLen is one slot: fingerprint (8), bucket.State (16), FullAt (8).
	RecordLen = 8 + bucket.EncodedLen + 8
	// GroupLen is the size of one shared-data value.
	GroupLen = SlotsPerGroup * RecordLen
	// MaxAttempts bounds the read-decide-write attempts per bucket per decision.
	MaxAttempts = 32
	// noCAS is the creation CAS used before this Table has read any value.
	noCAS = math.MaxUint32
)

var emptyGroup [GroupLen]byte

// Request is one bucket of a decision.
type Request struct {
	ID    uint64 // bucket identity: hash of rule and key values (0 is mapped to 1)
	Limit bucket.Limit
	Cost  float64
}

// Outcome reports what a decision did besides deciding.
type Outcome struct {
	Retries   int // CAS writes that lost a race
	Evictions int // buckets evicted before they were full
	Refunds   int // buckets refunded because a later one rejected
}

// Table is a bounded table of buckets in shared data. Build it with New.
type Table struct {
	sd      SharedData
	prefix  string
	groups  uint64
	seed    uint64 // placement (seed.go); 0 until loaded from seedKey
	seedKey string
	lastCAS uint32 // CAS of the latest value read, for creating keys
	key     []byte // scratch: group key
	val     []byte // scratch: group value being written
	slots   []slotRef
}

// slotRef is where phase one found a request's bucket.
type slotRef struct {
	id      uint64
	group   uint64
	cas     uint32 // for a missing key: the CAS of an earlier read (see the package doc)
	slot    int
	found   bool // the slot holds this bucket (else it is free, full or evicted)
	before  bucket.State
	after   bucket.State
	fullAt  int64
	value   []byte // the group's value as read (a copy)
	evicted bool
}

// New returns a Table of at least maxKeys buckets (rounded up to whole
// groups) whose shared-data keys start with prefix. Tables with the same
// prefix and size see the same buckets.
func New(sd SharedData, prefix string, maxKeys int) (*Table, error) {
	if maxKeys < 1 {
		return nil, errors.New("store: max keys must be >= 1, got " + strconv.Itoa(maxKeys))
	}
	groups := uint64((maxKeys + SlotsPerGroup - 1) / SlotsPerGroup)
	return &Table{
		sd:      sd,
		prefix:  prefix + strconv.FormatUint(groups, 10) + ":",
		groups:  groups,
		lastCAS: noCAS,
	}, nil
}

// WithSeed places buckets by the seed stored under key (LoadSeed), read or
// created at the table's first use, and returns t. Every Table over the same
// shared data must use the same key. A seed that cannot be read fails that
// use, as any shared-data error does, and is tried again at the next.
func (t *Table) WithSeed(key string) *Table {
	t.seedKey = key
	return t
}

// Decide takes each request's cost from its bucket, all or nothing, at time
// now (Unix ns). out must have len(reqs) elements; out[i] receives the
// decision for reqs[i]. When any bucket rejects, ok is false, no bucket keeps
// a consumed token, and the rejecting buckets' decisions say so (the others'
// report their tokens as they are). On an error every bucket is left as it was.
func (t *Table) Decide(now int64, reqs []Request, out []bucket.Decision) (ok bool, o Outcome, err error) {
	if cap(t.slots) < len(reqs) {
		t.slots = make([]slotRef, len(reqs))
	}
	refs := t.slots[:len(reqs)]
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
		if refs[i].evicted {
			o.Evictions++
		}
	}
	return true, o, nil
}

// decide computes the decision for ref's bucket; it returns whether it allows.
func (t *Table) decide(ref *slotRef, req *Request, now int64, d *bucket.Decision) bool {
	var next bucket.State
	next, *d = req.Limit.Take(ref.before, now, req.Cost)
	ref.after = next
	ref.fullAt = req.Limit.FullAt(next)
	return d.Allowed
}

// commit writes ref's bucket, re-reading and deciding again after lost races.
func (t *Table) commit(ref *slotRef, req *Request, now int64, d *bucket.Decision, o *Outcome) (bool, error) {
	for attempt := 1; ; attempt++ {
		err := t.write(ref, ref.after, ref.fullAt)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return false, err
		}
		o.Retries++
		if attempt == MaxAttempts {
			return false, ErrContention
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
	if cap(t.slots) < len(reqs) {
		t.slots = make([]slotRef, len(reqs))
	}
	return t.refund(t.slots[:len(reqs)], reqs, now)
}

// refund gives back the cost of buckets already written. It returns how many
// it refunded; a refund that cannot be written within MaxAttempts is dropped
// (the bucket keeps the token: under-admission, never over-admission).
func (t *Table) refund(refs []slotRef, reqs []Request, now int64) int {
	n := 0
	for i := range refs {
		for attempt := 0; attempt < MaxAttempts; attempt++ {
			if err := t.load(&refs[i], reqs[i].ID, now); err != nil {
				break
			}
			if !refs[i].found {
				break // the bucket is gone: nothing to give back
			}
			s := reqs[i].Limit.Refund(refs[i].before, now, reqs[i].Cost)
			err := t.write(&refs[i], s, reqs[i].Limit.FullAt(s))
			if err == nil {
				n++
				break
			}
			if !errors.Is(err, ErrCASMismatch) {
				break
			}
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
// (bucket.Limit.Report): the response headers of a charged request.
func (t *Table) Charge(now int64, reqs []Request, out []bucket.Decision) (charged int, o Outcome, err error) {
	if cap(t.slots) < 1 {
		t.slots = make([]slotRef, 1)
	}
	ref := &t.slots[0]
	for i := range reqs {
		req := &reqs[i]
		report := func(s bucket.State) {
			if out != nil {
				at := max(now, s.At)
				out[i] = req.Limit.Report(req.Limit.Tokens(s, at), at-now, 0, true)
			}
		}
		report(bucket.State{})
		for attempt := 1; ; attempt++ {
			if e := t.load(ref, req.ID, now); e != nil {
				err = firstErr(err, e)
				break
			}
			if ref.found {
				report(ref.before)
			}
			if !(req.Cost > 0 || req.Cost < 0) || !ref.found && req.Cost < 0 {
				break // nothing to charge (the report is the bucket as it is), or nothing to give back
			}
			s := req.Limit.Charge(ref.before, now, req.Cost)
			e := t.write(ref, s, req.Limit.FullAt(s))
			if e == nil {
				report(s)
				charged++
				if ref.evicted {
					o.Evictions++
				}
				break
			}
			if !errors.Is(e, ErrCASMismatch) {
				err = firstErr(err, e)
				break
			}
			o.Retries++
			if attempt == MaxAttempts {
				err = firstErr(err, ErrContention)
				break
			}
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

// groupKey returns the shared-data key of group g. The string aliases t.key
// and is valid until the next call: hosts copy keys.
func (t *Table) groupKey(g uint64) string {
	t.key = append(t.key[:0], t.prefix...)
	t.key = strconv.AppendUint(t.key, g, 10)
	return unsafe.String(unsafe.SliceData(t.key), len(t.key))
}

// load reads id's group and finds the slot for id: its own, else an empty or
// full one, else the one closest to full among the buckets not in debt, else
// the one closest to full (evicting it).
func (t *Table) load(ref *slotRef, id uint64, now int64) error {
	if id == 0 {
		id = 1
	}
	if t.seed == 0 && t.seedKey != "" {
		seed, err := LoadSeed(t.sd, t.seedKey)
		if err != nil {
			return err
		}
		t.seed = seed
	}
	*ref = slotRef{id: id, group: Place(id, t.seed, t.groups), value: ref.value[:0]}
	v, cas, err := t.sd.Get(t.groupKey(ref.group))
	switch {
	case errors.Is(err, ErrNotFound):
		// Any worker that creates the key from now on gets a CAS issued
		// after lastCAS, so writing with lastCAS cannot overwrite it.
		ref.cas, ref.value = t.lastCAS, nil
		return nil
	case err != nil:
		return err
	}
	t.lastCAS = cas
	ref.cas = cas
	if len(v) != GroupLen {
		// Not ours or damaged: treat as empty; the CAS write replaces it.
		ref.value = ref.value[:0]
		return nil
	}
	ref.value = append(ref.value, v...)
	free, oldest := -1, -1
	var oldestFull int64
	oldestDebt := true
	for s := 0; s < SlotsPerGroup; s++ {
		rec := ref.value[s*RecordLen : (s+1)*RecordLen]
		fp := binary.LittleEndian.Uint64(rec)
		fullAt := int64(binary.LittleEndian.Uint64(rec[8+bucket.EncodedLen:]))
		st, err := bucket.DecodeState(rec[8 : 8+bucket.EncodedLen])
		if err != nil {
			st = bucket.State{} // damaged slot: start the bucket afresh
		}
		if fp == id {
			ref.slot, ref.before, ref.found = s, st, true
			return nil
		}
		if free < 0 && (fp == 0 || fullAt <= now) {
			free = s
		}
		// A bucket left in debt by its last write (a cost known from the
		// response) is evicted only when every bucket of the group is:
		// evicting it would forgive its debt on top of a burst.
		debt := st.Tokens < 0
		if oldest < 0 || oldestDebt && !debt || debt == oldestDebt && fullAt < oldestFull {
			oldest, oldestFull, oldestDebt = s, fullAt, debt
		}
	}
	if free >= 0 {
		ref.slot = free
	} else {
		ref.slot, ref.evicted = oldest, true
	}
	return nil
}

// write stores state s for ref's bucket into its group with the CAS of the
// read (or, for a missing key, the CAS of an earlier read: see the package doc).
func (t *Table) write(ref *slotRef, s bucket.State, fullAt int64) error {
	t.val = append(t.val[:0], ref.value...)
	if len(t.val) != GroupLen {
		t.val = append(t.val[:0], emptyGroup[:]...)
	}
	rec := t.val[ref.slot*RecordLen : (ref.slot+1)*RecordLen]
	binary.LittleEndian.PutUint64(rec, ref.id)
	s.AppendBinary(rec[8:8]) // fills rec[8:24] in place
	binary.LittleEndian.PutUint64(rec[8+bucket.EncodedLen:], uint64(fullAt))
	return t.sd.Set(t.groupKey(ref.group), t.val, ref.cas)
}

// Package slots is a bounded table of fixed-size records in proxy-wasm
// shared data, exact under concurrency: the one mechanism under package
// store (token buckets) and package lease (token leases). Each user is a
// thin layer with its record codec and its rule for reusing a slot.
//
// # Model
//
// Shared data is one process-wide key/value map, shared by every Envoy
// worker (each runs its own Wasm VM), with compare-and-swap writes and
// neither delete nor expiry: every key ever written stays for the life of
// the process. A Table therefore never creates a key per client. It owns a
// fixed set of Groups keys ("<prefix><groups>:<index>"), each holding
// SlotsPerGroup slots: an 8-byte fingerprint (the record's 64-bit identity)
// and the record. An identity lives in the group Place picks (its identity
// mixed with a per-process seed, seed.go), in the slot whose fingerprint is
// the identity. Host memory is bounded by Groups whatever the number of
// distinct identities.
//
// # Reuse and eviction
//
// Load finds an identity's slot: its own; else a free one (empty, or one
// whose record the Layout says may be reused); else the Layout's first
// victim, which is evicted (Slot.Evicted). A group value of another length
// (not ours, damaged) reads as empty, and the next write replaces it.
//
// # Exactness
//
// Every change reads a group and writes it back with the CAS the read
// returned; a write that loses a race re-reads and changes again (Update),
// at most MaxAttempts times, after which it fails with ErrContention and
// has written nothing. A missing group key is created with the CAS of a
// value this Table read earlier (docs/RATIONALE.md): Envoy's CAS counter is
// process-wide, so if another worker created the key after that read, the
// write fails with a CAS mismatch instead of silently overwriting it.
// Nothing is written at start-up.
//
// A Table is used by one VM (one Envoy worker) and is not safe for
// concurrent use; the VMs share state only through SharedData.
package slots

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unsafe"
)

// SharedData is the host's shared key/value store with Envoy's semantics:
// Get returns ErrNotFound for a missing key; Set fails with ErrCASMismatch
// only when the key exists, cas != 0 and cas differs from the key's current
// CAS (a set on a missing key always succeeds).
type SharedData interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// Errors a SharedData returns, and ErrContention.
var (
	ErrNotFound    = errors.New("shared data: key not found")
	ErrCASMismatch = errors.New("shared data: cas mismatch")
	// ErrContention means a write lost the CAS race MaxAttempts times.
	ErrContention = errors.New("shared data: too much contention")
)

const (
	// SlotsPerGroup is the number of records one shared-data key holds.
	SlotsPerGroup = 4
	// MaxAttempts bounds the read-modify-write attempts of one change.
	MaxAttempts = 32
	// noCAS is the creation CAS used before this Table has read any value.
	noCAS = math.MaxUint32
	fpLen = 8
)

// Layout is what a user of the table says about its records.
type Layout struct {
	// RecordLen is a record's length in bytes (after its fingerprint).
	RecordLen int
	// Free reports whether the slot holding rec may be taken by another
	// identity at now without changing any decision (a full bucket, an
	// empty expired lease).
	Free func(rec []byte, now int64) bool
	// Before reports whether the record a should be evicted before b when
	// no slot of a group is free.
	Before func(a, b []byte, now int64) bool
}

// Table is a bounded table of records in shared data. Build it with New.
type Table struct {
	sd      SharedData
	layout  Layout
	prefix  string
	groups  uint64
	seed    uint64 // placement (seed.go); 0 until loaded from seedKey
	seedKey string
	lastCAS uint32 // CAS of the latest value read, for creating keys
	key     []byte // scratch: group key
	val     []byte // scratch: group value being written
}

// New returns a Table of at least maxRecords records (rounded up to whole
// groups) whose shared-data keys start with prefix. Tables with the same
// prefix, size and layout see the same records.
func New(sd SharedData, prefix string, maxRecords int, l Layout) (*Table, error) {
	if maxRecords < 1 {
		return nil, errors.New("slots: max records must be >= 1, got " + strconv.Itoa(maxRecords))
	}
	if l.RecordLen < 1 || l.Free == nil || l.Before == nil {
		return nil, errors.New("slots: incomplete layout")
	}
	groups := uint64((maxRecords + SlotsPerGroup - 1) / SlotsPerGroup)
	return &Table{sd: sd, layout: l, prefix: prefix + strconv.FormatUint(groups, 10) + ":", groups: groups, lastCAS: noCAS}, nil
}

// WithSeed places records by the seed stored under key (LoadSeed), read or
// created at the table's first use, and returns t. Every Table over the
// same shared data must use the same key. A seed that cannot be read fails
// that use, as any shared-data error does, and is tried again at the next.
func (t *Table) WithSeed(key string) *Table {
	t.seedKey = key
	return t
}

// Groups is the number of shared-data keys the table owns.
func (t *Table) Groups() int { return int(t.groups) }

func (t *Table) groupLen() int { return SlotsPerGroup * (fpLen + t.layout.RecordLen) }

// Slot is where Load found an identity's record: its own slot (Found), a
// free one, or a victim's (Evicted).
type Slot struct {
	ID      uint64
	Found   bool
	Evicted bool
	group   uint64
	cas     uint32 // for a missing key: the CAS of an earlier read
	at      int
	value   []byte // the group as read (a copy); empty when missing or not ours
	recLen  int
}

// Record is the slot's record as read: the identity's own when Found, nil
// otherwise (a new record starts from its zero value).
func (s *Slot) Record() []byte {
	if !s.Found {
		return nil
	}
	off := s.at*(fpLen+s.recLen) + fpLen
	return s.value[off : off+s.recLen]
}

// groupKey returns the shared-data key of group g. The string aliases t.key
// and is valid until the next call: hosts copy keys.
func (t *Table) groupKey(g uint64) string {
	t.key = append(t.key[:0], t.prefix...)
	t.key = strconv.AppendUint(t.key, g, 10)
	return unsafe.String(unsafe.SliceData(t.key), len(t.key))
}

// Load reads id's group into s and finds id's slot (see the package doc).
// Identity 0 is stored as 1 (0 marks an empty slot).
func (t *Table) Load(s *Slot, id uint64, now int64) error {
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
	*s = Slot{ID: id, group: Place(id, t.seed, t.groups), value: s.value[:0], recLen: t.layout.RecordLen}
	v, cas, err := t.sd.Get(t.groupKey(s.group))
	switch {
	case errors.Is(err, ErrNotFound):
		// Any worker that creates the key from now on gets a CAS issued
		// after lastCAS, so writing with lastCAS cannot overwrite it.
		s.cas = t.lastCAS
		return nil
	case err != nil:
		return err
	}
	t.lastCAS, s.cas = cas, cas
	if len(v) != t.groupLen() {
		return nil // not ours or damaged: empty; the CAS write replaces it
	}
	s.value = append(s.value, v...)
	free, victim := -1, -1
	size := fpLen + t.layout.RecordLen
	for i := range SlotsPerGroup {
		b := s.value[i*size : (i+1)*size]
		fp, rec := binary.LittleEndian.Uint64(b), b[fpLen:]
		if fp == id {
			s.at, s.Found = i, true
			return nil
		}
		if free < 0 && (fp == 0 || t.layout.Free(rec, now)) {
			free = i
		}
		if victim < 0 || t.layout.Before(rec, s.value[victim*size+fpLen:(victim+1)*size], now) {
			victim = i
		}
	}
	if free >= 0 {
		s.at = free
	} else {
		s.at, s.Evicted = victim, true
	}
	return nil
}

// Write stores rec (RecordLen bytes) as s's record, with the CAS of the read
// (or, for a missing key, of an earlier read). It fails with ErrCASMismatch
// when another worker wrote the group since.
func (t *Table) Write(s *Slot, rec []byte) error {
	t.val = append(t.val[:0], s.value...)
	if len(t.val) != t.groupLen() {
		t.val = append(t.val[:0], make([]byte, t.groupLen())...)
	}
	size := fpLen + t.layout.RecordLen
	b := t.val[s.at*size : (s.at+1)*size]
	binary.LittleEndian.PutUint64(b, s.ID)
	copy(b[fpLen:], rec)
	return t.sd.Set(t.groupKey(s.group), t.val, s.cas)
}

// Update is the bounded read-modify-write loop: it loads id's slot into s,
// asks f for the record to write (f sees s: Found, Record()), and writes
// it, re-reading after a lost race, at most MaxAttempts times. f must be a
// pure function of the slot: it may run several times. On return s is the
// slot of the attempt that counted and rec what f made of it (written when
// wrote). retries counts the lost races.
func (t *Table) Update(s *Slot, id uint64, now int64, f func(s *Slot) (rec []byte, write bool)) (rec []byte, wrote bool, retries int, err error) {
	for range MaxAttempts {
		if err := t.Load(s, id, now); err != nil {
			return nil, false, retries, err
		}
		rec, write := f(s)
		if !write {
			return rec, false, retries, nil
		}
		err := t.Write(s, rec)
		if err == nil {
			return rec, true, retries, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return nil, false, retries, err
		}
		retries++
	}
	return nil, false, retries, ErrContention
}

package wire

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// Concurrency slots across a fleet (a "concurrency" rule of scope
// "cluster"): the service holds, per key, the slots out, each a lease with a
// TTL that the gateway renews while its request runs and releases when it
// ends. A slot is named by the caller (the service prefixes its caller's
// name, so a caller renews and releases only its own) and by the key's
// max_in_flight, which is part of the slot table's identity, as a bucket's
// limit is of the bucket's.
const (
	// MaxInFlight bounds a key's max_in_flight: it bounds what one slot
	// table holds (at most this many slots, each at most MaxSlotIDBytes
	// plus a caller's name).
	MaxInFlight = 10_000
	// MinSlotTTLMs and MaxSlotTTLMs bound a slot's ttl_ms: a renewal every
	// third of it must be practical, and a vanished gateway's slots block
	// others for at most MaxSlotTTLMs.
	MinSlotTTLMs = 1_000
	MaxSlotTTLMs = 600_000
	// MaxSlotIDBytes is the longest slot id.
	MaxSlotIDBytes = 64
	// MaxSlotBatch is the most slots one renew or release call carries.
	MaxSlotBatch = 256
)

// SlotKey is one key of an acquire call: its slot table, and the most slots
// it may have out.
type SlotKey struct {
	Key         string
	MaxInFlight int64
}

// AcquireRequest is one acquire call (POST /v1/slots/acquire), atomic over
// its keys: when every key has a slot free (or already holds ID), ID takes
// one in each, leased for TTLMs; otherwise none is taken. Acquiring again a
// slot the caller holds renews it and takes nothing more, so a retry after
// a lost answer never takes two.
type AcquireRequest struct {
	ID    string
	TTLMs int64
	Keys  []SlotKey
}

// AcquireAnswer is the answer to an AcquireRequest.
type AcquireAnswer struct {
	// Acquired reports whether every key gave a slot.
	Acquired bool
	// InFlight holds, per requested key in request order, the slots the
	// key has out after the call (expired ones not counted).
	InFlight []int64
}

// Slot names one slot a caller holds: the table (key and max_in_flight)
// and the slot's id.
type Slot struct {
	Key         string
	MaxInFlight int64
	ID          string
}

// SlotsRequest is a renew call (POST /v1/slots/renew: each slot's lease is
// pushed to TTLMs from now) or a release call (POST /v1/slots/release:
// TTLMs is 0, each slot is given back). Each slot is its own step: the call
// is not atomic across them, and needs not be.
type SlotsRequest struct {
	TTLMs int64
	Slots []Slot
}

// SlotState is what a renew or release call found of one slot.
type SlotState uint8

const (
	// SlotHeld: renew pushed the slot's lease; release gave it back.
	SlotHeld SlotState = iota
	// SlotRestored: renew found the slot gone (expired, or its table lost
	// by the store) and took it again, as the table had a slot free.
	SlotRestored
	// SlotLost: the slot was gone, and renew found no slot free to take it
	// again (or release had nothing to give back).
	SlotLost
)

var slotStates = [...]string{"held", "restored", "lost"}

// String returns the state as the wire writes it.
func (s SlotState) String() string {
	if int(s) < len(slotStates) {
		return slotStates[s]
	}
	return "SlotState(" + strconv.Itoa(int(s)) + ")"
}

// SlotsAnswer is the answer to a SlotsRequest: one state per slot, in
// request order.
type SlotsAnswer struct {
	Slots []SlotState
}

// AppendAcquireRequest appends the JSON body of r:
//
//	{"id":"a1","ttl_ms":30000,"keys":[{"key":"k","max_in_flight":4}]}
func AppendAcquireRequest(b []byte, r *AcquireRequest) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, r.ID)
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, r.TTLMs, 10)
	b = append(b, `,"keys":[`...)
	for i := range r.Keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, r.Keys[i].Key)
		b = append(b, `,"max_in_flight":`...)
		b = strconv.AppendInt(b, r.Keys[i].MaxInFlight, 10)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// AppendSlotsRequest appends the JSON body of r (ttl_ms left out when 0, as
// for a release):
//
//	{"ttl_ms":30000,"slots":[{"key":"k","max_in_flight":4,"id":"a1"}]}
func AppendSlotsRequest(b []byte, r *SlotsRequest) []byte {
	b = append(b, '{')
	if r.TTLMs != 0 {
		b = append(b, `"ttl_ms":`...)
		b = strconv.AppendInt(b, r.TTLMs, 10)
		b = append(b, ',')
	}
	b = append(b, `"slots":[`...)
	for i := range r.Slots {
		s := &r.Slots[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, s.Key)
		b = append(b, `,"max_in_flight":`...)
		b = strconv.AppendInt(b, s.MaxInFlight, 10)
		b = append(b, `,"id":`...)
		b = appendString(b, s.ID)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// DecodeAcquireRequest parses and validates the body of POST
// /v1/slots/acquire: an id (1 to MaxSlotIDBytes printable ASCII bytes
// without spaces), a ttl_ms (MinSlotTTLMs to MaxSlotTTLMs) and 1 to
// lim.MaxBuckets keys, distinct, each with a max_in_flight (1 to
// MaxInFlight). Errors are *FieldError naming the field.
func DecodeAcquireRequest(body []byte, lim Limits) (*AcquireRequest, error) {
	lim = lim.WithDefaults()
	req := &AcquireRequest{}
	v, err := parse(body, lim.MaxBodyBytes)
	if err == nil {
		err = required(v, "id", "ttl_ms", "keys")
	}
	if err == nil {
		err = fields("", v, []string{"id", "ttl_ms", "keys"}, func(f int, p string, m gjson.Result) (err *jsonfield.Error) {
			switch f {
			case 0:
				req.ID, err = slotID(p, m)
			case 1:
				req.TTLMs, err = integer(p, m, MinSlotTTLMs, MaxSlotTTLMs)
			default:
				var keys []gjson.Result
				if keys, err = list(p, m, lim.MaxBuckets, "keys"); err != nil {
					return err
				}
				req.Keys = make([]SlotKey, len(keys))
				for i, k := range keys {
					at := jsonfield.Elem("keys", i)
					sk := &req.Keys[i]
					if err = required(k, at+".key", at+".max_in_flight"); err != nil {
						return err
					}
					if err = slotTable(at, k, lim, &sk.Key, &sk.MaxInFlight, nil); err != nil {
						return err
					}
					for j := range i {
						if req.Keys[j].Key == sk.Key {
							return refuse(at+".key", "duplicate of keys["+strconv.Itoa(j)+"].key")
						}
					}
				}
			}
			return err
		})
	}
	if err != nil {
		return nil, refusal(err)
	}
	return req, nil
}

// DecodeSlotsRequest parses and validates the body of POST /v1/slots/renew
// (renew true: ttl_ms required, MinSlotTTLMs to MaxSlotTTLMs) or POST
// /v1/slots/release (no ttl_ms): 1 to MaxSlotBatch slots, each a key, its
// max_in_flight and a slot id as DecodeAcquireRequest reads them. Errors are
// *FieldError naming the field.
func DecodeSlotsRequest(body []byte, lim Limits, renew bool) (*SlotsRequest, error) {
	lim = lim.WithDefaults()
	req := &SlotsRequest{}
	names := []string{"slots", "ttl_ms"}
	need := []string{"slots", "ttl_ms"}
	if !renew {
		names, need = names[:1], need[:1]
	}
	v, err := parse(body, lim.MaxBodyBytes)
	if err == nil {
		err = required(v, need...)
	}
	if err == nil {
		err = fields("", v, names, func(f int, p string, m gjson.Result) (err *jsonfield.Error) {
			if f == 1 {
				req.TTLMs, err = integer(p, m, MinSlotTTLMs, MaxSlotTTLMs)
				return err
			}
			var slots []gjson.Result
			if slots, err = list(p, m, MaxSlotBatch, "slots"); err != nil {
				return err
			}
			req.Slots = make([]Slot, len(slots))
			for i, sv := range slots {
				at := jsonfield.Elem("slots", i)
				s := &req.Slots[i]
				if err = required(sv, at+".key", at+".max_in_flight", at+".id"); err != nil {
					return err
				}
				if err = slotTable(at, sv, lim, &s.Key, &s.MaxInFlight, &s.ID); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, refusal(err)
	}
	return req, nil
}

// required refuses object v (at the path the names start with) when a
// member named by the last part of each path is absent or null.
func required(v gjson.Result, paths ...string) *jsonfield.Error {
	for _, p := range paths {
		name := p
		for i := len(p) - 1; i >= 0; i-- {
			if p[i] == '.' {
				name = p[i+1:]
				break
			}
		}
		if m := v.Get(name); !m.Exists() || m.Type == gjson.Null {
			return refuse(p, "required")
		}
	}
	return nil
}

// slotTable reads the members of one key (or slot) object at path at: key
// and max_in_flight, and id when id is not nil.
func slotTable(at string, v gjson.Result, lim Limits, k *string, max *int64, id *string) *jsonfield.Error {
	names := []string{"key", "max_in_flight", "id"}
	if id == nil {
		names = names[:2]
	}
	return fields(at, v, names, func(f int, p string, m gjson.Result) (err *jsonfield.Error) {
		switch f {
		case 0:
			*k, err = key(p, m, lim)
		case 1:
			*max, err = integer(p, m, 1, MaxInFlight)
		default:
			*id, err = slotID(p, m)
		}
		return err
	})
}

// list reads an array of 1 to max elements (what names them in the error).
func list(at string, v gjson.Result, max int, what string) ([]gjson.Result, *jsonfield.Error) {
	a, err := jsonfield.Array(at, v)
	if err != nil {
		return nil, err
	}
	if len(a) == 0 || len(a) > max {
		return nil, refuse(at, "must hold 1 to "+strconv.Itoa(max)+" "+what+", got "+strconv.Itoa(len(a)))
	}
	return a, nil
}

// integer reads a whole number in [lo, hi].
func integer(at string, v gjson.Result, lo, hi int64) (int64, *jsonfield.Error) {
	x, err := jsonfield.Number(at, v)
	if err != nil {
		return 0, err
	}
	if x != float64(int64(x)) || x < float64(lo) || x > float64(hi) {
		return 0, refuse(at, "must be a whole number >= "+strconv.FormatInt(lo, 10)+" and <= "+strconv.FormatInt(hi, 10)+", got "+v.Raw)
	}
	return int64(x), nil
}

// slotID reads a slot id: 1 to MaxSlotIDBytes printable ASCII bytes
// without spaces.
func slotID(at string, v gjson.Result) (string, *jsonfield.Error) {
	id, err := jsonfield.String(at, v)
	if err != nil {
		return "", err
	}
	if id == "" || len(id) > MaxSlotIDBytes {
		return "", refuse(at, "must be 1 to "+strconv.Itoa(MaxSlotIDBytes)+" bytes, got "+strconv.Itoa(len(id)))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return "", refuse(at, "only printable ASCII without spaces")
		}
	}
	return id, nil
}

// AppendAcquireAnswer appends the JSON of a:
//
//	{"acquired":true,"in_flight":[3]}
func AppendAcquireAnswer(b []byte, a *AcquireAnswer) []byte {
	b = append(b, `{"acquired":`...)
	b = strconv.AppendBool(b, a.Acquired)
	b = append(b, `,"in_flight":[`...)
	for i, n := range a.InFlight {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return append(b, "]}\n"...)
}

// AppendSlotsAnswer appends the JSON of a:
//
//	{"slots":["held","restored","lost"]}
func AppendSlotsAnswer(b []byte, a *SlotsAnswer) []byte {
	b = append(b, `{"slots":[`...)
	for i, s := range a.Slots {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s.String())
	}
	return append(b, "]}\n"...)
}

// DecodeAcquireAnswer reads the service's answer to req. It is untrusted:
// bounded in size and nesting, one count per key, each between 0 and the
// key's max_in_flight, and at least 1 when acquired (the caller's own
// slot); anything else is refused, so a gateway never counts a slot the
// service did not give.
func DecodeAcquireAnswer(body []byte, req *AcquireRequest) (*AcquireAnswer, error) {
	v, ferr := parse(body, MaxAnswerBytes)
	if ferr != nil {
		return nil, refusal(ferr)
	}
	acquired, ferr := jsonfield.Bool("acquired", v.Get("acquired"))
	if ferr != nil {
		return nil, refusal(ferr)
	}
	counts, ferr := jsonfield.Array("in_flight", v.Get("in_flight"))
	if ferr != nil {
		return nil, refusal(ferr)
	}
	if len(counts) != len(req.Keys) {
		return nil, refusal(refuse("in_flight", "must hold "+strconv.Itoa(len(req.Keys))+" counts, got "+strconv.Itoa(len(counts))))
	}
	a := &AcquireAnswer{Acquired: acquired, InFlight: make([]int64, len(counts))}
	for i, c := range counts {
		lo := int64(0)
		if acquired {
			lo = 1
		}
		n, err := integer(jsonfield.Elem("in_flight", i), c, lo, req.Keys[i].MaxInFlight)
		if err != nil {
			return nil, refusal(err)
		}
		a.InFlight[i] = n
	}
	return a, nil
}

// DecodeSlotsAnswer reads the service's answer to req (renew true for a
// renew call): one state per slot, and "restored" only from a renew.
func DecodeSlotsAnswer(body []byte, req *SlotsRequest, renew bool) (*SlotsAnswer, error) {
	v, ferr := parse(body, MaxAnswerBytes)
	if ferr != nil {
		return nil, refusal(ferr)
	}
	states, ferr := jsonfield.Array("slots", v.Get("slots"))
	if ferr != nil {
		return nil, refusal(ferr)
	}
	if len(states) != len(req.Slots) {
		return nil, refusal(refuse("slots", "must hold "+strconv.Itoa(len(req.Slots))+" states, got "+strconv.Itoa(len(states))))
	}
	a := &SlotsAnswer{Slots: make([]SlotState, len(states))}
	for i, s := range states {
		at := jsonfield.Elem("slots", i)
		str, err := jsonfield.String(at, s)
		if err != nil {
			return nil, refusal(err)
		}
		st := SlotState(0)
		for st < SlotState(len(slotStates)) && slotStates[st] != str {
			st++
		}
		if st == SlotState(len(slotStates)) || st == SlotRestored && !renew {
			return nil, refusal(refuse(at, "unknown state "+strconv.Quote(str)))
		}
		a.Slots[i] = st
	}
	return a, nil
}

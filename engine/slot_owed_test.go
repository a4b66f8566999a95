package engine_test

import (
	"errors"
	"runtime"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/shareddata"
)

// A slot given back on a refusal (giveBack) is owed like one given back at
// Done (releaseSlot): when shared data refuses the write, Tick writes it
// later, and the key keeps its slots.

const (
	// slotsAndFleet: one slot per t, and a limit service's bucket that
	// refuses after the slot was taken.
	slotsAndFleet = `{"service": {"cluster": "limitd", "failure_mode": "deny"}, "rules": [
  {"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1}},
  {"name": "fleet", "scope": "cluster", "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 9}}]}`
	// slotsAndHold: one slot per t, and a bucket per u that holds a
	// request (max_delay_ms) after the slot was taken.
	slotsAndHold = `{"rules": [
  {"name": "streams", "limit_keys": ["header:t"], "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1}},
  {"name": "paced", "limit_keys": ["header:u"], "algorithm": "token_bucket",
   "algorithm_config": {"tokens_per_second": 1, "burst": 1, "max_delay_ms": 5000}}]}`

	serviceAllows  = `{"allowed":true,"buckets":[{"allowed":true,"remaining":8,"retry_after_ms":0,"reset_ms":100}]}`
	serviceRefuses = `{"allowed":false,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":900,"reset_ms":900}]}`
)

// owedWorker is one fake Envoy worker for these tests.
type owedWorker struct {
	t  *testing.T
	h  *fakehost.Host
	sd *fakehost.RefusingData
	p  *engine.Plugin
}

func newOwedWorker(t *testing.T, cfg string) *owedWorker {
	t.Helper()
	h := fakehost.New()
	sd := &fakehost.RefusingData{SD: shareddata.New()}
	h.SD = sd
	p, err := engine.New(h, []byte(cfg), "", engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &owedWorker{t: t, h: h, sd: sd, p: p}
}

func (w *owedWorker) metric(name string) int64 { return w.h.Metric(engine.Name + "." + name).N }

// answer answers every call the host and s hold with body.
func (w *owedWorker) answer(s *fakehost.Stream, body string) {
	for _, c := range append(w.h.TakeCalls(), s.TakeCalls()...) {
		c.Answer(&engine.Answer{Status: "200", Body: []byte(body)})
	}
}

// freeSlots counts the requests of t=a (each with its own u) that go on
// now, the limit service allowing them, and ends them all.
func (w *owedWorker) freeSlots() int {
	var open []*engine.Request
	defer func() {
		for _, r := range open {
			r.Done()
		}
	}()
	for i := range 10 {
		s := fakehost.NewStream("t", "a", "u", "free"+string(rune('0'+i)))
		r := w.p.NewRequest(s)
		open = append(open, r)
		a := r.OnRequestHeaders()
		w.answer(s, serviceAllows)
		if s.Replied != 0 || (a == engine.Pause && s.Resumed == 0) {
			return i
		}
	}
	return 10
}

// TestSlotGivenBackOnARefusalIsOwed: a request takes a slot, then is
// refused by the limit service, or is held by a token bucket and its
// client leaves; shared data refuses every write of that give-back (a CAS
// storm, then a host error). The slot is owed, paid at the next Tick: the
// key has its slot again, in_flight is 0 and no slot is lost.
func TestSlotGivenBackOnARefusalIsOwed(t *testing.T) {
	for _, tc := range []struct {
		name, cfg string
		err       error
		// refuse makes the request that holds the slot end without going
		// on, while shared data refuses writes.
		refuse func(w *owedWorker, s *fakehost.Stream, r *engine.Request)
	}{
		{name: "refused by the limit service", cfg: slotsAndFleet, refuse: func(w *owedWorker, s *fakehost.Stream, r *engine.Request) {
			w.answer(s, serviceRefuses)
			if s.Replied != 429 {
				w.t.Fatalf("the limit service's refusal: replied %d, want 429", s.Replied)
			}
		}},
		{name: "client gone while held", cfg: slotsAndHold, err: errors.New("shared data out of memory"), refuse: func(w *owedWorker, s *fakehost.Stream, r *engine.Request) {
			s.Done = true
			r.Done()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newOwedWorker(t, tc.cfg)
			if tc.cfg == slotsAndHold { // u=x's token gone: the next of u=x is held
				first := w.p.NewRequest(fakehost.NewStream("t", "b", "u", "x"))
				if a := first.OnRequestHeaders(); a != engine.Continue {
					t.Fatalf("first of u=x: %v", a)
				}
				first.Done()
			}
			s := fakehost.NewStream("t", "a", "u", "x")
			s.Clock = w.h.Clock
			r := w.p.NewRequest(s)
			if a := r.OnRequestHeaders(); a != engine.Pause {
				t.Fatalf("the request holding the slot: %v, want it paused (a call, or a hold)", a)
			}
			if n := w.metric("rule.streams.in_flight"); n != 1 {
				t.Fatalf("in_flight %d with the slot taken, want 1", n)
			}
			w.sd.Refuse, w.sd.Err = 1000, tc.err
			tc.refuse(w, s, r)
			w.sd.Refuse = 0
			r.Done()
			w.p.Tick(&runtime.MemStats{})
			if n := w.freeSlots(); n != 1 {
				t.Fatalf("%d free slots of a after the refused give-back and a tick, want 1", n)
			}
			if f, lost := w.metric("rule.streams.in_flight"), w.metric("slots_lost"); f != 0 || lost != 0 {
				t.Fatalf("in_flight %d, slots_lost %d; want 0, 0", f, lost)
			}
		})
	}
}

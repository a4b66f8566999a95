package bucket

import (
	"fmt"
	"math"
	"testing"
	"time"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
)

// Fixed moments of the timelines, like x/time/rate's tests: t1..t9 are 100 ms
// apart, one token's refill at 10 tokens per second.
var (
	t0 = int64(1_700_000_000) * sec
	t1 = t0 + 100*ms
	t2 = t0 + 200*ms
	t3 = t0 + 300*ms
	t4 = t0 + 400*ms
	t5 = t0 + 500*ms
	t6 = t0 + 600*ms
	t7 = t0 + 700*ms
	t8 = t0 + 800*ms
	t9 = t0 + 900*ms
)

// at formats a time of a timeline relative to t0.
func at(now int64) string { return fmt.Sprintf("t0%+v", time.Duration(now-t0)) }

type step struct {
	at            int64
	cost          float64
	wantOK        bool
	wantRemaining int64
	wantRetry     int64
	wantReset     int64
}

// ceilSec is d in whole seconds, rounded up, as response headers show it.
func ceilSec(d time.Duration) int64 {
	if d == Never {
		return Never
	}
	return int64((d + time.Second - 1) / time.Second)
}

// run takes each step in turn from state s, checking the decision and that a
// rejection leaves the state unchanged. It returns the final state.
func run(t *testing.T, lim Limit, s State, steps []step) State {
	t.Helper()
	for i, st := range steps {
		next, d := lim.Take(s, st.at, st.cost)
		want := step{st.at, st.cost, st.wantOK, st.wantRemaining, st.wantRetry, st.wantReset}
		if got := (step{st.at, st.cost, d.Allowed, d.Remaining, ceilSec(d.RetryAfter), ceilSec(d.ResetAfter)}); got != want {
			t.Errorf("step %d: Take(%v, %v) = %+v, want %+v", i, at(st.at), st.cost, d, want)
		}
		if !d.Allowed && next != s {
			t.Errorf("step %d: Take(%v, %v) rejected but changed the state %+v to %+v", i, at(st.at), st.cost, s, next)
		}
		s = next
	}
	return s
}

func TestTakeTimeline(t *testing.T) {
	run(t, Limit{Rate: 10, Burst: 3}, State{}, []step{
		{t0, 1, true, 2, 0, 1},
		{t0, 1, true, 1, 0, 1},
		{t0, 1, true, 0, 0, 1},
		{t0, 1, false, 0, 1, 1},
		{t1, 1, true, 0, 0, 1},
		{t2, 2, false, 1, 1, 1},
		{t3, 2, true, 0, 0, 1},
		{t9, 3, true, 0, 0, 1}, // 6 tokens of refill, clamped to 3
		{t9, 0.5, false, 0, 1, 1},
	})
}

func TestTakeTimelineSlowRate(t *testing.T) {
	// One token every 2 s: the second counts become visible.
	s := run(t, Limit{Rate: 0.5, Burst: 2}, State{}, []step{
		{t0, 2, true, 0, 0, 4},
		{t0, 1, false, 0, 2, 4},
		{t0 + 1*sec, 1, false, 0, 1, 3}, // 0.5 tokens
		{t0 + 2*sec, 1, true, 0, 0, 4},
		{t0 + 3*sec, 1.5, false, 0, 2, 3},
		{t0 + 5*sec, 1.5, true, 0, 0, 4},
		{t0 + 10*sec, 3, false, 2, 2, 0}, // cost above burst: always rejected
		{t0 + 10*sec, 0.25, true, 1, 0, 1},
		{t0 + 10*sec, 0, true, 1, 0, 1},  // zero cost takes nothing
		{t0 + 10*sec, -1, true, 1, 0, 1}, // negative cost too
	})
	if want := (State{Tokens: 1.75, At: t0 + 10*sec}); s != want {
		t.Errorf("final state = %+v, want %+v", s, want)
	}
}

func TestTakeTimelineFractional(t *testing.T) {
	run(t, Limit{Rate: 2.5, Burst: 5}, State{}, []step{
		{t0, 0.75, true, 4, 0, 1},
		{t0, 4, true, 0, 0, 2}, // 0.25 left
		{t0, 0.5, false, 0, 1, 2},
		{t1, 0.5, true, 0, 0, 2},          // 0.25 + 0.25
		{t0 + 2*sec, 5, false, 4, 1, 1},   // 4.75 tokens
		{t0 + 2*sec, 4.5, true, 0, 0, 2},  // 0.25 left
		{t0 + 3*sec, 2.75, true, 0, 0, 2}, // 2.75 tokens, 0 left
		{t0 + 3*sec + 400*ms, 1, true, 0, 0, 2},
	})
}

func TestTakeClockBackwards(t *testing.T) {
	lim := Limit{Rate: 1, Burst: 5}
	s := run(t, lim, State{}, []step{
		{t0 + 10*sec, 5, true, 0, 0, 5},
		// The clock jumps back 5 s: nothing accrues until it is back at
		// t0+10s, and the waits count that gap.
		{t0 + 5*sec, 1, false, 0, 6, 10},
		{t0 + 10*sec, 1, false, 0, 1, 5},
		{t0 + 11*sec, 1, true, 0, 0, 5},
		{t0 + 2*sec, 1, false, 0, 10, 14},
	})
	if s.At != t0+11*sec {
		t.Errorf("At = %v, want t0+11s: it must never move back", at(s.At))
	}
	// Admitting while the clock is behind keeps At: no refill is counted
	// twice once the clock catches up.
	s = State{Tokens: 3, At: t0 + 10*sec}
	s, d := lim.Take(s, t0, 1)
	if !d.Allowed || s != (State{Tokens: 2, At: t0 + 10*sec}) {
		t.Fatalf("Take(t0, 1) on a state at t0+10s = %+v, %+v; want allowed, {2 t0+10s}", s, d)
	}
	if got := lim.Tokens(s, t0+10*sec); got != 2 {
		t.Errorf("Tokens at t0+10s = %v, want 2", got)
	}
	if got := lim.Tokens(s, t0+11*sec); got != 3 {
		t.Errorf("Tokens at t0+11s = %v, want 3", got)
	}
}

func TestZeroStateIsFull(t *testing.T) {
	lim := Limit{Rate: 1, Burst: 7}
	for _, now := range []int64{t0, 1, 0, -5} {
		if got := lim.Tokens(State{}, now); got != 7 {
			t.Errorf("Tokens(State{}, %d) = %v, want 7", now, got)
		}
	}
	// Times at or below zero act as 1 ns: Take never writes At == 0.
	s, d := lim.Take(State{}, 0, 2)
	if !d.Allowed || s != (State{Tokens: 5, At: 1}) {
		t.Errorf("Take(State{}, 0, 2) = %+v, %+v; want allowed, {5 1}", s, d)
	}
	if got := lim.Tokens(s, -10); got != 5 {
		t.Errorf("Tokens after a Take at time 0 = %v, want 5", got)
	}
}

func TestFractionalCostsDoNotDrift(t *testing.T) {
	// 0.1 has no exact float64 form: a hundred takes of 0.1 must still empty
	// a bucket of 10 exactly, and Remaining must not be off by one on the way.
	lim := Limit{Rate: 1, Burst: 10}
	s := State{}
	for i := 1; i <= 100; i++ {
		var d Decision
		s, d = lim.Take(s, t0, 0.1)
		if want := int64(100-i) / 10; !d.Allowed || d.Remaining != want {
			t.Fatalf("take %d of 0.1: %+v, want allowed with Remaining %d", i, d, want)
		}
	}
	if _, d := lim.Take(s, t0, 0.1); d.Allowed || ceilSec(d.RetryAfter) != 1 || ceilSec(d.ResetAfter) != 10 {
		t.Errorf("take 101 of 0.1: %+v, want rejected, RetryAfter 1, ResetAfter 10", d)
	}
}

func TestRefund(t *testing.T) {
	lim := Limit{Rate: 1, Burst: 5}
	s := State{Tokens: 1, At: t0}
	tests := []struct {
		name string
		s    State
		now  int64
		cost float64
		want State
	}{
		{"adds at now", s, t0 + sec, 2, State{Tokens: 4, At: t0 + sec}},
		{"clamped to burst", s, t0 + sec, 10, State{Tokens: 5, At: t0 + sec}},
		{"clock behind keeps At", s, t0 - sec, 1, State{Tokens: 2, At: t0}},
		{"zero cost", s, t0 + sec, 0, s},
		{"negative cost", s, t0 + sec, -3, s},
		{"NaN cost", s, t0 + sec, math.NaN(), s},
		{"zero state stays full", State{}, t0, 1, State{}},
	}
	for _, tt := range tests {
		if got := lim.Refund(tt.s, tt.now, tt.cost); got != tt.want {
			t.Errorf("%s: Refund(%+v, %v, %v) = %+v, want %+v", tt.name, tt.s, at(tt.now), tt.cost, got, tt.want)
		}
	}
}

func TestFullAt(t *testing.T) {
	lim := Limit{Rate: 4, Burst: 10}
	tests := []struct {
		s    State
		want int64
	}{
		{State{}, 0},
		{State{Tokens: 10, At: t0}, t0},
		{State{Tokens: 12, At: t0}, t0},
		{State{Tokens: 0, At: t0}, t0 + 2500*ms},
		{State{Tokens: 9, At: t0}, t0 + 250*ms},
	}
	for _, tt := range tests {
		got := lim.FullAt(tt.s)
		if got != tt.want {
			t.Errorf("FullAt(%+v) = %v, want %v", tt.s, at(got), at(tt.want))
		}
		if tok := lim.Tokens(tt.s, got); tok != 10 {
			t.Errorf("Tokens(%+v, FullAt) = %v, want 10", tt.s, tok)
		}
	}
	if got := (Limit{Rate: 0, Burst: 10}).FullAt(State{Tokens: 1, At: t0}); got != Never {
		t.Errorf("FullAt without refill = %d, want Never", got)
	}
}

func TestInvalidLimits(t *testing.T) {
	// Take must stay safe with limits config would refuse.
	s := State{Tokens: 1, At: t0}
	tests := []struct {
		lim  Limit
		cost float64
		want Decision
	}{
		{Limit{Rate: 0, Burst: 5}, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: Never}},
		{Limit{Rate: 0, Burst: 5}, 2, Decision{Remaining: 1, RetryAfter: Never, ResetAfter: Never}},
		{Limit{Rate: -1, Burst: 5}, 2, Decision{Remaining: 1, RetryAfter: Never, ResetAfter: Never}},
		{Limit{Rate: math.NaN(), Burst: 5}, 2, Decision{Remaining: 1, RetryAfter: Never, ResetAfter: Never}},
		{Limit{Rate: 1, Burst: 0}, 1, Decision{RetryAfter: time.Duration(sec - 1)}}, // 1 − 1 ns of refill of slack
		{Limit{Rate: 1, Burst: math.NaN()}, 1, Decision{RetryAfter: time.Duration(sec - 1)}},
		{Limit{Rate: 1, Burst: math.Inf(1)}, 1, Decision{RetryAfter: time.Duration(sec - 1)}},
		{Limit{Rate: 1, Burst: 5}, math.NaN(), Decision{Remaining: 5, RetryAfter: 1}},
		{Limit{Rate: 1, Burst: 5}, math.Inf(1), Decision{Remaining: 5, RetryAfter: Never}},
	}
	for _, tt := range tests {
		next, d := tt.lim.Take(s, t0+10*sec, tt.cost)
		if d != tt.want {
			t.Errorf("%+v.Take(%+v, t0+10s, %v) = %+v, want %+v", tt.lim, s, tt.cost, d, tt.want)
		}
		if _, err := DecodeState(next.AppendBinary(nil)); err != nil {
			t.Errorf("%+v.Take(%+v, t0+10s, %v) produced an undecodable state: %v", tt.lim, s, tt.cost, err)
		}
	}
}

func BenchmarkTake(b *testing.B) {
	b.ReportAllocs()
	lim := Limit{Rate: 100, Burst: 50}
	s, now := State{}, t0
	var d Decision
	for b.Loop() {
		now += 7 * ms
		s, d = lim.Take(s, now, 1)
	}
	_ = d
}

func BenchmarkTakeEncoded(b *testing.B) {
	// One full decision as the store runs it: decode, take, encode.
	b.ReportAllocs()
	lim := Limit{Rate: 100, Burst: 50}
	buf := State{}.AppendBinary(make([]byte, 0, EncodedLen))
	now := t0
	for b.Loop() {
		now += 7 * ms
		s, err := DecodeState(buf)
		if err != nil {
			b.Fatal(err)
		}
		s, _ = lim.Take(s, now, 1)
		buf = s.AppendBinary(buf[:0])
	}
}

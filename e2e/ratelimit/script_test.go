// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// step is one line of a script: n requests in a row with headers, and the
// statuses they should get (one per request).
type step struct {
	note    string
	headers map[string]string
	want    []int
	// atomic, when set, is what limitd's token buckets answer instead of
	// want (of the same length): there a request one descriptor refuses
	// takes nothing from the others, where a fixed window
	// (envoyproxy/ratelimit's, limitd's) counts it on every descriptor.
	atomic []int
	// second marks the steps of a per-second limit: they are played from
	// the start of a second (see lockstep).
	second bool
}

// seen is what one request got: its status and the x-ratelimit-* headers
// Envoy wrote from the service's answer.
type seen struct {
	Status                  int
	Limit, Remaining, Reset string
}

func (s seen) String() string {
	return fmt.Sprintf("%d limit=%q remaining=%q reset=%q", s.Status, s.Limit, s.Remaining, s.Reset)
}

func seenOf(r envoytest.Result) seen {
	return seen{Status: r.Status, Limit: r.Header.Get("x-ratelimit-limit"),
		Remaining: r.Header.Get("x-ratelimit-remaining"), Reset: r.Header.Get("x-ratelimit-reset")}
}

// runScript plays steps through e, one request at a time, and returns what
// every request got, step by step.
func runScript(e *envoytest.Envoy, steps []step) [][]seen {
	c := e.Client()
	defer c.Close()
	out := make([][]seen, len(steps))
	for i, st := range steps {
		for range st.want {
			out[i] = append(out[i], seenOf(c.Get("/", st.headers)))
		}
	}
	return out
}

// checkStatuses compares what a script got with what its steps want
// (want, or atomic for token buckets when set).
func checkStatuses(t *testing.T, f flavour, steps []step, got [][]seen) {
	t.Helper()
	for i, st := range steps {
		want := st.want
		if !f.window && st.atomic != nil {
			want = st.atomic
		}
		var statuses []int
		for _, g := range got[i] {
			statuses = append(statuses, g.Status)
		}
		if !slices.Equal(statuses, want) {
			t.Errorf("step %d (%s, %v): statuses %v, want %v\n%v", i, st.note, st.headers, statuses, want, got[i])
		}
	}
}

// inOneWindow runs play (which should take seconds) with every service's
// Redis emptied first, again when an hour's edge fell inside it (the
// counts of fixed windows started again): inWindowOf for an hour.
func inOneWindow(t *testing.T, redises []*redistest.Server, play func()) {
	t.Helper()
	inWindowOf(t, redises, time.Hour, func() bool { play(); return true })
}

// playFor runs play for flavour f against s: within one window of unit
// (inWindowOf) when f counts fixed windows, once otherwise (a token bucket
// has no edge to fall inside).
func playFor(t *testing.T, f flavour, s *service, unit time.Duration, play func() bool) {
	t.Helper()
	if !f.window {
		play()
		return
	}
	inWindowOf(t, []*redistest.Server{s.redis}, unit, play)
}

// windowPlays is how many times inWindowOf plays at most.
const windowPlays = 3

// inWindowOf runs play with every service's Redis emptied first, until it
// ran within one window of unit (Unix time over unit, as both services
// count fixed windows) and says its own timing held (true), at most
// windowPlays times, the last judged as it is. A test waits for no edge:
// one that falls inside costs a play again, and the next edge of a
// minute's or an hour's window is far.
func inWindowOf(t *testing.T, redises []*redistest.Server, unit time.Duration, play func() bool) {
	t.Helper()
	flush := func() {
		for _, r := range redises {
			if _, err := redistest.Do(r.Addr(), "FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := playInWindow(time.Now, unit, flush, play); n > 1 {
		t.Logf("played %d times: an edge of the %v window fell inside, or the play's own timing failed", n, unit)
	}
}

// playInWindow is inWindowOf's loop, with the clock passed in: reset, then
// play, until a play started and ended in one window of unit and returned
// true, or windowPlays have run. It returns how many ran.
func playInWindow(now func() time.Time, unit time.Duration, reset func(), play func() bool) int {
	for n := 1; ; n++ {
		reset()
		start := now().Truncate(unit)
		ok := play()
		if within := now().Truncate(unit).Equal(start); ok && within || n == windowPlays {
			return n
		}
	}
}

func headerList(h map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, k+"="+h[k])
	}
	return strings.Join(parts, ",")
}

// TestPlayInWindow: playInWindow plays once when the play stays in one
// window and says its timing held; again (with a reset first) when an edge
// fell inside or the play's timing failed; at most windowPlays times. The
// clock is the test's: nothing waits for an edge.
func TestPlayInWindow(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.TimeOnly, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name  string
		unit  time.Duration
		times []string // the clock's readings: each play's start and end
		oks   []bool   // what each play returns
		want  int
	}{
		{"one hour", time.Hour, []string{"10:00:01", "10:00:03"}, []bool{true}, 1},
		{"an hour's edge inside", time.Hour, []string{"10:59:59", "11:00:02", "11:00:02", "11:00:04"}, []bool{true, true}, 2},
		{"a minute's edge inside", time.Minute, []string{"10:12:58", "10:13:01", "10:13:01", "10:13:04"}, []bool{true, true}, 2},
		{"ends at the edge", time.Minute, []string{"10:12:58", "10:13:00", "10:13:00", "10:13:03"}, []bool{true, true}, 2},
		{"the play's timing failed", time.Hour, []string{"10:00:01", "10:00:03", "10:00:03", "10:00:04"}, []bool{false, true}, 2},
		{"never held", time.Hour, []string{"10:00:01", "10:00:03", "10:00:03", "10:00:04", "10:00:04", "10:00:05"}, []bool{false, false, false}, windowPlays},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reads, resets, plays := 0, 0, 0
			now := func() time.Time {
				reads++
				return at(tc.times[reads-1])
			}
			n := playInWindow(now, tc.unit, func() { resets++ }, func() bool {
				plays++
				return tc.oks[plays-1]
			})
			if n != tc.want || plays != tc.want || resets != tc.want || reads != 2*tc.want {
				t.Errorf("returned %d after %d plays, %d resets, %d clock readings; want %d, %[5]d, %[5]d, %d", n, plays, resets, reads, tc.want, 2*tc.want)
			}
		})
	}
}

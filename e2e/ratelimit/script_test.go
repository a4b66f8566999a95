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
// counts of fixed windows started again), at most three times.
func inOneWindow(t *testing.T, redises []*redistest.Server, play func()) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		for _, r := range redises {
			if _, err := redistest.Do(r.Addr(), "FLUSHALL"); err != nil {
				t.Fatal(err)
			}
		}
		hour := time.Now().Truncate(time.Hour)
		play()
		if time.Now().Truncate(time.Hour).Equal(hour) || attempt == 3 {
			return
		}
		t.Logf("an hour's edge fell inside attempt %d: again", attempt)
	}
}

func headerList(h map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, k+"="+h[k])
	}
	return strings.Join(parts, ",")
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"os"
	"testing"
	"time"
)

// TestIdleClock: only intervals whose sample found Envoy idle count
// against the timeout; wall time is bounded at timeout + wallSlack.
func TestIdleClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newIdleClock(t0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// 200 s of a busy start (a starved compile), then 1.5 s idle.
	for d := time.Second; d <= 200*time.Second; d += time.Second {
		c.tick(at(d), true)
	}
	if c.over(at(200*time.Second), 2*time.Second) {
		t.Fatalf("over after 200 s busy: %v", c)
	}
	c.tick(at(200*time.Second+500*time.Millisecond), false)
	c.tick(at(201*time.Second+500*time.Millisecond), false)
	if c.over(at(201*time.Second+500*time.Millisecond), 2*time.Second) {
		t.Fatalf("over after 1.5 s idle: %v", c)
	}
	c.tick(at(202*time.Second+500*time.Millisecond), false)
	if !c.over(at(202*time.Second+500*time.Millisecond), 2*time.Second) {
		t.Fatalf("not over after 2.5 s idle: %v", c)
	}
	if got, want := c.String(), "idle 2.5s of 3m22.5s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	// A tick out of order (an earlier sample's time) counts nothing.
	c.tick(at(time.Second), false)
	if got, want := c.String(), "idle 2.5s of 3m22.5s"; got != want {
		t.Errorf("after an earlier tick String() = %q, want %q", got, want)
	}

	// A spinning Envoy: busy all along, over at timeout + wallSlack.
	s := newIdleClock(t0)
	s.tick(at(wallSlack+time.Second), true)
	if s.over(at(wallSlack+time.Second), time.Second) {
		t.Errorf("over at timeout + wallSlack")
	}
	if !s.over(at(wallSlack+time.Second+time.Millisecond), time.Second) {
		t.Errorf("not over after timeout + wallSlack")
	}
}

// TestThreadState reads the state after the last ')' of the command
// name, whatever the name holds, and refuses what is not a stat line.
func TestThreadState(t *testing.T) {
	for stat, want := range map[string]byte{
		"1844 (envoy) S 1831 1784":           'S',
		"1849 (V8 DefaultWorke) R 1831 1784": 'R',
		"7 (a) b) c) D 1 2":                  'D',
		"7 ()) R 1":                          'R',
	} {
		got, err := threadState([]byte(stat))
		if err != nil || got != want {
			t.Errorf("threadState(%q) = %q, %v; want %q", stat, got, err, want)
		}
	}
	for _, stat := range []string{"", "1844 envoy S", "1844 (envoy)", "1844 (envoy) ", "1844 (envoy)S 1", "7 (x) SS 1"} {
		if got, err := threadState([]byte(stat)); err == nil {
			t.Errorf("threadState(%q) = %q, want an error", stat, got)
		}
	}
	// This test's own process has a running thread: the one reading.
	if !runnable(os.Getpid()) {
		t.Errorf("runnable(own pid) = false")
	}
	if runnable(-1) {
		t.Errorf("runnable(-1) = true")
	}
}

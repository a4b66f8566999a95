// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// An idleClock measures a wait on Envoy by Envoy's idle time only: the
// time in which none of its threads was running or waiting for a processor
// (state R in /proc/<pid>/task/*/stat). An Envoy that compiles the plugin
// is busy however long a loaded machine makes it wait for a CPU: a test
// running at a low priority (make test runs the unit tests at nice 10)
// beside busy Envoys may take minutes of wall time to start. An Envoy that
// waits for something that does not come (a stopped process, a server that
// does not answer) is idle, and its wait ends after timeout as before.
// Wall time is bounded too, at timeout + wallSlack, for an Envoy that
// spins. A thread in disk sleep (D: reading the plugin under a loaded
// disk) counts as busy too.
//
// A sampler goroutine (watch) reads the threads' states every
// pollInterval, whatever the waiter is doing (an admin call to a busy Envoy
// may block for seconds); an interval counts as idle when the sample at its
// end found no runnable thread.
type idleClock struct {
	mu   sync.Mutex
	last time.Time
	idle time.Duration
	wall time.Time // when the wait began
	stop chan struct{}
}

// timeout + wallSlack bounds the wall time of a wait however busy Envoy
// is: a Wasm Envoy started at nice 10 beside 8 busy processes on 2 cores
// took 121 s of wall time, and about 4.5 s on an idle machine.
const wallSlack = 10 * time.Minute

func newIdleClock(now time.Time) *idleClock {
	return &idleClock{last: now, wall: now, stop: make(chan struct{})}
}

// watch samples process pid until Close.
func (c *idleClock) watch(pid int) *idleClock {
	go func() {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case now := <-t.C:
				c.tick(now, runnable(pid))
			}
		}
	}()
	return c
}

// Close stops the sampler.
func (c *idleClock) Close() { close(c.stop) }

// tick accounts the interval up to now: idle unless busy.
func (c *idleClock) tick(now time.Time, busy bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := now.Sub(c.last); d > 0 {
		if !busy {
			c.idle += d
		}
		c.last = now
	}
}

// over reports whether a wait bounded by timeout is over at now.
func (c *idleClock) over(now time.Time, timeout time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idle > timeout || now.Sub(c.wall) > timeout+wallSlack
}

// String says what the clock measured, for an error.
func (c *idleClock) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return "idle " + c.idle.Round(time.Millisecond).String() + " of " +
		c.last.Sub(c.wall).Round(time.Millisecond).String()
}

// runnable reports whether a thread of process pid is running, runnable
// or in disk sleep. A process that is gone, or whose threads cannot be read,
// is not (the caller notices an exit on its own).
func runnable(pid int) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "stat"))
		if err != nil {
			continue
		}
		if state, err := threadState(b); err == nil && (state == 'R' || state == 'D') {
			return true
		}
	}
	return false
}

// threadState is the state field (3) of a /proc stat line.
func threadState(stat []byte) (byte, error) {
	f, err := statFields(stat)
	if err != nil || len(f[0]) != 1 {
		return 0, errors.New("envoy: unexpected stat line")
	}
	return f[0][0], nil
}

// statFields are the fields of a /proc stat line from the third (state)
// on. The command name (field 2) is in parentheses and may hold spaces and
// parentheses: the fields follow the last closing one, after a space.
func statFields(stat []byte) ([]string, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+1 >= len(stat) || stat[i+1] != ' ' {
		return nil, errors.New("envoy: unexpected stat line")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) == 0 {
		return nil, errors.New("envoy: unexpected stat line")
	}
	return f, nil
}

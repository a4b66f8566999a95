// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
)

// harnessTB is the smallest testing.TB that lets a program use
// internal/envoytest, which was written for tests. Fatalf and Skipf end the
// calling goroutine as their testing counterparts do, so every harness call
// goes through call, which runs it on a goroutine of its own and turns that
// ending into an error. Cleanup functions run, newest first, in close.
//
// Only the methods envoytest uses are implemented; the embedded nil
// testing.TB supplies the unexported method and would panic if anything else
// were called.
type harnessTB struct {
	testing.TB

	mu       sync.Mutex
	failed   bool
	msgs     []string
	cleanups []func()
	dirs     []string
	verbose  bool
}

var errHarness = errors.New("bench: harness call failed")

// call runs f as a harness call and returns an error carrying the messages
// of Fatalf, Errorf or Skipf if f ended in one of them.
func (t *harnessTB) call(f func()) error {
	t.mu.Lock()
	start := len(t.msgs)
	t.mu.Unlock()
	done := make(chan bool)
	go func() {
		completed := false
		defer func() { done <- completed }()
		f()
		completed = true
	}()
	completed := <-done
	t.mu.Lock()
	defer t.mu.Unlock()
	if completed && !t.failed {
		return nil
	}
	msgs := t.msgs[start:]
	t.failed = false
	if len(msgs) == 0 {
		return errHarness
	}
	return fmt.Errorf("%w: %s", errHarness, msgs[len(msgs)-1])
}

func (t *harnessTB) record(failed bool, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.msgs = append(t.msgs, fmt.Sprintf(format, args...))
	if failed {
		t.failed = true
	}
}

func (t *harnessTB) Helper()      {}
func (t *harnessTB) Name() string { return "bench" }
func (t *harnessTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *harnessTB) Fail() { t.record(true, "failed") }
func (t *harnessTB) FailNow() {
	t.record(true, "failed")
	runtime.Goexit()
}
func (t *harnessTB) Errorf(format string, args ...any) { t.record(true, format, args...) }
func (t *harnessTB) Error(args ...any)                 { t.record(true, "%s", fmt.Sprint(args...)) }
func (t *harnessTB) Fatalf(format string, args ...any) {
	t.record(true, format, args...)
	runtime.Goexit()
}
func (t *harnessTB) Fatal(args ...any) {
	t.record(true, "%s", fmt.Sprint(args...))
	runtime.Goexit()
}
func (t *harnessTB) Skipf(format string, args ...any) {
	t.record(true, format, args...)
	runtime.Goexit()
}
func (t *harnessTB) Logf(format string, args ...any) {
	if t.verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}
func (t *harnessTB) Log(args ...any) { t.Logf("%s", fmt.Sprint(args...)) }

func (t *harnessTB) Cleanup(f func()) {
	t.mu.Lock()
	t.cleanups = append(t.cleanups, f)
	t.mu.Unlock()
}

// TempDir returns a new directory, removed by close.
func (t *harnessTB) TempDir() string {
	dir, err := os.MkdirTemp("", "bench-envoy-")
	if err != nil {
		t.Fatalf("bench: temp dir: %v", err)
	}
	t.mu.Lock()
	t.dirs = append(t.dirs, dir)
	t.mu.Unlock()
	return dir
}

// close runs the cleanup functions, newest first, and removes the temporary
// directories.
func (t *harnessTB) close() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		_ = t.call(f)
	}
	t.mu.Lock()
	dirs := t.dirs
	t.dirs = nil
	t.mu.Unlock()
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

package rls

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A changed file applies without a restart; every bucket whose limit did
// not change keeps its tokens (its name depends only on its key and limit),
// one whose limit changed starts anew; a refused file is logged and counted,
// and the previous configuration keeps serving.
func TestReload(t *testing.T) {
	c := newClock(epoch)
	f := start(t, `
domain: d
descriptors:
  - key: kept
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: changed
    rate_limit: {unit: minute, requests_per_unit: 5}
`, fixtureOpts{store: memory(c), now: c.Now})
	for range 3 {
		f.call(request("d", desc("kept", "x"), desc("changed", "x")))
	}
	if applied, err := f.w.Check(); applied || err != nil {
		t.Fatalf("unchanged files: applied %v, %v", applied, err)
	}
	f.write("config.yaml", `
domain: d
descriptors:
  - key: kept
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: changed
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: added
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	if applied, err := f.settle(); !applied || err != nil {
		t.Fatalf("a changed file: applied %v, %v", applied, err)
	}
	r := f.call(request("d", desc("kept", "x"), desc("changed", "x"), desc("added", "x")))
	if got := r.Statuses[0].LimitRemaining; got != 1 {
		t.Errorf("kept: %d left, want 1 (5 - 3 before the reload - 1)", got)
	}
	if got := r.Statuses[1].LimitRemaining; got != 5 {
		t.Errorf("changed: %d left, want 5 (a new bucket of 6, less 1)", got)
	}
	if got := r.Statuses[2].CurrentLimit.GetRequestsPerUnit(); got != 1 {
		t.Errorf("added: %v", r.Statuses[2])
	}

	// A refused change: the error names file, line and field; the
	// previous configuration serves on.
	f.write("config.yaml", `
domain: d
descriptors:
  - key: kept
    rate_limit: {unit: fortnight, requests_per_unit: 5}
`)
	applied, err := f.settle()
	if applied || err == nil {
		t.Fatalf("a bad file: applied %v, %v", applied, err)
	}
	want := filepath.Join(f.dir, "config.yaml") + ":5: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it to contain %q", err, want)
	}
	if got := f.counter("limitd_rls_config_loads_total", map[string]string{"result": "error"}); got != 1 {
		t.Errorf("refused loads %v, want 1", got)
	}
	if got := f.counter("limitd_rls_config_loads_total", map[string]string{"result": "success"}); got != 2 {
		t.Errorf("loads %v, want 2", got)
	}
	r = f.call(request("d", desc("kept", "x"), desc("added", "y")))
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].CurrentLimit == nil {
		t.Errorf("after the refused file: %v", r)
	}
	// The same bad file is not tried again; a file added to the folder is.
	if applied, err := f.w.Check(); applied || err != nil {
		t.Errorf("the same bad file again: applied %v, %v", applied, err)
	}
	f.write("config.yaml", "domain: d\n")
	f.write("other.yml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if applied, err := f.settle(); !applied || err != nil {
		t.Fatalf("a fixed file and a new one: applied %v, %v", applied, err)
	}
	if got := f.srv.Config().Domains(); strings.Join(got, ",") != "d,e" {
		t.Errorf("domains %v", got)
	}
	// A folder's files naming one domain twice are refused.
	f.write("third.yaml", "domain: e\n")
	if _, err := f.settle(); err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Errorf("a domain twice: %v", err)
	}
	// A missing path is refused too, and the last configuration serves.
	if err := os.RemoveAll(f.dir); err != nil {
		t.Fatal(err)
	}
	if _, err := f.w.Check(); err == nil {
		t.Error("a missing folder was accepted")
	}
	if f.srv.Config() == nil || len(f.srv.Config().Domains()) != 2 {
		t.Error("the configuration was dropped")
	}
}

// A file written slowly in place is loaded only once it has stopped
// changing: a poll that finds the files changed since the last poll waits
// for the next, and applies them when they read the same on both. A half
// written file (valid YAML, its limits missing) never serves.
func TestReloadWaitsForWrittenFiles(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	full := basicYAML + "  - key: added\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	half := full[:strings.Index(full, "  - key: generic_key")]
	for i, step := range []struct {
		write   string // "" writes nothing
		applied bool
	}{
		{half, false}, // new: wait for the next poll
		{full, false}, // changed since: wait again
		{"", true},    // the same on two polls: applied
		{"", false},   // unchanged
		{half, false}, // a new edit starts
		{basicYAML, false},
		{basicYAML, true},
	} {
		if step.write != "" {
			f.write("config.yaml", step.write)
		}
		applied, err := f.w.Check()
		if err != nil || applied != step.applied {
			t.Fatalf("poll %d: applied %v, %v; want %v", i, applied, err, step.applied)
		}
		if lim := f.srv.Config(); len(lim.Limits("apis")) == 0 {
			t.Fatalf("poll %d: the half-written file serves", i)
		}
	}
	if got := len(f.srv.Config().Limits("apis")); got != 1 {
		t.Errorf("limits %d after the last poll, want 1", got)
	}
}

// settle polls f's files twice, as the Watcher's ticker would: the first
// poll sees a change, the second applies it. It returns the second poll's
// result.
func (f *fixture) settle() (bool, error) {
	f.t.Helper()
	if applied, err := f.w.Check(); applied || err != nil {
		f.t.Fatalf("the first poll after a change: applied %v, %v; want it to wait", applied, err)
	}
	return f.w.Check()
}

// A FIFO named like a configuration file neither blocks the Watcher nor
// passes silently: it is skipped, and logged once while it stays.
func TestReloadSkipsFIFO(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	if err := syscall.Mkfifo(filepath.Join(f.dir, "fifo.yaml"), 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		w, err := NewWatcher(f.dir, f.srv, slog.New(slog.NewTextHandler(&logs, nil)))
		if err == nil {
			_, err = w.Check()
		}
		done <- err
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-timeout.C:
		t.Fatal("the Watcher blocked on a FIFO")
	}
	if got := strings.Count(logs.String(), "fifo.yaml"); got != 1 {
		t.Errorf("logs %q: want the FIFO named once", logs.String())
	}
}

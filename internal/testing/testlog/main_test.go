// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run is `go test -json` output of a package with a passing test, a test
// whose subtest fails, a skipped test, and a package that does not build.
const run = `{"Action":"start","Package":"example.com/a"}
{"Action":"run","Package":"example.com/a","Test":"TestOK"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"example.com/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"example.com/a","Test":"TestOK"}
{"Action":"run","Package":"example.com/a","Test":"TestBad"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"run","Package":"example.com/a","Test":"TestBad/wasm"}
{"Action":"output","Package":"example.com/a","Test":"TestBad/wasm","Output":"=== RUN   TestBad/wasm\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBad/wasm","Output":"    a_test.go:9: got 1, want 2\n"}
{"Action":"output","Package":"example.com/a","Test":"TestBad/wasm","Output":"--- FAIL: TestBad/wasm (0.00s)\n"}
{"Action":"fail","Package":"example.com/a","Test":"TestBad/wasm"}
{"Action":"output","Package":"example.com/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"example.com/a","Test":"TestBad"}
{"Action":"run","Package":"example.com/a","Test":"TestNoRedis"}
{"Action":"output","Package":"example.com/a","Test":"TestNoRedis","Output":"=== RUN   TestNoRedis\n"}
{"Action":"output","Package":"example.com/a","Test":"TestNoRedis","Output":"    a_test.go:20: redis-server not found (CI=true makes this a failure)\n"}
{"Action":"output","Package":"example.com/a","Test":"TestNoRedis","Output":"--- SKIP: TestNoRedis (0.00s)\n"}
{"Action":"skip","Package":"example.com/a","Test":"TestNoRedis"}
{"Action":"output","Package":"example.com/a","Output":"FAIL\n"}
{"Action":"output","Package":"example.com/a","Output":"FAIL\texample.com/a\t0.01s\n"}
{"Action":"fail","Package":"example.com/a"}
{"ImportPath":"example.com/b","Action":"build-output","Output":"b/b.go:3:1: syntax error\n"}
{"ImportPath":"example.com/b","Action":"build-fail"}
{"Action":"output","Package":"example.com/b","Output":"FAIL\texample.com/b [build failed]\n"}
{"Action":"fail","Package":"example.com/b"}
go: some message that is not an event
`

func TestRecordsAndSummary(t *testing.T) {
	dir := t.TempDir()
	var out, full bytes.Buffer
	r := newReader(&out, &full, false)
	if err := r.read(strings.NewReader(run)); err != nil {
		t.Fatal(err)
	}
	if err := r.save(dir, "unit"); err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Passed: 1, Failed: 2, Skipped: 1, PackagesFailed: 1}); r.counts != want {
		t.Errorf("counts %+v, want %+v", r.counts, want)
	}
	for _, want := range []string{"=== RUN   TestBad/wasm", "a_test.go:9: got 1, want 2", "--- SKIP: TestNoRedis", "go: some message"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("standard output lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(full.String(), "--- PASS: TestOK") {
		t.Errorf("the log lacks the passing test:\n%s", full.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "parts"), []byte("unit failed 75\ne2e ok 30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	failed, err := summarize(&sum, dir)
	if err != nil || !failed {
		t.Fatalf("summarize: failed %v, err %v", failed, err)
	}
	s := sum.String()
	for _, want := range []string{
		"== make test: 2 parts in 1m45s",
		"unit            FAILED    1m15s  1 passed, 2 failed, 1 skipped, 1 packages failed",
		"FAIL unit example.com/b (the package): b/b.go:3:1: syntax error",
		"e2e             ok          30s  0 passed, 0 failed, 0 skipped",
		"FAIL unit example.com/a TestBad/wasm: a_test.go:9: got 1, want 2",
		"SKIP unit example.com/a TestNoRedis: a_test.go:20: redis-server not found (CI=true makes this a failure)",
		"make test: FAILED",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "TestBad:") {
		t.Errorf("summary names the parent of a failed subtest:\n%s", s)
	}
}

// TestPackagesOutput: -print packages shows a line a package and the whole
// output of a failing test, not every test's start.
func TestPackagesOutput(t *testing.T) {
	var out bytes.Buffer
	r := newReader(&out, &bytes.Buffer{}, true)
	if err := r.read(strings.NewReader(run)); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if strings.Contains(s, "=== RUN   TestOK") || !strings.Contains(s, "a_test.go:9: got 1, want 2") || !strings.Contains(s, "FAIL\texample.com/b [build failed]") {
		t.Errorf("-print packages:\n%s", s)
	}
}

// TestSummaryWallTime: when parts run side by side, the summary's time is
// the run's wall time (<dir>/wall), with the parts' sum beside it, not the
// sum alone (which overstates a run whose parts overlap).
func TestSummaryWallTime(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "parts"), []byte("test-build ok 5\nunit ok 300\ne2e-parallel ok 250\ne2e-serial ok 100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "wall"), []byte("405\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	failed, err := summarize(&sum, dir)
	if err != nil || failed {
		t.Fatalf("summarize: failed %v, err %v", failed, err)
	}
	if want := "== make test: 4 parts in 6m45s (the parts' times add up to 10m55s: some ran side by side)"; !strings.Contains(sum.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, sum.String())
	}
	if err := os.WriteFile(filepath.Join(dir, "wall"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := summarize(&sum, dir); err == nil {
		t.Error("summarize took a malformed wall file")
	}
}

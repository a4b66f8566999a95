// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command testlog is `make test`'s reporter: every part of `make test` runs
// even when an earlier one failed, and the end of the run names what failed
// and what skipped, and why.
//
// Reading one `go test -json` run on standard input:
//
//	go test -json ./... 2>&1 | testlog -part unit -dir build/test -log build/unit.log [-print runs]
//
// it writes the whole output to -log, prints to standard output what a
// reader follows (-print runs: every test's start and end and the lines its
// tests log, as `go test -v | grep` did; -print packages: a line a package,
// and the whole output of each test that fails), and appends what failed
// and what skipped (with the test's last words: its reason) to
// <dir>/<part>.records, one JSON object a line, with the counts in
// <dir>/<part>.counts. It exits 1 when a test or a package failed.
//
// After every part:
//
//	testlog -summary build/test
//
// prints each part's outcome and time (from <dir>/parts, a line
// "<part> <ok|failed> <seconds>" each, which the Makefile writes), the
// run's wall time (from <dir>/wall, its seconds, when parts ran side by
// side), the tests that failed and those that skipped with their reasons,
// and exits 1 when a part failed.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	part := flag.String("part", "", "the part of make test this run is (unit, e2e, ...)")
	dir := flag.String("dir", "", "where the records go")
	logPath := flag.String("log", "", "the file for the whole output")
	print := flag.String("print", "runs", "what goes to standard output: runs or packages")
	summary := flag.String("summary", "", "print the summary of the records in this directory")
	flag.Parse()
	if *summary != "" {
		failed, err := summarize(os.Stdout, *summary)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testlog:", err)
			os.Exit(2)
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	if *part == "" || *dir == "" || (*print != "runs" && *print != "packages") {
		fmt.Fprintln(os.Stderr, "testlog: -part, -dir and -print runs|packages, or -summary")
		os.Exit(2)
	}
	var full io.Writer = io.Discard
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testlog:", err)
			os.Exit(2)
		}
		defer f.Close()
		full = f
	}
	r := newReader(os.Stdout, full, *print == "packages")
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	if err := r.save(*dir, *part); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	if r.counts.Failed > 0 || r.counts.PackagesFailed > 0 {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail name the package so
	Test       string
	Output     string
}

// Record is a test (or a package, Test empty) that failed or skipped.
type Record struct {
	Part    string `json:"part"`
	Kind    string `json:"kind"` // "fail" or "skip"
	Package string `json:"package"`
	Test    string `json:"test,omitempty"`
	Reason  string `json:"reason"`
}

// Counts are a part's tests by outcome, leaves and parents alike.
type Counts struct {
	Passed, Failed, Skipped, PackagesFailed int
}

// runsRE is what -print runs shows, as the Makefile's grep did.
var runsRE = regexp.MustCompile(`^(=== RUN|--- |PASS|FAIL|ok|panic)|_test\.go`)

type reader struct {
	out, full io.Writer
	packages  bool                // -print packages
	output    map[string][]string // a running test's output lines, by package and test
	testFails map[string]bool     // packages with a failed test
	records   []Record
	counts    Counts
}

func newReader(out, full io.Writer, packages bool) *reader {
	return &reader{out: out, full: full, packages: packages, output: map[string][]string{}, testFails: map[string]bool{}}
}

// read consumes the events; a line that is not an event (go's own
// messages) is shown and logged as it is.
func (r *reader) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
			fmt.Fprintln(r.out, line)
			fmt.Fprintln(r.full, line)
			continue
		}
		r.event(e)
	}
	return sc.Err()
}

func (r *reader) event(e event) {
	if e.Package == "" && e.ImportPath != "" {
		e.Package, _, _ = strings.Cut(e.ImportPath, " ") // "p [p.test]"
	}
	key := e.Package + " " + e.Test
	switch e.Action {
	case "output", "build-output":
		io.WriteString(r.full, e.Output)
		text := strings.TrimRight(e.Output, "\n")
		r.output[key] = append(r.output[key], text)
		switch {
		case !r.packages && runsRE.MatchString(text):
			fmt.Fprintln(r.out, text)
		case r.packages && e.Test == "" && (strings.HasPrefix(text, "ok") || strings.HasPrefix(text, "FAIL") || strings.HasPrefix(text, "panic") || e.Action == "build-output"):
			fmt.Fprintln(r.out, text)
		}
	case "pass":
		if e.Test != "" {
			r.counts.Passed++
		}
		delete(r.output, key)
	case "skip":
		if e.Test != "" {
			r.counts.Skipped++
			r.records = append(r.records, Record{Kind: "skip", Package: e.Package, Test: e.Test, Reason: reason(r.output[key], "--- SKIP")})
		}
		delete(r.output, key)
	case "fail":
		if e.Test == "" {
			// A package whose tests failed says no more than they do;
			// one that failed otherwise (its build, a panic, a
			// timeout) is named with its last words.
			if !r.testFails[e.Package] {
				r.counts.PackagesFailed++
				r.records = append(r.records, Record{Kind: "fail", Package: e.Package, Reason: reason(r.output[key], "FAIL")})
			}
			delete(r.output, key)
			return
		}
		r.counts.Failed++
		r.testFails[e.Package] = true
		if r.packages {
			for _, l := range r.output[key] {
				fmt.Fprintln(r.out, l)
			}
		}
		r.records = append(r.records, Record{Kind: "fail", Package: e.Package, Test: e.Test, Reason: reason(r.output[key], "--- FAIL")})
		delete(r.output, key)
	}
}

// reason is what a test said before it ended: its logged lines, without
// the framework's own, joined and bounded.
func reason(lines []string, end string) string {
	var said []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, end) || strings.HasPrefix(t, "--- ") || t == "FAIL" {
			continue
		}
		said = append(said, t)
	}
	if len(said) > 3 {
		said = said[len(said)-3:]
	}
	s := strings.Join(said, " / ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	if s == "" {
		s = "(no message)"
	}
	return s
}

// leaves drops a record whose test is the parent of another record of the
// same kind: a subtest's failure fails its parents too, and says more.
func leaves(recs []Record) []Record {
	var out []Record
	for i, a := range recs {
		parent := false
		for j, b := range recs {
			if i != j && a.Kind == b.Kind && a.Package == b.Package && a.Test != "" && strings.HasPrefix(b.Test, a.Test+"/") {
				parent = true
				break
			}
		}
		if !parent {
			out = append(out, a)
		}
	}
	return out
}

func (r *reader) save(dir, part string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, part+".records"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, rec := range leaves(r.records) {
		rec.Part = part
		if err := enc.Encode(rec); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	// Counts add up over the part's runs (unit runs go test three times).
	var c Counts
	if b, err := os.ReadFile(filepath.Join(dir, part+".counts")); err == nil {
		_ = json.Unmarshal(b, &c)
	}
	c.Passed += r.counts.Passed
	c.Failed += r.counts.Failed
	c.Skipped += r.counts.Skipped
	c.PackagesFailed += r.counts.PackagesFailed
	b, _ := json.Marshal(c)
	return os.WriteFile(filepath.Join(dir, part+".counts"), b, 0o644)
}

// summarize prints the summary of dir and reports whether a part failed.
func summarize(w io.Writer, dir string) (failed bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "parts"))
	if err != nil {
		return false, err
	}
	type partRun struct {
		name, status string
		took         time.Duration
	}
	var parts []partRun
	var total time.Duration
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			return false, fmt.Errorf("%s: malformed line %q", filepath.Join(dir, "parts"), l)
		}
		s, err := strconv.Atoi(f[2])
		if err != nil {
			return false, fmt.Errorf("%s: %q: %v", filepath.Join(dir, "parts"), l, err)
		}
		parts = append(parts, partRun{f[0], f[1], time.Duration(s) * time.Second})
		total += time.Duration(s) * time.Second
		failed = failed || f[1] != "ok"
	}
	var fails, skips []Record
	// <dir>/wall, when the Makefile wrote it, is the run's wall time: with
	// parts side by side it is less than their sum.
	if b, err := os.ReadFile(filepath.Join(dir, "wall")); err == nil {
		s, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return failed, fmt.Errorf("%s: %v", filepath.Join(dir, "wall"), err)
		}
		fmt.Fprintf(w, "\n== make test: %d parts in %v (the parts' times add up to %v: some ran side by side)\n",
			len(parts), time.Duration(s)*time.Second, total)
	} else {
		fmt.Fprintf(w, "\n== make test: %d parts in %v\n", len(parts), total)
	}
	for _, p := range parts {
		var c Counts
		if b, err := os.ReadFile(filepath.Join(dir, p.name+".counts")); err == nil {
			_ = json.Unmarshal(b, &c)
		}
		recs, err := readRecords(filepath.Join(dir, p.name+".records"))
		if err != nil {
			return failed, err
		}
		for _, r := range recs {
			if r.Kind == "fail" {
				fails = append(fails, r)
			} else {
				skips = append(skips, r)
			}
		}
		status := "ok"
		if p.status != "ok" {
			status = "FAILED"
		}
		detail := fmt.Sprintf("%d passed, %d failed, %d skipped", c.Passed, c.Failed, c.Skipped)
		if c.PackagesFailed > 0 {
			detail += fmt.Sprintf(", %d packages failed", c.PackagesFailed)
		}
		if p.status != "ok" && c.Failed == 0 && c.PackagesFailed == 0 {
			detail += " (it failed outside the tests: see its output above)"
		}
		fmt.Fprintf(w, "%-15s %-6s %8v  %s\n", p.name, status, p.took, detail)
	}
	sort.SliceStable(fails, func(i, j int) bool { return fails[i].Part < fails[j].Part })
	fmt.Fprintf(w, "failed: %d\n", len(fails))
	for _, r := range fails {
		fmt.Fprintf(w, "  FAIL %s %s %s: %s\n", r.Part, r.Package, cmp.Or(r.Test, "(the package)"), r.Reason)
	}
	fmt.Fprintf(w, "skipped: %d\n", len(skips))
	for _, r := range skips {
		fmt.Fprintf(w, "  SKIP %s %s %s: %s\n", r.Part, r.Package, r.Test, r.Reason)
	}
	if failed {
		fmt.Fprintln(w, "make test: FAILED")
	} else {
		fmt.Fprintln(w, "make test: ok")
	}
	return failed, nil
}

func readRecords(path string) ([]Record, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []Record
	dec := json.NewDecoder(f)
	for {
		var r Record
		if err := dec.Decode(&r); err == io.EOF {
			return recs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		recs = append(recs, r)
	}
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommittedPagesAreGenerated checks that the figures of the front page
// and of docs/benchmarks/README.md are what this program writes from the
// committed docs/benchmarks/results.json, so none is typed by hand: after a
// change to the renderer, `make build/bench && build/bench -render
// docs/benchmarks/results.json` from the repository root rewrites both.
func TestCommittedPagesAreGenerated(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	rep, err := readReport(filepath.Join(root, "docs", "benchmarks", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "benchmarks", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(page) != rep.markdown() {
		t.Error("docs/benchmarks/README.md is not what the renderer writes from results.json: from the repository root, run make build/bench && build/bench -render docs/benchmarks/results.json")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := rep.frontCost()
	if err != nil {
		t.Fatal(err)
	}
	got, err := replaceFront(string(readme), want)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(readme) {
		t.Errorf("README.md's cost sentence is not what the renderer writes from results.json:\n%s", want)
	}
}

// TestReplaceFront: the text between the markers is replaced, the rest
// kept; missing or repeated markers are errors.
func TestReplaceFront(t *testing.T) {
	doc := "# t\n\n" + frontBegin + "\nold\n" + frontEnd + "\n\nrest\n"
	got, err := replaceFront(doc, "new sentence.")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# t\n\n" + frontBegin + "\nnew sentence.\n" + frontEnd + "\n\nrest\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"no markers", frontBegin + "\n" + frontBegin + "\n" + frontEnd, frontEnd + "\n" + frontBegin} {
		if _, err := replaceFront(bad, "x"); err == nil {
			t.Errorf("replaceFront(%q) gave no error", bad)
		}
	}
}

// TestFrontCost: the sentence names one ratio and one memory figure, from
// the plugin's local rule against no filter.
func TestFrontCost(t *testing.T) {
	rep := &report{Info: info{Date: "2026-11-23 02:59 UTC"}, Results: []*summary{
		{ID: 1, CPUSat: spread{Median: 100, N: 1}, RSSMiB: spread{Median: 66, N: 1}},
		{ID: 3, CapVs1: spread{Median: 0.5361, N: 4}, RSSMiB: spread{Median: 173.9, N: 1}},
	}}
	got, err := rep.frontCost()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0.54 times", "108 MiB", "2026-11-23", "(docs/benchmarks/README.md)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if _, err := (&report{}).frontCost(); err == nil {
		t.Error("a report without the plugin and no filter gave a sentence")
	}
}

// TestCommittedSavedPages checks that each page of docs/benchmarks whose
// run saved its results beside it (attribution.json, perf.json,
// ordinary.json) is what -render writes from them: from the repository
// root, build/bench -render docs/benchmarks/<name>.json rewrites it. A
// page from before its generator saved results has no such file yet.
func TestCommittedSavedPages(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "docs", "benchmarks")
	found := 0
	for _, name := range []string{"attribution", "perf", "ordinary"} {
		saved := filepath.Join(dir, name+".json")
		if _, err := os.Stat(saved); err != nil {
			continue
		}
		found++
		out := t.TempDir()
		if err := renderPage(saved, out); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(out, name+".md"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, name+".md"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("docs/benchmarks/%s.md is not what the renderer writes from %s.json: from the repository root, run make build/bench && build/bench -render docs/benchmarks/%s.json", name, name, name)
		}
	}
	if found == 0 {
		t.Error("docs/benchmarks has no saved results (perf.json at least)")
	}
}

// TestRenderPageRefusesOthers: -render names the saved results it knows.
func TestRenderPageRefusesOthers(t *testing.T) {
	if err := renderPage(filepath.Join(t.TempDir(), "other.json"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "want results.json") {
		t.Errorf("renderPage(other.json) = %v", err)
	}
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// numberRE finds a configuration's number as the pages once wrote it:
// "(23)". codeRE is a code span, whose text is not prose.
var (
	numberRE = regexp.MustCompile(`\([0-9]{1,2}\)`)
	codeRE   = regexp.MustCompile("`[^`]*`")
	issueRE  = regexp.MustCompile(`(?i)\bissues?\s+#?[0-9]`)
)

// checkNames fails t for each configuration number or issue number in the
// prose and tables of a generated page.
func checkNames(t *testing.T, page, md string) {
	t.Helper()
	for i, line := range strings.Split(md, "\n") {
		text := codeRE.ReplaceAllString(line, "")
		for _, m := range numberRE.FindAllString(text, -1) {
			t.Errorf("%s line %d: configuration number %s: %s", page, i+1, m, line)
		}
		for _, m := range issueRE.FindAllString(text, -1) {
			t.Errorf("%s line %d: %q: %s", page, i+1, m, line)
		}
	}
}

// TestAttribDocNames renders attribution.md from made-up figures for
// every configuration and load of a full run, with -compare-wasm: the page
// names each configuration, never its number.
func TestAttribDocNames(t *testing.T) {
	b := &bench{p: &params{out: t.TempDir(), rounds: 2, conns: 32, compareWasm: "other.wasm"}}
	m := attribData{cpu: map[int][]float64{}, thr: map[int][]float64{}, rel: map[int][]float64{}, within: map[string][]float64{}}
	sel, err := (&params{attrib: true}).selected()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sel {
		x := 100 + float64(s.ID)
		m.cpu[s.ID] = []float64{x, x + 1}
		m.thr[s.ID] = []float64{1e6 / x, 1e6 / (x + 1)}
		m.rel[s.ID] = []float64{101 / x, 102 / (x + 1)}
	}
	for i, set := range splitSets {
		m.within[strconv.Itoa(splitSetup.ID)+"/"+set.name] = []float64{140 + float64(i), 141 + float64(i)}
	}
	for i, ly := range b.layers() {
		m.within[strconv.Itoa(layersSetup.ID)+"/"+ly.name] = []float64{80 + float64(i), 81 + float64(i)}
	}
	md := b.attribDoc(m, "0.1 0.2 0.3", "0.4 0.5 0.6")
	checkNames(t, "attribution.md", md)
	for _, want := range []string{
		"## The plugin against its parts", "## Within one Envoy", "## Every layer within one Envoy",
		"## How far apart two Envoys measure", "## What the floors mean",
		"| " + nameNone + " |", "| " + namePlugin + " |", "| Go floor + 100 × proxy_get_shared_data (a 32-byte value) |",
		"| " + namePlugin + ", a second Envoy |", "| " + namePlugin + ", the -compare-wasm build |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("attribution.md has no %q:\n%s", want, md)
		}
	}
}

// TestPerfLabel checks the names of perf.md's rows.
func TestPerfLabel(t *testing.T) {
	for _, tc := range []struct {
		s    setup
		load string
		want string
	}{
		{setups[2], "", "plugin, local rule"},
		{attribSetups[1], "", "Go floor + 100 × proxy_get_shared_data (a 32-byte value)"},
		{layersSetup, layers[0].name, "one Envoy, a listener per layer: no filter"},
		{splitSetup, splitSets[0].name, "plugin, rules chosen by request header: no rule applies"},
	} {
		got := perfLabel(tc.s, tc.load)
		if got != tc.want {
			t.Errorf("perfLabel(%q, %q) = %q, want %q", tc.s.Label, tc.load, got, tc.want)
		}
		checkNames(t, "perf.md", got)
	}
}

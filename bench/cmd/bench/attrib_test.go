// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"path/filepath"
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
	m := &attribData{Date: "2026-11-29 17:00 UTC", LoadStart: "0.1 0.2 0.3", LoadEnd: "0.4 0.5 0.6", Rounds: 2, Conns: 32, SatWindow: "3s",
		CompareWasm: "other.wasm", NativeRejected: 1.3, NativeRejectedDate: "2026-11-26 05:49 UTC",
		CPU: map[int][]float64{}, Thr: map[int][]float64{}, Rel: map[int][]float64{}, Within: map[string][]float64{}}
	sel, err := (&params{attrib: true}).selected()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sel {
		x := 100 + float64(s.ID)
		m.CPU[s.ID] = []float64{x, x + 1}
		m.Thr[s.ID] = []float64{1e6 / x, 1e6 / (x + 1)}
		m.Rel[s.ID] = []float64{101 / x, 102 / (x + 1)}
	}
	for i, set := range splitSets {
		m.Within[strconv.Itoa(splitSetup.ID)+"/"+set.name] = []float64{140 + float64(i), 141 + float64(i)}
	}
	for i, ly := range m.layers() {
		m.Within[strconv.Itoa(layersSetup.ID)+"/"+ly.name] = []float64{80 + float64(i), 81 + float64(i)}
	}
	md := m.doc()
	// The page is what the saved figures render: attribution.json gives
	// the same page back (bench -render).
	path := filepath.Join(t.TempDir(), "attribution.json")
	if err := writeJSON(path, m); err != nil {
		t.Fatal(err)
	}
	var back attribData
	if err := readJSON(path, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.doc(); got != md {
		t.Errorf("attribution.json renders another page:\n%s\nwant:\n%s", got, md)
	}
	checkNames(t, "attribution.md", md)
	for _, want := range []string{
		"## The plugin against its parts", "## Within one Envoy", "## Every layer within one Envoy",
		"## How far apart two Envoys measure", "## What the floors mean", "about 0.",
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

// TestPerfDocRoundTrip: perf.md groups the loads of one Envoy under its
// name, and perf.json gives the same page back.
func TestPerfDocRoundTrip(t *testing.T) {
	m := &perfData{Date: "2026-11-29 17:00 UTC", LoadStart: "1 1 1", Profile: "5s", Conns: 32, Rows: []perfRow{
		{Label: namePlugin, Samples: 9000, CPU: 150, Shares: map[string]float64{"envoy": 68.8, "jit": 13.6}},
		{Label: layersSetup.Label, Load: layers[0].name, Samples: 9000, CPU: 83.6, Shares: map[string]float64{"envoy": 74}},
		{Label: layersSetup.Label, Load: layers[1].name, Samples: 9000, CPU: 96.5, Shares: map[string]float64{"envoy": 76.1}},
	}}
	md := m.doc()
	for _, want := range []string{
		"Every profile has 9000 samples.",
		"| " + namePlugin + " | 150.0 | 68.8% | 0.0% | 13.6% | 0.0% | 0.0% |",
		"| *" + layersSetup.Label + "*: | | | | | | |\n| – " + layers[0].name + " | 83.6 | 74.0% |",
		"| – " + layers[1].name + " | 96.5 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("perf.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "*"+layersSetup.Label+"*") != 1 {
		t.Errorf("the group's name is not written once:\n%s", md)
	}
	// Profiles of different sizes name their samples in a column.
	m.Rows[1].Samples = 8000
	if md := m.doc(); !strings.Contains(md, "| – "+layers[0].name+" | 8000 | 83.6 |") || !strings.Contains(md, "| *"+layersSetup.Label+"*: | | | | | | | |\n") {
		t.Errorf("no samples column:\n%s", md)
	}
	m.Rows[1].Samples = 9000
	checkNames(t, "perf.md", md)
	path := filepath.Join(t.TempDir(), "perf.json")
	if err := writeJSON(path, m); err != nil {
		t.Fatal(err)
	}
	var back perfData
	if err := readJSON(path, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.doc(); got != md {
		t.Errorf("perf.json renders another page:\n%s\nwant:\n%s", got, md)
	}
}

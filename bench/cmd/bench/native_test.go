// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestWasmOrNative checks the section's ratios are taken round by round:
// (module − none) ÷ (plugin − none) of each round, then the median.
func TestWasmOrNative(t *testing.T) {
	res := func(id int, cpu ...float64) *summary {
		s := &summary{ID: id}
		for _, c := range cpu {
			s.Sat = append(s.Sat, satResult{Requests: 1000, CPUPerReqUS: c})
		}
		return s
	}
	r := &report{Results: []*summary{
		res(1, 30, 40, 30), res(2, 33, 44, 36), res(3, 70, 80, 90), res(12, 40, 60, 36),
		res(13, 30, 30, 30), res(14, 70, 70, 70), res(15, 35, 40, 50),
	}, Startups: []startup{
		{Name: "no filter", CPU: spread{Median: 0.1, N: 1}, RSSMiB: spread{Median: 60, N: 1}},
		{Name: "native module", CPU: spread{Median: 0.2, N: 1}, RSSMiB: spread{Median: 90, N: 1}},
	}}
	// Pinned overhead per round: 10/40, 20/40, 6/60 → median 0.25.
	if got := r.perRound(overhead, 1, 12, 3); got.Median != 0.25 || got.Min != 0.1 || got.Max != 0.5 {
		t.Errorf("pinned overhead = %+v, want median 0.25 (0.10–0.50)", got)
	}
	var b strings.Builder
	r.wasmOrNative(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	page := b.String()
	for _, want := range []string{
		"| module's cost ÷ the plugin's, pinned | 0.25 (0.10–0.50) | ≤ 0.60 | met |",
		// Any CPU: 5/40, 10/40, 20/40 → 0.25.
		"| module's cost ÷ the plugin's, any CPU | 0.25 (0.12–0.50) | ≤ 0.50 | met |",
		// 40/30, 60/40, 36/30 → 1.33, 1.5, 1.2 → 1.33: above 1.25.
		"| module ÷ no filter, pinned | 1.33 (1.20–1.50) | ≤ 1.25 | **not met** |",
		"| native module | 0.20 | – | 90.0 | +30.0 |",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("missing %q in:\n%s", want, page)
		}
	}
}

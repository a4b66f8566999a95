// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestParsePerfTidDSOSym: the busiest thread is the worker, and each
// sample lands in its class by thread, DSO and symbol.
func TestParsePerfTidDSOSym(t *testing.T) {
	report := `# Samples: 2K of event 'cpu-clock'
#
# Overhead  Pid:Command  Shared Object  Symbol
    50.00%  100:wrk:worker_0  envoy              [.] 0x0000000001234567
    20.00%  100:wrk:worker_0  [kernel.kallsyms]  [k] tcp_sendmsg
     5.00%  100:wrk:worker_0  [kernel.kallsyms]  [k] futex_wake
     6.00%  100:wrk:worker_0  libtokenbucket.so  [.] runtime.cgocallbackg1
     2.00%  100:wrk:worker_0  libtokenbucket.so  [.] runtime.wakep
     3.00%  100:wrk:worker_0  libtokenbucket.so  [.] github.com/ratelimit-wasm/tokenbucket/engine.(*Request).OnRequestHeaders
     1.00%  100:wrk:worker_0  libtokenbucket.so  [.] github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go.envoy_dynamic_module_on_http_filter_request_headers
     8.00%  104:wrk:worker_0  [kernel.kallsyms]  [k] finish_task_switch.isra.0
     4.00%  104:wrk:worker_0  libtokenbucket.so  [.] runtime.sysmon
     1.00%  101:envoy         libc.so.6          [.] __memmove_avx_unaligned_erms
`
	ss, err := parsePerfTidDSOSym([]byte(report))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, s := range ss {
		got[s.className] += s.pct
	}
	want := map[string]float64{
		perfClasses[0]: 50, perfClasses[2]: 20, perfClasses[1]: 5, perfClasses[4]: 6, perfClasses[5]: 2,
		perfClasses[10]: 3, perfClasses[9]: 1, perfClasses[12]: 8, perfClasses[13]: 4, perfClasses[14]: 1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: %.0f%%, want %.0f%%", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("classes %v, want %v", got, want)
	}
}

// TestOtherSwitches: the thread that used the most CPU is left out.
func TestOtherSwitches(t *testing.T) {
	a := map[string]threadTimes{"1": {10, 5}, "2": {100, 50}, "3": {1, 1000}}
	b := map[string]threadTimes{"1": {12, 9}, "2": {300, 500}, "3": {2, 1300}, "4": {0, 7}}
	if n := otherSwitches(a, b); n != 4+300+7 {
		t.Fatalf("otherSwitches = %d, want %d", n, 4+300+7)
	}
}

// TestOrdinaryTable: ratios within each round, against no filter and the
// local_ratelimit that writes the same headers.
func TestOrdinaryTable(t *testing.T) {
	mk := func(s setup, cpu ...float64) ordinaryConfig {
		c := ordinaryConfig{ID: s.ID, Label: s.Label, None: s.Kind == kindNone, Ref: ordinaryRef(s)}
		for _, x := range cpu {
			c.Lat, c.Sat, c.Thr, c.Switches = append(c.Lat, x), append(c.Sat, x/2), append(c.Thr, 1e6/x), append(c.Switches, 1)
		}
		return c
	}
	m := &ordinaryData{Configs: []ordinaryConfig{mk(setups[0], 40, 50), mk(setups[1], 44, 55), mk(nativeHeadersSetup, 44, 60), mk(setups[11], 88, 66), mk(moduleNoHeaders, 88, 110)}}
	md := m.doc()
	// ordinary.json gives the same page back (bench -render).
	path := filepath.Join(t.TempDir(), "ordinary.json")
	if err := writeJSON(path, m); err != nil {
		t.Fatal(err)
	}
	var back ordinaryData
	if err := readJSON(path, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.doc(); got != md {
		t.Errorf("ordinary.json renders another page:\n%s\nwant:\n%s", got, md)
	}
	for _, row := range []string{
		"| native module, local rule | 77.0 (66.0–88.0) | 1.76 (1.32–2.20) | with headers: 1.55 (1.10–2.00) |",
		"| native module, no response headers | 99.0 (88.0–110.0) | 2.20 | without headers: 2.00 |",
	} {
		if !strings.Contains(md, row) {
			t.Errorf("no row %q in\n%s", row, md)
		}
	}
}

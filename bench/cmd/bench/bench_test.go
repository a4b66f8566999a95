// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// TestProcReadings reads this process's CPU time and this machine's CPU 0
// as the benchmark does.
func TestProcReadings(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if _, err := cpuSeconds(os.Getpid()); err != nil {
		t.Fatalf("cpuSeconds(self): %v", err)
	}
	if c, err := readCoreTimes(0); err != nil || c.total <= 0 || c.busy > c.total {
		t.Fatalf("readCoreTimes(0) = %+v, %v", c, err)
	}
	if m := readMachine(); m.CPUs == 0 || m.Kernel == "unknown" || m.MemTotal == "" {
		t.Errorf("readMachine() = %+v", m)
	}
}

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		in   []float64
		want spread
	}{
		{nil, spread{}},
		{[]float64{3}, spread{3, 3, 3, 1}},
		{[]float64{5, 1, 3}, spread{3, 1, 5, 3}},
		{[]float64{4, 1, 3, 2}, spread{2.5, 1, 4, 4}},
	}
	for i, tt := range tests {
		if got := spreadOf(tt.in); got != tt.want {
			t.Errorf("step %d: spreadOf(%v) = %+v, want %+v", i, tt.in, got, tt.want)
		}
	}
}

func TestOtherLoad(t *testing.T) {
	a := coreTimes{busy: 1, total: 10}
	b := coreTimes{busy: 1.8, total: 11} // 1 s, 0.8 s of it busy
	if got := otherLoad(a, b, 0.5); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("otherLoad = %v, want 0.3", got)
	}
	if got := otherLoad(a, b, 2); got != 0 {
		t.Errorf("otherLoad with more Envoy CPU than busy time = %v, want 0", got)
	}
}

// TestTemplates renders every configuration's bootstrap: each has its filter
// and nothing else.
func TestTemplates(t *testing.T) {
	for _, s := range setups {
		o := s.options(1001, 1002, 100, limit{Rate: 50, Burst: 50})
		o.PluginWasm = "/p.wasm"
		d, err := envoy.Data(o)
		var out string
		if err == nil {
			out, err = envoy.Render(envoy.Bootstrap, d)
		}
		if err != nil {
			t.Fatalf("(%d) %s: %v", s.ID, s.Name, err)
		}
		wantFilter := map[kind]string{kindNone: "", kindNative: "local_ratelimit", kindPlugin: "envoy.filters.http.wasm", kindCluster: "limit_service", kindLease: "limit_service"}[s.Kind]
		if wantFilter != "" && !strings.Contains(out, wantFilter) {
			t.Errorf("(%d) %s: bootstrap lacks %q", s.ID, s.Name, wantFilter)
		}
		if s.Kind == kindNone && (strings.Contains(out, "wasm") || strings.Contains(out, "local_ratelimit")) {
			t.Errorf("(1) has a filter:\n%s", out)
		}
	}
}

// TestChartPNG renders a chart with every label the report uses, on both
// scales.
func TestChartPNG(t *testing.T) {
	var cats []string
	for _, s := range setups {
		cats = append(cats, "("+strconv.Itoa(s.ID)+")\n"+s.Plot)
	}
	ch := chart{
		Title: "Latency at 1234 req/s (open loop)", YLabel: "µs CPU/req", Categories: cats,
		Series: []series{
			{Name: "p50", Color: palette[0], Values: []spread{{100, 90, 110, 3}, {}, {12345, 12000, 13000, 3}}},
			{Name: "p99", Color: palette[1], Values: []spread{{200, 150, 250, 3}}},
		},
	}
	for _, log := range []bool{false, true} {
		ch.Log = log
		b, err := ch.png()
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil || img.Bounds().Dx() < 500 {
			t.Fatalf("log %v: %v, %v", log, img.Bounds(), err)
		}
		if out := os.Getenv("BENCH_PLOT_OUT"); out != "" {
			_ = os.WriteFile(fmt.Sprintf("%s-%v.png", out, log), b, 0o644)
		}
	}
}

func TestDemangle(t *testing.T) {
	tests := []struct{ in, want string }{
		{"github.com_ratelimit_wasm_tokenbucket_plugin.__httpContext_.reject", "plugin.(*httpContext).reject"},
		{"github.com_tetratelabs_proxy_wasm_go_sdk_proxywasm.getMapValue", "sdk.getMapValue"},
		{"internal_strconv.FormatInt", "internal_strconv.FormatInt"},
	}
	for _, tt := range tests {
		if got := demangle(tt.in); got != tt.want {
			t.Errorf("demangle(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr bool
	}{
		{nil, false},
		{[]string{"-smoke"}, false},
		{[]string{"-rounds", "0"}, true},
		{[]string{"-load", "1.5"}, true},
		{[]string{"-sat", "2m"}, true},
		{[]string{"extra"}, true},
		{[]string{"-compare-wasm", "bench_test.go"}, true}, // needs -attrib
		{[]string{"-attrib", "-compare-wasm", "no-such.wasm"}, true},
		{[]string{"-attrib", "-compare-wasm", "bench_test.go"}, false},
	}
	for _, tt := range tests {
		_, err := parseParams(tt.args)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseParams(%v) error = %v, wantErr %v", tt.args, err, tt.wantErr)
		}
	}
	p, _ := parseParams([]string{"-only", "3,1"})
	sel, err := p.selected()
	if err != nil || len(sel) != 2 || sel[0].ID != 1 || sel[1].ID != 3 {
		t.Errorf("-only 3,1 selected %v, %v", sel, err)
	}
	p, _ = parseParams([]string{"-only", "18"})
	if _, err := p.selected(); err == nil {
		t.Errorf("-only 18: no error")
	}
	p, _ = parseParams([]string{"-diag=false"})
	if sel, _ := p.selected(); len(sel) != 13 {
		t.Errorf("-diag=false selection has %d configurations, want 13 (1-6 and 11-17)", len(sel))
	}
	p, _ = parseParams([]string{"-smoke"})
	if sel, _ := p.selected(); len(sel) != 13 {
		t.Errorf("-smoke selection has %d configurations, want 13", len(sel))
	}
	p, _ = parseParams(nil)
	if sel, _ := p.selected(); len(sel) != 17 {
		t.Errorf("default selection has %d configurations, want 17", len(sel))
	}
	// Only a full run (or -render) rewrites the front page's sentence,
	// unless -front says otherwise.
	for _, tc := range []struct {
		args []string
		want string
	}{{nil, "README.md"}, {[]string{"-smoke"}, ""}, {[]string{"-attrib"}, ""}, {[]string{"-smoke", "-front", "x.md"}, "x.md"}} {
		if p, err := parseParams(tc.args); err != nil || p.front != tc.want {
			t.Errorf("parseParams(%v): -front %q (%v), want %q", tc.args, p.front, err, tc.want)
		}
	}
	// With -attrib, -only picks among the attribution's configurations.
	p, _ = parseParams([]string{"-attrib", "-only", "23,9"})
	if sel, err := p.selected(); err != nil || len(sel) != 2 || sel[0].ID != 9 || sel[1].ID != layersSetup.ID {
		t.Errorf("-attrib -only 23,9 selected %v, %v", sel, err)
	}
	p, _ = parseParams([]string{"-attrib", "-only", "6"})
	if _, err := p.selected(); err == nil {
		t.Errorf("-attrib -only 6: no error ((6) is not an attribution configuration)")
	}
}

// TestLayers checks the indexes the layers' report relies on, and that
// every layer but the first is compared with an earlier one.
func TestLayers(t *testing.T) {
	for i, want := range map[int]string{layerNull: "null", layerNullPath: "null-path", layerFloor: "ops", layerPath: "ops", layerPlugin: "plugin"} {
		if layers[i].module != want {
			t.Errorf("layers[%d] runs %q, want %q", i, layers[i].module, want)
		}
	}
	if layers[layerFloor].config(unlimited) != "none 0" || layers[layerPath].config(unlimited) != "path 1" {
		t.Errorf("the Go floor and path layers are configured %q and %q", layers[layerFloor].config(unlimited), layers[layerPath].config(unlimited))
	}
	for i, ly := range layers[1:] {
		if ly.base < 0 || ly.base > i {
			t.Errorf("layer %q is compared with layer %d", ly.name, ly.base)
		}
	}
	b := &bench{p: &params{compareWasm: "other.wasm"}}
	if ls := b.attribLayers(); len(ls) != len(layers)+1 || ls[len(ls)-1].base != layerPlugin || len(layers) != layerPlugin+1 {
		t.Errorf("with -compare-wasm: %d layers, the last compared with %d", len(ls), ls[len(ls)-1].base)
	}
}

func TestParsePerfDSO(t *testing.T) {
	report := []byte(`# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 9K of event 'cpu-clock:ppp'
# Event count (approx.): 4500000000
#
# Overhead  Shared Object
# ........  .................
#
    72.10%  envoy
            |
            ---0x55d1
    14.60%  [kernel.kallsyms]
    10.44%  [JIT] tid 1823
     2.53%  libc.so.6
`)
	shares, samples, err := parsePerfDSO(report)
	if err != nil {
		t.Fatal(err)
	}
	want := []perfShare{{"envoy", 72.10}, {"[kernel.kallsyms]", 14.60}, {"[JIT] tid 1823", 10.44}, {"libc.so.6", 2.53}}
	if samples != 9000 || len(shares) != len(want) {
		t.Fatalf("samples %d, shares %v", samples, shares)
	}
	for i := range want {
		if shares[i] != want[i] {
			t.Fatalf("share %d: %v, want %v", i, shares[i], want[i])
		}
	}
	if _, _, err := parsePerfDSO([]byte("# nothing\n")); err == nil {
		t.Fatal("a report without DSO lines was accepted")
	}
}

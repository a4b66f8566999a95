// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseCheckpoints(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string
	}{
		{"1000", []int{1000}, ""},
		{"1000, 10000,100000", []int{1000, 10000, 100000}, ""},
		{"", nil, "-keys[0]: not an integer"},
		{"10,x", nil, "-keys[1]: not an integer"},
		{"0", nil, "-keys[0]: must be 1..10000000, got 0"},
		{"20000000", nil, "-keys[0]: must be 1..10000000"},
		{"10,10", nil, "-keys[1]: must be greater than 10, got 10"},
		{"10,5", nil, "-keys[1]: must be greater than 10, got 5"},
	}
	for _, tt := range tests {
		got, err := parseCheckpoints(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseCheckpoints(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseCheckpoints(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseMemoryFlags(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	ok := []string{"-func-e-home", dir, "-plugin", bin, "-perkey", bin}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"defaults", ok, ""},
		{"no func-e home", []string{"-func-e-home", "", "-plugin", bin, "-perkey", bin}, "-func-e-home: not set"},
		{"missing plugin", []string{"-func-e-home", dir, "-plugin", filepath.Join(dir, "nope"), "-perkey", bin}, "-plugin:"},
		{"max keys", append(ok, "-max-keys", "15"), "-max-keys: must be >= 16, got 15"},
		{"conns", append(ok, "-conns", "0"), "-conns: must be 1..1024, got 0"},
		{"concurrency", append(ok, "-concurrency", "65"), "-concurrency: must be 1..64, got 65"},
		{"checkpoint within the warm-up", append(ok, "-keys", "100,1000"), "-keys[0]: must be greater than the 100 warm-up keys"},
		{"settle", append(ok, "-settle", "2m"), "-settle: must be 0..1m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseMemoryFlags(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseFlags() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !filepath.IsAbs(o.plugin) || o.maxKeys != 100000 || o.keys[len(o.keys)-1] != 1_000_000 {
				t.Fatalf("parseFlags() = %+v: want absolute paths, max_keys 100000, keys up to 1M", o)
			}
		})
	}
}

func TestGroupDigits(t *testing.T) {
	tests := []struct {
		in   int
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1 000"}, {100000, "100 000"}, {1000000, "1 000 000"}, {-12345, "-12 345"}}
	for _, tt := range tests {
		if got := groupDigits(tt.in); got != tt.want {
			t.Errorf("groupDigits(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// sampleResults is a run where the bounded table levels off at +8 MiB and
// one key per client grows by 100 bytes a key.
func sampleResults() []memResult {
	const base, allocBase = 200 << 20, 40 << 20
	bounded := memResult{design: design{name: "tokenbucket", title: "bounded table (max_keys 100000)"},
		baseline: base, allocBaseline: allocBase, freeBaseline: 20 << 20}
	perKey := memResult{design: design{name: "perkey", title: "one key per client"}, baseline: base - 40<<20, allocBaseline: allocBase}
	for _, k := range []int{1000, 10000, 100000, 500000, 1000000} {
		b := uint64(min(k, 80000)) * 100
		bounded.samples = append(bounded.samples, memSample{keys: k, rss: base + b, alloc: allocBase + b,
			stats: map[string]uint64{"wasmcustom.tokenbucket.evictions": 3}, rate: 5000})
		p := uint64(k) * 100
		perKey.samples = append(perKey.samples, memSample{keys: k, rss: base - 40<<20 + p, alloc: allocBase + p, rate: 8000})
	}
	bounded.statuses = map[int]int{200: 999900}
	perKey.statuses = map[int]int{200: 999900}
	return []memResult{bounded, perKey}
}

func TestMemoryReport(t *testing.T) {
	rep := memReport{
		when: time.Date(2026, 11, 21, 20, 0, 0, 0, time.UTC), envoy: "1.40.0", concurrency: 2, cpus: 2,
		maxKeys: 100000, conns: 64, results: sampleResults(), png: "docs/memory.png",
	}
	md := rep.markdown()
	for _, want := range []string{
		"| 100 (baseline, after the warm-up) | 200.0 | | | 160.0 | | |",
		"| 1 000 000 | 207.6 | +7.6 | +7.6 | 255.4 | +95.4 | +95.4 |",
		"25 000 shared-data keys of 4 buckets",
		"320 bytes per shared-data key, 80 bytes per bucket slot",
		"from 500 000 to 1 000 000 distinct keys (every table key exists): RSS +0.0 MiB, allocated +0.0 MiB",
		"100 bytes per key, growing without bound",
		"has allocated 12 times what the bounded table allocated",
		"`tokenbucket.evictions` 3",
		"statuses 200 × 999 900",
		"![Envoy RSS against distinct keys](memory.png)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	tab := rep.table()
	if !strings.Contains(tab, "1 000 000") || !strings.Contains(tab, "207.6 (+7.6), +7.6") {
		t.Errorf("table:\n%s", tab)
	}
}

// TestReportFreePages: when the bounded table's RSS grows less than its
// allocations, the report says where the memory came from.
func TestMemoryReportFreePages(t *testing.T) {
	res := sampleResults()
	for i := range res[0].samples {
		res[0].samples[i].rss = res[0].baseline + 1<<20
	}
	md := memReport{maxKeys: 100000, results: res}.markdown()
	if want := "held 20.0 MiB of free pages after start-up"; !strings.Contains(md, want) {
		t.Errorf("markdown lacks %q:\n%s", want, md)
	}
}

func TestDrawPlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory.png")
	if err := writePlot(path, sampleResults()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// Both series' colors are drawn.
	seen := map[[3]uint32]int{}
	for y := 0; y < img.Bounds().Dy(); y++ {
		for x := 0; x < img.Bounds().Dx(); x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}]++
		}
	}
	for i, c := range palette[:2] {
		if seen[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] < 100 {
			t.Errorf("series %d's color is (almost) absent", i)
		}
	}
	if out := os.Getenv("BENCH_PLOT_OUT"); out != "" {
		_ = os.WriteFile(out+"-memory.png", b, 0o644)
	}
	if _, err := memoryPlot(nil); err == nil {
		t.Errorf("memoryPlot(nil) succeeded, want an error")
	}
}

// keyServer answers 200 and records the x-api-key of every request.
type keyServer struct {
	mu   sync.Mutex
	keys map[string]int
}

func (s *keyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.keys[r.Header.Get("x-api-key")]++
	s.mu.Unlock()
	if r.URL.Path == "/reject" {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

func TestFlood(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		cycle      int
		from, to   int
		wantKeys   int
		wantStatus int
	}{
		{"distinct keys", "/", 0, 100, 1100, 1000, 200},
		{"cycle", "/", 7, 0, 500, 7, 200},
		{"statuses", "/reject", 0, 0, 50, 50, 429},
		{"nothing", "/", 0, 5, 5, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks := &keyServer{keys: map[string]int{}}
			srv := httptest.NewServer(ks)
			defer srv.Close()
			f := flood{addr: srv.Listener.Addr().String(), path: tt.path, prefix: "k-", cycle: tt.cycle, conns: 8}
			res, err := f.run(tt.from, tt.to)
			if err != nil {
				t.Fatal(err)
			}
			if n := res.requests(); n != tt.to-tt.from || res.Errors != 0 {
				t.Fatalf("%d requests answered, %d errors; want %d and 0", n, res.Errors, tt.to-tt.from)
			}
			if tt.wantStatus != 0 && res.Statuses[tt.wantStatus] != tt.to-tt.from {
				t.Fatalf("statuses %v, want all %d", res.Statuses, tt.wantStatus)
			}
			if len(ks.keys) != tt.wantKeys {
				t.Fatalf("server saw %d distinct keys, want %d", len(ks.keys), tt.wantKeys)
			}
			if tt.wantKeys > 0 && tt.cycle == 0 {
				if ks.keys["k-"+strconv.Itoa(tt.from)] != 1 || ks.keys["k-"+strconv.Itoa(tt.to-1)] != 1 {
					t.Fatalf("first or last key missing: %d, %d", ks.keys["k-"+strconv.Itoa(tt.from)], ks.keys["k-"+strconv.Itoa(tt.to-1)])
				}
			}
		})
	}
}

// TestFloodStopsOnErrors: a target that closes every connection ends the
// flood after maxErrors errors instead of trying every key.
func TestFloodStopsOnErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	f := flood{addr: l.Addr().String(), path: "/", prefix: "k-", conns: 4}
	res, err := f.run(0, 1_000_000)
	if err == nil {
		t.Fatal("run() succeeded against a target that closes every connection")
	}
	if res.Errors < maxErrors || res.Errors > maxErrors+f.conns {
		t.Fatalf("%d errors, want about %d", res.Errors, maxErrors)
	}
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"image/png"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/pngfont"
)

func TestParseStatTicks(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    int64
		wantErr bool
	}{
		{"plain", "42 (envoy) S 1 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 5 0 100 0 0", 281, false},
		{"spaces and parens in the name", "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0", 7, false},
		{"no name", "7 a R 1", 0, true},
		{"short", "7 (a) R 1 7 7", 0, true},
		{"not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatTicks([]byte(tt.line))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("parseStatTicks() = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestCPUTicksSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if _, err := cpuTicks(os.Getpid()); err != nil {
		t.Fatalf("cpuTicks(self): %v", err)
	}
}

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		wantStatus int
		wantKeep   bool
		wantErr    bool
		rest       string
	}{
		{"keep-alive", "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\nNEXT", 200, true, false, "NEXT"},
		{"case and spaces", "HTTP/1.1 429 Too Many Requests\r\nContent-Length:  5 \r\nX: y\r\n\r\nabcdeNEXT", 429, true, false, "NEXT"},
		{"no body", "HTTP/1.1 204 No Content\r\n\r\nNEXT", 204, true, false, "NEXT"},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n", 200, false, false, ""},
		{"http/1.0", "HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", 200, false, false, ""},
		{"chunked", "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", 0, false, true, ""},
		{"garbage", "SSH-2.0\r\n\r\n", 0, false, true, ""},
		{"bad length", "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", 0, false, true, ""},
		{"truncated body", "HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok", 0, false, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tt.in))
			status, keep, err := readResponse(r)
			if (err != nil) != tt.wantErr || status != tt.wantStatus || keep != tt.wantKeep {
				t.Fatalf("readResponse() = %d, %v, %v; want %d, %v, error %v", status, keep, err, tt.wantStatus, tt.wantKeep, tt.wantErr)
			}
			if err == nil {
				rest := new(bytes.Buffer)
				rest.ReadFrom(r)
				if rest.String() != tt.rest {
					t.Errorf("left %q unread, want %q", rest, tt.rest)
				}
			}
		})
	}
}

func TestReadRequestHead(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\nPOST /x HTTP/1.1\r\ncontent-length: 4\r\n\r\nbody"))
	if n, err := readRequestHead(r); n != 0 || err != nil {
		t.Fatalf("first head: %d, %v; want 0, nil", n, err)
	}
	if n, err := readRequestHead(r); n != 4 || err != nil {
		t.Fatalf("second head: %d, %v; want 4, nil", n, err)
	}
}

// TestLoadAgainstUpstream drives the generator against the upstream
// directly, as it drives Envoy: every request answered with 200, none lost.
func TestLoadAgainstUpstream(t *testing.T) {
	u, err := startUpstream()
	if err != nil {
		t.Fatal(err)
	}
	defer u.close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(u.port()))
	reqs := keyRequests(3)
	cs := make([]counts, 4)
	closedLoop(addr, reqs, 4, time.Now().Add(200*time.Millisecond), cs, func() { time.Sleep(200 * time.Millisecond) })
	got := sum(cs)
	if got.ok == 0 || got.errors != 0 || got.other != 0 || got.rejected != 0 {
		t.Fatalf("closed loop: %+v, want only 200s", got)
	}
	if got.ok != u.requests.Load() {
		t.Errorf("closed loop: %d answers, upstream saw %d requests", got.ok, u.requests.Load())
	}

	cs = make([]counts, 2)
	start := time.Now()
	lats := openLoop(addr, reqs, 2, 200, start, start.Add(50*time.Millisecond), start.Add(250*time.Millisecond), cs)
	n := 0
	for _, l := range lats {
		n += len(l.ns)
	}
	if n < 30 || n > 50 {
		t.Errorf("open loop at 200/s for 200 ms kept %d samples, want about 40", n)
	}
	if got := sum(cs); got.errors != 0 || got.ok < int64(n) {
		t.Errorf("open loop: %+v for %d samples", got, n)
	}
}

func TestLoadStopsWhenServerDies(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every dial fails
	cs := make([]counts, 2)
	start := time.Now()
	closedLoop(addr, keyRequests(1), 2, time.Now().Add(100*time.Millisecond), cs, func() { time.Sleep(100 * time.Millisecond) })
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("closed loop took %v against a dead address", el)
	}
	if got := sum(cs); got.errors == 0 || got.total() != 0 {
		t.Errorf("dead address: %+v, want only errors", got)
	}
}

func TestPercentile(t *testing.T) {
	s := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		q    float64
		want float64
	}{{0.5, 5}, {0.9, 9}, {0.99, 10}, {0, 1}, {1, 10}}
	for _, tt := range tests {
		if got := percentile(s, tt.q); got != tt.want {
			t.Errorf("percentile(1..10, %v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile(nil) = %v", got)
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
	a := coreTimes{busy: 100, total: 1000}
	b := coreTimes{busy: 180, total: 1100} // 100 ticks = 1 s, 80 ticks busy
	if got := otherLoad(a, b, 0.5); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("otherLoad = %v, want 0.3", got)
	}
	if got := otherLoad(a, b, 2); got != 0 {
		t.Errorf("otherLoad with more Envoy CPU than busy time = %v, want 0", got)
	}
}

// TestTemplates renders every configuration's bootstrap, which proves the
// native filter found its place in PlainConfigYAML and every template key
// is supplied.
func TestTemplates(t *testing.T) {
	if err := checkTemplates(); err != nil {
		t.Fatal(err)
	}
	for _, s := range setups {
		o := s.options(1001, 1002, 100, limit{Rate: 50, Burst: 50})
		out, err := envoytest.RenderConfig(o.Config, envoytest.TemplateData{
			ListenerPort: 1, AdminPort: 2, UpstreamPort: o.UpstreamPort, ServicePort: o.ServicePort,
			PluginWasm: "/p.wasm", PluginConfig: o.PluginConfig, FailurePolicy: o.FailurePolicy, Data: o.Data,
		})
		if err != nil {
			t.Fatalf("(%d) %s: %v", s.ID, s.Name, err)
		}
		wantFilter := map[kind]string{kindNone: "", kindNative: "local_ratelimit", kindPlugin: "envoy.filters.http.wasm", kindCluster: "limit_service"}[s.Kind]
		if wantFilter != "" && !strings.Contains(out, wantFilter) {
			t.Errorf("(%d) %s: bootstrap lacks %q", s.ID, s.Name, wantFilter)
		}
		if s.Kind == kindNone && (strings.Contains(out, "wasm") || strings.Contains(out, "local_ratelimit")) {
			t.Errorf("(1) has a filter:\n%s", out)
		}
	}
}

// TestChartPNG renders a chart with every label the report uses and checks
// that the font has a glyph for each of their characters.
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
	for _, s := range append(cats, ch.Title, ch.YLabel, "0123456789.KM-%~×µ") {
		for _, r := range s {
			if r == '\n' {
				continue
			}
			if !pngfont.Has(r) {
				t.Errorf("no glyph for %q in %q", r, s)
			}
		}
	}
	b, err := ch.png()
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds().Dx() < 500 {
		t.Errorf("image is %v", img.Bounds())
	}
	ch.Log = true
	if _, err := ch.png(); err != nil {
		t.Fatalf("log scale: %v", err)
	}
}

func TestNiceStep(t *testing.T) {
	tests := []struct {
		span float64
		n    int
		want float64
	}{{100, 5, 20}, {9000, 5, 2000}, {1, 4, 0.25}, {37, 5, 10}}
	for _, tt := range tests {
		if got := niceStep(tt.span, tt.n); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("niceStep(%v, %d) = %v, want %v", tt.span, tt.n, got, tt.want)
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

func TestHarnessTB(t *testing.T) {
	tb := &harnessTB{}
	if err := tb.call(func() {}); err != nil {
		t.Fatalf("call(ok) = %v", err)
	}
	if err := tb.call(func() { tb.Fatalf("boom %d", 1) }); err == nil || !strings.Contains(err.Error(), "boom 1") {
		t.Fatalf("call(Fatalf) = %v, want boom 1", err)
	}
	if tb.Failed() {
		t.Errorf("failure leaked past call")
	}
	if err := tb.call(func() { tb.Errorf("soft") }); err == nil {
		t.Fatalf("call(Errorf) = nil, want an error")
	}
	var order []int
	tb.Cleanup(func() { order = append(order, 1) })
	tb.Cleanup(func() { order = append(order, 2) })
	dir := tb.TempDir()
	tb.close()
	if len(order) != 2 || order[0] != 2 || order[1] != 1 {
		t.Errorf("cleanups ran %v, want [2 1]", order)
	}
	if fileExists(dir) {
		t.Errorf("temp dir %s left behind", dir)
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
	p, _ = parseParams([]string{"-only", "11"})
	if _, err := p.selected(); err == nil {
		t.Errorf("-only 11: no error")
	}
	p, _ = parseParams([]string{"-diag=false"})
	if sel, _ := p.selected(); len(sel) != 6 {
		t.Errorf("-diag=false selection has %d configurations, want 6", len(sel))
	}
	p, _ = parseParams([]string{"-smoke"})
	if sel, _ := p.selected(); len(sel) != 6 {
		t.Errorf("-smoke selection has %d configurations, want 6", len(sel))
	}
	p, _ = parseParams(nil)
	if sel, _ := p.selected(); len(sel) != 10 {
		t.Errorf("default selection has %d configurations, want 10", len(sel))
	}
}

// TestNullFilterWasm loads the no-op module in wazero and runs a stream's
// callbacks: it must be a valid module whose callbacks continue.
func TestNullFilterWasm(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, nullFilterWasm(nil, 0))
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	calls := []struct {
		name string
		args []uint64
		want []uint64
	}{
		{"_initialize", nil, nil},
		{"proxy_abi_version_0_2_0", nil, nil},
		{"proxy_on_context_create", []uint64{1, 0}, nil},
		{"proxy_on_vm_start", []uint64{1, 0}, []uint64{1}},
		{"proxy_on_configure", []uint64{1, 10}, []uint64{1}},
		{"proxy_on_context_create", []uint64{2, 1}, nil},
		{"proxy_on_request_headers", []uint64{2, 5, 1}, []uint64{0}},
		{"proxy_on_response_headers", []uint64{2, 3, 0}, []uint64{0}},
		{"proxy_on_response_body", []uint64{2, 3, 1}, []uint64{0}},
		{"proxy_on_log", []uint64{2}, nil},
		{"proxy_on_done", []uint64{2}, []uint64{1}},
		{"proxy_on_delete", []uint64{2}, nil},
		{"proxy_on_memory_allocate", []uint64{100}, []uint64{1024}},
		{"proxy_on_http_call_response", []uint64{1, 1, 0, 0, 0}, nil},
	}
	for _, c := range calls {
		f := mod.ExportedFunction(c.name)
		if f == nil {
			t.Fatalf("no export %s", c.name)
		}
		got, err := f.Call(ctx, c.args...)
		if err != nil || len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
			t.Errorf("%s(%v) = %v, %v; want %v", c.name, c.args, got, err, c.want)
		}
	}
	if mod.Memory() == nil {
		t.Errorf("no memory export")
	}
}

func TestLEB128(t *testing.T) {
	tests := []struct {
		v          int32
		uleb, sleb []byte
	}{
		{0, []byte{0}, []byte{0}},
		{1, []byte{1}, []byte{1}},
		{63, []byte{63}, []byte{63}},
		{64, []byte{64}, []byte{0xc0, 0}},
		{127, []byte{127}, []byte{0xff, 0}},
		{128, []byte{0x80, 1}, []byte{0x80, 1}},
		{1024, []byte{0x80, 8}, []byte{0x80, 8}},
		{-1, nil, []byte{0x7f}},
	}
	for _, tt := range tests {
		if tt.uleb != nil {
			if got := uleb(uint32(tt.v)); !bytes.Equal(got, tt.uleb) {
				t.Errorf("uleb(%d) = %x, want %x", tt.v, got, tt.uleb)
			}
		}
		if got := sleb(tt.v); !bytes.Equal(got, tt.sleb) {
			t.Errorf("sleb(%d) = %x, want %x", tt.v, got, tt.sleb)
		}
	}
}

func TestWasmExports(t *testing.T) {
	all, err := wasmExports(nullFilterWasm(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !all["proxy_on_log"] || !all["proxy_on_request_headers"] || all["memory"] {
		t.Fatalf("wasmExports(full module) = %v", all)
	}
	some := map[string]bool{"proxy_on_request_headers": true, "proxy_on_context_create": true, "proxy_abi_version_0_2_0": true}
	got, err := wasmExports(nullFilterWasm(some, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(some) {
		t.Errorf("module built like %v exports %v", some, got)
	}
	for _, bad := range [][]byte{nil, []byte("\x00asm\x01\x00\x00\x00\x07\x05\x01"), []byte("ELF")} {
		if _, err := wasmExports(bad); err == nil {
			t.Errorf("wasmExports(%q): no error", bad)
		}
	}
	if path := os.Getenv("PLUGIN_WASM"); path != "" {
		if b, err := os.ReadFile(path); err == nil {
			ex, err := wasmExports(b)
			if err != nil || !ex["proxy_on_request_headers"] || !ex["proxy_on_memory_allocate"] {
				t.Errorf("wasmExports(%s) = %v, %v", path, ex, err)
			}
		}
	}
}

// TestNullFilterWasmHostCalls runs the module that calls the host: its
// request-headers callback must call clock_time_get the given number of
// times.
func TestNullFilterWasmHostCalls(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	calls := 0
	_, err := rt.NewHostModuleBuilder("wasi_snapshot_preview1").NewFunctionBuilder().
		WithFunc(func(_ context.Context, id uint32, precision uint64, ptr uint32) uint32 { calls++; return 0 }).
		Export("clock_time_get").Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mod, err := rt.Instantiate(ctx, nullFilterWasm(nil, 7))
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	got, err := mod.ExportedFunction("proxy_on_request_headers").Call(ctx, 2, 5, 1)
	if err != nil || len(got) != 1 || got[0] != 0 || calls != 7 {
		t.Fatalf("proxy_on_request_headers = %v, %v with %d host calls; want 0 and 7 calls", got, err, calls)
	}
	if mod.ExportedFunction("proxy_on_context_create") == nil {
		t.Errorf("export indices are off by the import")
	}
}

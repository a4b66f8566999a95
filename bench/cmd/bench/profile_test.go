// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/wasmhost"
)

// The request-path profile: BenchmarkPluginRequest runs the compiled plugin
// in the wazero host of internal/testing/wasmhost (not V8: absolute times differ
// from Envoy's, counts do not) and counts, per request,
//
//   - host calls by name (env.proxy_* and WASI), with the time spent in
//     them, and the guest callbacks (proxy_on_*) with their time;
//   - the guest's heap allocations: calls of runtime.mallocgc and the bytes
//     they asked for, which needs the function names that the Makefile's
//     stripped build drops, so the profile builds its own unstripped copy
//     (build/plugin-profile.wasm) the same way otherwise;
//   - the guest's garbage collections, from the plugin's own gauge
//     tokenbucket.memory.gc_cycles (updated by proxy_on_tick).
//
//	go test -run XXX -bench PluginRequest -benchtime 20000x ./cmd/bench/
//
// Time measured by the listener includes the listener's own cost (two clock
// reads per instrumented call): read the times as shares, not as Envoy's.

// profiler counts instrumented calls. It implements wazero's experimental
// FunctionListenerFactory; wasmhost compiles the module once per process
// with the context NewHost gets, so one profiler serves every benchmark of
// the process and is reset between them. With every set it only counts the
// calls of every guest function, by name (guest).
type profiler struct {
	mu      sync.Mutex
	every   bool
	calls   map[string]*callStat
	guest   map[string]int64
	mallocs int64
	bytes   int64
	sites   map[string]*site // allocations by the first caller outside the runtime
	stack   []time.Time
}

// site is one allocating function: how many allocations, how many bytes.
type site struct{ n, bytes int64 }

type callStat struct {
	n    int64
	time time.Duration
	kind string // "host", "callback" or "runtime"
}

func newProfiler(every bool) *profiler {
	return &profiler{every: every, calls: map[string]*callStat{}, guest: map[string]int64{}, sites: map[string]*site{}}
}

func (p *profiler) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = map[string]*callStat{}
	p.guest = map[string]int64{}
	p.sites = map[string]*site{}
	p.mallocs, p.bytes = 0, 0
	p.stack = p.stack[:0]
}

// NewFunctionListener implements experimental.FunctionListenerFactory: it
// instruments the host module's functions, the guest's proxy_* exports and
// runtime.mallocgc, and nothing else; with every, each guest function.
func (p *profiler) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	host := def.ModuleName() == "env" || def.ModuleName() == "wasi_snapshot_preview1"
	switch {
	case p.every && host:
		return nil
	case p.every:
		return &listener{p: p, name: def.Name(), kind: "guest"}
	case host:
		return &listener{p: p, name: def.ModuleName() + "." + def.Name(), kind: "host"}
	case def.Name() == "runtime.mallocgc":
		return &listener{p: p, name: def.Name(), kind: "malloc"}
	}
	for _, e := range def.ExportNames() {
		if strings.HasPrefix(e, "proxy_on_") {
			return &listener{p: p, name: e, kind: "callback"}
		}
	}
	return nil
}

type listener struct {
	p    *profiler
	name string
	kind string
}

func (l *listener) Before(_ context.Context, mod api.Module, _ api.FunctionDefinition, _ []uint64, stack experimental.StackIterator) {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.kind == "guest" {
		p.guest[l.name]++
		return
	}
	if l.kind == "malloc" {
		size := mallocSize(mod)
		p.mallocs++
		p.bytes += int64(size)
		caller := allocSite(stack)
		st := p.sites[caller]
		if st == nil {
			st = &site{}
			p.sites[caller] = st
		}
		st.n++
		st.bytes += int64(size)
		return
	}
	p.stack = append(p.stack, time.Now())
}

// mallocSize reads the size argument of runtime.mallocgc. Go's wasm code
// passes arguments on its own stack in linear memory, not as Wasm
// parameters: on entry the stack pointer (global 0) points at the return
// address and the first argument follows it.
func mallocSize(mod api.Module) uint64 {
	im, ok := mod.(experimental.InternalModule)
	if !ok || im.NumGlobal() == 0 {
		return 0
	}
	sp := uint32(im.Global(0).Get())
	size, ok := mod.Memory().ReadUint64Le(sp + 8)
	if !ok {
		return 0
	}
	return size
}

// allocSite names the first function on the stack outside the Go runtime
// (and the standard library's internals) that led to an allocation.
func allocSite(stack experimental.StackIterator) string {
	first := ""
	for stack.Next() {
		name := stack.Function().Definition().Name()
		if first == "" && name != "runtime.mallocgc" {
			first = name
		}
		if strings.HasPrefix(name, "runtime.") || strings.HasPrefix(name, "internal/") {
			continue
		}
		return name
	}
	return first
}

func (l *listener) After(context.Context, api.Module, api.FunctionDefinition, []uint64) { l.end() }
func (l *listener) Abort(context.Context, api.Module, api.FunctionDefinition, error)    { l.end() }

func (l *listener) end() {
	if l.kind == "malloc" || l.kind == "guest" {
		return
	}
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.stack) == 0 {
		return
	}
	t0 := p.stack[len(p.stack)-1]
	p.stack = p.stack[:len(p.stack)-1]
	s := p.calls[l.name]
	if s == nil {
		s = &callStat{kind: l.kind}
		p.calls[l.name] = s
	}
	s.n++
	s.time += time.Since(t0)
}

var prof = newProfiler(false)

// demangle turns the Wasm name section's spelling of a Go function name
// back into a readable one: "github.com_ratelimit_wasm_tokenbucket_plugin.__httpContext_.reject"
// becomes "plugin.(*httpContext).reject".
func demangle(name string) string {
	for _, p := range []struct{ from, to string }{
		{"github.com_ratelimit_wasm_tokenbucket_", ""},
		{"github.com_tetratelabs_proxy_wasm_go_sdk_proxywasm_internal.", "sdk/internal."},
		{"github.com_tetratelabs_proxy_wasm_go_sdk_proxywasm.", "sdk."},
		{"github.com_tidwall_gjson.", "gjson."},
	} {
		if rest, ok := strings.CutPrefix(name, p.from); ok {
			name = p.to + rest
			break
		}
	}
	if pkg, rest, ok := strings.Cut(name, ".__"); ok {
		if typ, method, ok := strings.Cut(rest, "_."); ok {
			name = pkg + ".(*" + typ + ")." + method
		}
	}
	return name
}

// profileWasm builds the plugin without -s -w (so runtime.mallocgc keeps its
// name) into build/plugin-profile.wasm, once per process.
var profileBuild struct {
	once sync.Once
	wasm []byte
	err  error
}

func profileWasm(tb testing.TB) []byte {
	tb.Helper()
	profileBuild.once.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", "..", ".."))
		if err != nil {
			profileBuild.err = err
			return
		}
		profileBuild.wasm, profileBuild.err = wasmhost.BuildModule(root, ".", "plugin-profile.wasm")
	})
	if profileBuild.err != nil {
		ci.Skip(tb, "building the profile plugin: %v", profileBuild.err)
	}
	return profileBuild.wasm
}

// profileCase is one request path to profile.
type profileCase struct {
	name   string
	config string
	// answer, for cluster rules, is the limit service's reply to a callout.
	answer string
}

var profileCases = []profileCase{
	{"allow", pluginRule(unlimited), ""},
	{"reject", pluginRule(limit{Rate: 1, Burst: 1}), ""},
	{"cluster", clusterRule(unlimited), `{"allowed":true,"buckets":[{"allowed":true,"remaining":999,"retry_after_ms":0,"reset_ms":0}]}`},
	// The rule never applies: what the plugin does per request when it
	// decides nothing (configuration 7 of cmd/bench).
	{"idle", idleRule(unlimited), ""},
}

// BenchmarkPluginRequestTimed runs the same requests through the plugin as
// the Makefile builds it ($PLUGIN_WASM, stripped), without any listener: its
// ns/op is wazero's time per request, host emulation included.
func BenchmarkPluginRequestTimed(b *testing.B) {
	path := os.Getenv("PLUGIN_WASM")
	if path == "" {
		path = filepath.Join("..", "..", "..", "build", "plugin.wasm")
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		b.Skipf("no plugin: %v (run make build)", err)
	}
	for _, pc := range profileCases {
		b.Run(pc.name, func(b *testing.B) {
			runProfileCase(context.Background(), b, wasm, pc, false)
		})
	}
}

// BenchmarkPluginRequest runs one request per iteration through the plugin
// (request headers, upstream or local reply, response headers, log, done,
// delete), cycling through 100 x-api-key values as cmd/bench does, and
// reports the counts above per request.
func BenchmarkPluginRequest(b *testing.B) {
	wasm := profileWasm(b)
	b.Setenv(wasmhost.CacheDirEnv, "") // compile with the listeners, never from a cache without them
	ctx := experimental.WithFunctionListenerFactory(context.Background(), prof)
	for _, pc := range profileCases {
		b.Run(pc.name, func(b *testing.B) {
			runProfileCase(ctx, b, wasm, pc, true)
		})
	}
}

// runProfileCase runs pc's requests through a new host and VM, counting
// with prof when counted is set.
func runProfileCase(ctx context.Context, b *testing.B, wasm []byte, pc profileCase, counted bool) {
	var n int
	gcs := runProfileCaseHook(ctx, b, wasm, pc, prof.reset, &n)
	if counted {
		reportProfile(b, n, lastStatuses, gcs)
	}
}

// lastStatuses are the statuses of the last runProfileCaseHook's measured
// requests.
var lastStatuses map[int]int

// runProfileCaseHook runs pc's requests through a new host and VM: 200
// unmeasured ones, then reset, then b.N measured ones (their number in *n).
// It returns the guest's garbage collections during the measured ones.
func runProfileCaseHook(ctx context.Context, b *testing.B, wasm []byte, pc profileCase, reset func(), count *int) int64 {
	h, err := wasmhost.NewHost(ctx, wasm)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	vm, err := h.NewVM([]byte(pc.config), "tokenbucket")
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]wasmhost.Request, 100)
	for i := range reqs {
		reqs[i] = wasmhost.Request{Headers: wasmhost.Headers{
			{":method", "GET"}, {":path", "/bench"}, {":authority", "bench"}, {":scheme", "http"},
			{"x-api-key", "k" + strconv.Itoa(i)},
		}}
	}
	statuses := map[int]int{}
	do := func(i int) {
		h.Advance(time.Millisecond) // 1000 req/s of guest time
		resp, err := vm.HTTP(reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		for resp.Paused && len(resp.Callouts) > 0 {
			if resp, err = vm.AnswerCallout(resp.Callouts[0].ID, wasmhost.Headers{{":status", "200"}}, []byte(pc.answer)); err != nil {
				b.Fatal(err)
			}
		}
		statuses[resp.Status]++
	}
	for i := range 200 { // warm: buckets created, slices grown
		do(i)
	}
	if err := vm.Tick(); err != nil {
		b.Fatal(err)
	}
	gc0, _ := h.Metric("tokenbucket.memory.gc_cycles")
	reset()
	clear(statuses)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		do(n)
		n++
	}
	b.StopTimer()
	if err := vm.Tick(); err != nil {
		b.Fatal(err)
	}
	gc1, _ := h.Metric("tokenbucket.memory.gc_cycles")
	*count = n
	lastStatuses = statuses
	return gc1 - gc0
}

// reportProfile publishes the per-request counts as benchmark metrics and logs a
// table of them.
func reportProfile(b *testing.B, n int, statuses map[int]int, gcs int64) {
	prof.mu.Lock()
	defer prof.mu.Unlock()
	if n == 0 {
		return
	}
	per := func(x int64) float64 { return float64(x) / float64(n) }
	var hostCalls int64
	var hostTime, cbTime time.Duration
	type row struct {
		name string
		s    *callStat
	}
	var rows []row
	for name, s := range prof.calls {
		rows = append(rows, row{name, s})
		switch s.kind {
		case "host":
			hostCalls += s.n
			hostTime += s.time
		case "callback":
			cbTime += s.time
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].s.kind != rows[j].s.kind {
			return rows[i].s.kind > rows[j].s.kind
		}
		return rows[i].s.n > rows[j].s.n
	})
	b.ReportMetric(per(hostCalls), "hostcalls/req")
	b.ReportMetric(per(prof.mallocs), "guest-mallocs/req")
	b.ReportMetric(per(prof.bytes), "guest-B/req")
	b.ReportMetric(float64(gcs)/float64(n)*1000, "guest-GCs/1000req")
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d requests, statuses %v; guest GCs %d\n", n, statuses, gcs)
	fmt.Fprintf(&sb, "%-44s %9s %12s\n", "call", "per req", "µs per req")
	for _, r := range rows {
		fmt.Fprintf(&sb, "%-44s %9.2f %12.2f  %s\n", r.name, per(r.s.n), r.s.time.Seconds()*1e6/float64(n), r.s.kind)
	}
	fmt.Fprintf(&sb, "host calls: %.2f per request, %.2f µs of %.2f µs in callbacks (%.0f%%)\n",
		per(hostCalls), hostTime.Seconds()*1e6/float64(n), cbTime.Seconds()*1e6/float64(n), 100*hostTime.Seconds()/max(cbTime.Seconds(), 1e-12))
	fmt.Fprintf(&sb, "guest heap allocations: %.2f per request, %.0f bytes per request, by first caller outside the runtime:\n", per(prof.mallocs), per(prof.bytes))
	type srow struct {
		name string
		s    *site
	}
	var srows []srow
	for name, s := range prof.sites {
		srows = append(srows, srow{name, s})
	}
	sort.Slice(srows, func(i, j int) bool { return srows[i].s.n > srows[j].s.n })
	for _, r := range srows {
		if per(r.s.n) < 0.01 {
			continue // the occasional allocation of a tick or a GC
		}
		fmt.Fprintf(&sb, "  %6.2f allocs %7.0f B  %s\n", per(r.s.n), per(r.s.bytes), demangle(r.name))
	}
	b.Log("\n" + sb.String())
}

// withCustomSection returns wasm with an extra custom section, which
// changes the module's hash: wasmhost compiles a module once per process
// and hash, so this gives the call counter a compilation of its own.
func withCustomSection(wasm []byte, name string) []byte {
	payload := append(append([]byte{byte(len(name))}, name...), 0) // wazero wants content
	out := append([]byte(nil), wasm...)
	out = append(out, 0) // custom section id
	for n := len(payload); ; n >>= 7 {
		if n < 0x80 {
			out = append(out, byte(n))
			break
		}
		out = append(out, byte(n&0x7f|0x80))
	}
	return append(out, payload...)
}

// BenchmarkPluginRequestCalls counts the guest's Go function calls per
// request, grouped by package (the Go runtime against the SDK and the
// plugin), and lists the most called functions. Every call goes through a
// listener, so its ns/op means nothing; use -benchtime 2000x.
func BenchmarkPluginRequestCalls(b *testing.B) {
	wasm := withCustomSection(profileWasm(b), "bench-calls")
	b.Setenv(wasmhost.CacheDirEnv, "")
	cc := newProfiler(true)
	ctx := experimental.WithFunctionListenerFactory(context.Background(), cc)
	for _, pc := range profileCases {
		if pc.answer != "" {
			continue // the cluster path: counted by BenchmarkPluginRequest
		}
		b.Run(pc.name, func(b *testing.B) {
			n := 0
			runProfileCaseHook(ctx, b, wasm, pc, cc.reset, &n)
			reportCalls(b, cc, n)
		})
	}
}

func reportCalls(b *testing.B, cc *profiler, n int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if n == 0 {
		return
	}
	groups := map[string]int64{}
	var total int64
	type row struct {
		name string
		n    int64
	}
	var rows []row
	for name, k := range cc.guest {
		total += k
		rows = append(rows, row{demangle(name), k})
		g := "other"
		for _, p := range []struct{ prefix, group string }{
			{"runtime.", "Go runtime"}, {"internal_", "Go runtime"}, {"sync", "Go runtime"},
			{"github.com_tetratelabs_proxy_wasm_go_sdk", "proxy-wasm SDK"},
			{"github.com_ratelimit_wasm_tokenbucket_plugin", "plugin"},
			{"github.com_ratelimit_wasm_tokenbucket_store", "store"},
			{"github.com_ratelimit_wasm_tokenbucket_bucket", "bucket"},
			{"strconv", "strconv"}, {"time.", "time"}, {"errors.", "errors"},
		} {
			if strings.HasPrefix(name, p.prefix) {
				g = p.group
				break
			}
		}
		groups[g] += k
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].n > rows[j].n })
	per := func(x int64) float64 { return float64(x) / float64(n) }
	b.ReportMetric(per(total), "guest-calls/req")
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d requests: %.0f guest function calls per request\n", n, per(total))
	var gs []string
	for g := range groups {
		gs = append(gs, g)
	}
	sort.Slice(gs, func(i, j int) bool { return groups[gs[i]] > groups[gs[j]] })
	for _, g := range gs {
		fmt.Fprintf(&sb, "  %-16s %7.1f calls/req (%.0f%%)\n", g, per(groups[g]), 100*float64(groups[g])/float64(total))
	}
	sb.WriteString("most called:\n")
	for i, r := range rows {
		if i == 25 {
			break
		}
		fmt.Fprintf(&sb, "  %7.1f  %s\n", per(r.n), r.name)
	}
	b.Log("\n" + sb.String())
}

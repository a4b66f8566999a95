// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The ordinary-load regime (issue 43): most Envoys run well below
// saturation, and there a filter's cost per request is not what a busy
// worker shows, since work a busy worker amortises (a runtime waking up,
// a timer, a thread handing over) falls on every few requests instead.
// Envoy is pinned to one CPU with one worker; the load is an open loop at
// a fixed rate on -open-conns keep-alive connections (16 unless set), at
// -load (a half unless set) of no filter's saturated throughput on -conns
// connections, measured first. Each of -rounds rounds (3 unless set) runs
// every configuration once at that rate and once saturated (a closed loop
// on -conns), the order reversed every other round; ratios are taken
// within each round, then summarised (median, min–max).
//
// local_ratelimit writes no RateLimit headers unless asked, and the module
// and the plugin write them by default, so the regime runs both with and
// without them: like is compared with like.

// The configurations only this regime runs.
var (
	nativeHeadersSetup = setup{18, "native-headers", "native local_ratelimit, RateLimit headers", "native\nheaders", kindNative, false, nil, false, 0}
	moduleNoHeaders    = setup{19, "module-noheaders", "native module, no response headers", "module\nno hdrs", kindModule, false, noHeadersRule, false, 0}
	// moduleOther is configuration 12 run by another build of the module
	// (-compare-module): a change measured against -module in one run.
	moduleOther = setup{20, "module-other", "native module (-compare-module), local rule", "module\nother", kindModule, false, nil, false, 0}
	// moduleQuota and moduleSlots are the module with a calendar quota and
	// with a concurrency limit on the same key instead of configuration
	// 12's token bucket, never refusing: what a budget rule and a
	// concurrency rule cost a request against a token-bucket rule (issues
	// 41 and 42), compared with 12 within each round.
	moduleQuota = setup{21, "module-quota", "native module, quota rule (a day in America/New_York)", "module\nquota", kindModule, false, quotaRule, false, 0}
	moduleSlots = setup{22, "module-concurrency", "native module, concurrency rule", "module\nslots", kindModule, false, concurrencyRule, false, 0}
)

// quotaRule is the standard rule as a calendar quota of l.Burst a day.
func quotaRule(l limit) string {
	return `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"quota",` +
		`"algorithm_config":{"limit":` + strconv.FormatInt(l.Burst, 10) + `,"period":"day","time_zone":"America/New_York"}}]}`
}

// concurrencyRule is the standard key with at most l.Burst requests in
// flight (the benchmark never has that many).
func concurrencyRule(l limit) string {
	n := min(l.Burst, 1000000)
	return `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"concurrency",` +
		`"algorithm_config":{"max_in_flight":` + strconv.FormatInt(n, 10) + `}}]}`
}

// ordinarySelection is what -ordinary runs: no filter, local_ratelimit
// without and with headers, the module with and without, the plugin, and
// the other build of the module when given.
func (p *params) ordinarySelection() []setup {
	sel := []setup{setups[0], setups[1], nativeHeadersSetup, setups[11], moduleNoHeaders, setups[2], moduleQuota, moduleSlots}
	if p.compareModule != "" {
		sel = append(sel, moduleOther)
	}
	if p.only == "" {
		return sel
	}
	want := map[string]bool{}
	for _, f := range strings.Split(p.only, ",") {
		want[strings.TrimSpace(f)] = true
	}
	var out []setup
	for _, s := range sel {
		if want[fmt.Sprint(s.ID)] || s.ID == 1 {
			out = append(out, s)
		}
	}
	return out
}

// ordinaryRef is the local_ratelimit a configuration is compared with:
// with headers for the builds that write them, without for the others.
func ordinaryRef(s setup) int {
	switch s.ID {
	case 12, 3, moduleOther.ID, nativeHeadersSetup.ID:
		return nativeHeadersSetup.ID
	case moduleQuota.ID, moduleSlots.ID:
		return 12
	}
	return 2
}

// ordinaryRun measures the ordinary-load regime and prints its table,
// which it also writes into -out as ordinary.md.
func (b *bench) ordinaryRun() error {
	p := b.p
	loadStart := loadAvg()
	none := b.target(1)
	if none == nil {
		return fmt.Errorf("bench: -ordinary needs (1) no filter")
	}
	cal, err := b.calibrationRun(none)
	if err != nil {
		return err
	}
	b.rate = p.load * cal.Throughput
	b.logf("no filter saturated on %d connections: %.0f req/s, %.1f µs/req; the fixed rate: %.0f req/s on %d connections", p.conns, cal.Throughput, cal.CPUPerReqUS, b.rate, p.openConns)
	for r := range p.rounds {
		for _, t := range roundOrder(b.targets, r) {
			pid, _ := t.envoy.PID()
			before := readThreads(pid)
			l, err := fixedRate(b.addr(t), b.probe(t), b.reqs, p.openConns, b.rate, p.warmup, p.latWindow)
			if err != nil {
				return fmt.Errorf("bench: round %d, (%d): %w", r+1, t.s.ID, err)
			}
			// The whole run's requests, warm-up included, as the switches are.
			if n := b.rate * (p.warmup + p.latWindow).Seconds(); n > 0 {
				t.switches = append(t.switches, float64(otherSwitches(before, readThreads(pid)))/n)
			}
			s, err := saturate(b.addr(t), b.probe(t), b.reqs, p.conns, p.warmup, p.satWindow)
			if err != nil {
				return fmt.Errorf("bench: round %d, (%d): %w", r+1, t.s.ID, err)
			}
			t.lat, t.sat = append(t.lat, l), append(t.sat, s)
			b.logf("round %d (%d) %-45s at %.0f/s: %5.1f µs/req, p50 %4.0f µs, %.2f switches/req off the worker | saturated %6.0f req/s: %5.1f µs/req | others on CPU %d: %.0f%%",
				r+1, t.s.ID, t.s.Label, l.Achieved, l.CPUPerReqUS, l.P50US, t.switches[len(t.switches)-1], s.Throughput, s.CPUPerReqUS, p.envoyCPU, 100*l.Core0Other)
		}
	}
	if err := b.verify(); err != nil {
		return err
	}
	m := &ordinaryData{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), LoadStart: loadStart, Pinning: b.info.Pinning,
		Rate: b.rate, Load: p.load, NoneSat: cal.Throughput, Conns: p.conns, OpenConns: p.openConns, Keys: p.keys, Rounds: p.rounds,
		LatWindow: p.latWindow.String(), SatWindow: p.satWindow.String(), CompareModule: p.compareModule, Module: p.module}
	for _, t := range b.targets {
		c := ordinaryConfig{ID: t.s.ID, Label: t.s.Label, None: t.s.Kind == kindNone, Ref: ordinaryRef(t.s), Switches: t.switches}
		for i := range t.lat {
			c.Lat = append(c.Lat, t.lat[i].CPUPerReqUS)
			if t.lat[i].Samples == 0 {
				c.Lat[i] = 0
			}
		}
		for i := range t.sat {
			c.Sat, c.Thr = append(c.Sat, t.sat[i].CPUPerReqUS), append(c.Thr, t.sat[i].Throughput)
			if t.sat[i].Requests == 0 {
				c.Sat[i] = 0
			}
		}
		m.Configs = append(m.Configs, c)
	}
	m.LoadEnd = loadAvg()
	if p.ordinaryPerf > 0 {
		att, err := b.ordinaryPerf()
		if err != nil {
			return err
		}
		m.Perf, m.LoadAfterPerf = att, loadAvg()
	}
	if err := writeJSON(filepath.Join(p.out, "ordinary.json"), m); err != nil {
		return err
	}
	return b.writeDoc("ordinary.md", m.doc())
}

// ordinaryData is what ordinaryRun measured, saved as ordinary.json, from
// which -render writes ordinary.md again.
type ordinaryData struct {
	Date          string           `json:"date"`
	LoadStart     string           `json:"loadavg_at_start"`
	LoadEnd       string           `json:"loadavg_at_end"`
	Pinning       string           `json:"pinning"`
	Rate          float64          `json:"fixed_rate_rps"`
	Load          float64          `json:"load_fraction"`
	NoneSat       float64          `json:"no_filter_saturated_rps"`
	Conns         int              `json:"conns"`
	OpenConns     int              `json:"open_conns"`
	Keys          int              `json:"keys"`
	Rounds        int              `json:"rounds"`
	LatWindow     string           `json:"lat_window"`
	SatWindow     string           `json:"sat_window"`
	Module        string           `json:"module"`
	CompareModule string           `json:"compare_module,omitempty"`
	Configs       []ordinaryConfig `json:"configs"`
	// Perf is the attribution's table (-ordinary-perf), as ordinaryPerf
	// wrote it, and LoadAfterPerf the load average after it.
	Perf          string `json:"perf_markdown,omitempty"`
	LoadAfterPerf string `json:"loadavg_after_perf,omitempty"`
}

// ordinaryConfig is one configuration's rounds: Envoy CPU per request at
// the fixed rate (Lat) and saturated (Sat), 0 where a run got no answer;
// saturated throughput; the context switches of Envoy's other threads per
// request. Ref is the configuration it is compared with like for like.
type ordinaryConfig struct {
	ID       int       `json:"id"`
	Label    string    `json:"label"`
	None     bool      `json:"no_filter,omitempty"`
	Ref      int       `json:"like_with_like"`
	Lat      []float64 `json:"envoy_cpu_us_per_req_fixed_rate"`
	Sat      []float64 `json:"envoy_cpu_us_per_req_saturated"`
	Thr      []float64 `json:"throughput_rps"`
	Switches []float64 `json:"other_threads_switches_per_req"`
}

// doc renders ordinary.md.
func (m *ordinaryData) doc() string {
	var md strings.Builder
	fmt.Fprintf(&md, "# The native module and the plugin at ordinary load\n\n")
	fmt.Fprintf(&md, "Generated by `make bench-ordinary` (`bench -ordinary`; `bench -render ordinary.json` rewrites it) on %s, load average %s at the start "+
		"and %s at the end; measured as the [benchmark page](README.md#method) says, but *ordinary* is an open loop at %.0f req/s (%.0f%% of no filter's saturated "+
		"%.0f) on %d connections; *saturated*, a closed loop on %d; %d rounds of %s. *Switches*: context switches of Envoy's threads but the worker per request "+
		"(the Go runtime waking). *Like with like*: ÷ the local_ratelimit writing the same RateLimit headers (the module and the plugin write them by default), "+
		"or for the module's quota and concurrency rules ÷ its token bucket.\n\n",
		m.Date, m.LoadStart, m.LoadEnd, m.Rate, 100*m.Load, m.NoneSat, m.OpenConns, m.Conns, m.Rounds, m.LatWindow)
	if m.CompareModule != "" {
		fmt.Fprintf(&md, "*%s* is `-compare-module %s`, against this tree's `-module %s`.\n\n", moduleOther.Label, m.CompareModule, m.Module)
	}
	fmt.Fprintln(&md, ordinaryTable(m.Configs))
	if m.Perf != "" {
		fmt.Fprintf(&md, "## Where the CPU goes at ordinary load\n\n%s\nLoad average after the profiles: %s.\n", m.Perf, m.LoadAfterPerf)
	}
	return md.String()
}

// ordinaryTable is the regime's table: for each configuration its CPU per
// request at the fixed rate and saturated, each ÷ no filter and ÷ the
// configuration it is like.
func ordinaryTable(cs []ordinaryConfig) string {
	by := map[int]*ordinaryConfig{}
	for i := range cs {
		by[cs[i].ID] = &cs[i]
	}
	val := func(xs []float64, i int) float64 {
		if i >= len(xs) || xs[i] == 0 {
			return math.NaN()
		}
		return xs[i]
	}
	col := func(xs, ref []float64) spread {
		var out []float64
		for i := range xs {
			x := val(xs, i)
			if ref != nil {
				x /= val(ref, i)
			}
			out = append(out, x)
		}
		return spreadOf(out)
	}
	var md strings.Builder
	fmt.Fprintln(&md, "| configuration | ordinary: Envoy CPU µs/req | ÷ no filter | like with like | switches | saturated: Envoy CPU µs/req | ÷ no filter | like with like | saturated req/s |")
	fmt.Fprintln(&md, "|---|---|---|---|---|---|---|---|---|")
	none := by[1]
	for _, c := range cs {
		ref := by[c.Ref]
		refName := "–"
		var lr, sr spread
		if ref != nil && ref.ID != c.ID && !c.None {
			lr, sr = col(c.Lat, ref.Lat), col(c.Sat, ref.Sat)
			switch ref.ID {
			case nativeHeadersSetup.ID:
				refName = "with headers: "
			case 12:
				refName = "÷ token bucket: "
			default:
				refName = "without headers: "
			}
		}
		var ln, sn spread
		if none != nil {
			ln, sn = col(c.Lat, none.Lat), col(c.Sat, none.Sat)
		}
		lrs, srs := f(lr, 2), f(sr, 2)
		if lr.N > 0 {
			lrs, srs = refName+lrs, refName+srs
		}
		fmt.Fprintf(&md, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Label,
			f(col(c.Lat, nil), 1), f(ln, 2), lrs, fm(spreadOf(c.Switches), 2), f(col(c.Sat, nil), 1), f(sn, 2), srs, fm(col(c.Thr, nil), 0))
	}
	return md.String()
}

// The attribution at ordinary load (-ordinary-perf): each configuration's
// Envoy profiled with perf at the fixed rate, every sample put in one
// class by its thread (the worker: the thread with the most samples; the
// others: Envoy's main thread, the module's Go runtime threads), its DSO
// and its symbol (the module must be built with its symbols: make
// bench-ordinary builds build/libtokenbucket-symbols.so for it). A class's
// µs per request is its share times the CPU per request of the same window.

// perfClasses are the classes, in the table's order.
var perfClasses = []string{
	"worker: Envoy",
	"worker: kernel, futex (threads waking and sleeping)",
	"worker: kernel, other (sockets, epoll)",
	"worker: libc, libstdc++ and other libraries",
	"worker: Go, entering and leaving Go from Envoy's thread (cgocallback, exitsyscall, entersyscall)",
	"worker: Go, scheduler, locks and wake-ups (wakep, startm, notewakeup, lock2)",
	"worker: Go, allocation and collection",
	"worker: Go, timers",
	"worker: Go, other runtime",
	"worker: the SDK (dynamic modules Go SDK)",
	"worker: ours (engine, filter) and the standard library",
	"worker: Wasm guest (V8's generated code)",
	"other threads: kernel",
	"other threads: Go runtime (sysmon, idle Ps, GC workers)",
	"other threads: the rest",
}

// perfClass is the class of one sample.
func perfClass(worker bool, dso, sym string) string {
	kernel := strings.HasPrefix(dso, "[kernel")
	if !worker {
		switch {
		case kernel:
			return perfClasses[12]
		case strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "runtime/") || strings.HasPrefix(sym, "gc") && !strings.Contains(dso, "envoy"):
			return perfClasses[13]
		}
		return perfClasses[14]
	}
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(sym, s) {
				return true
			}
		}
		return false
	}
	goRuntime := strings.HasPrefix(sym, "runtime.") || strings.HasPrefix(sym, "runtime/") || strings.HasPrefix(sym, "internal/runtime") ||
		strings.HasPrefix(sym, "crosscall2") || strings.HasPrefix(sym, "_cgoexp") || strings.HasPrefix(sym, "x_cgo") || strings.HasPrefix(sym, "_cgo_")
	switch {
	case dso == "envoy":
		return perfClasses[0]
	case kernel && has("futex"):
		return perfClasses[1]
	case kernel:
		return perfClasses[2]
	case strings.HasPrefix(dso, "[JIT]"):
		return perfClasses[11]
	case goRuntime && has("cgocallback", "syscall", "crosscall2", "_cgoexp", "needm", "dropm", "asmcgocall", "cgocall", "save_g", "load_g", "lockOSThread", "unlockOSThread", "_cgo_"):
		return perfClasses[4]
	case goRuntime && has("schedule", "findRunnable", "wakep", "startm", "stopm", "notewakeup", "notesleep", "lock2", "unlock2", "futex", "park", "ready", "runq", "handoffp", "acquirep", "releasep", "semacquire", "semrelease", "mPark", "casgstatus", "osyield", "procyield", "netpoll", "injectglist"):
		return perfClasses[5]
	case goRuntime && has("malloc", "gc", "scan", "mark", "sweep", "heap", "mspan", "mcache", "mcentral", "memclr", "greyobject", "wb", "Barrier"):
		return perfClasses[6]
	case goRuntime && has("timer", "Timer", "nanotime", "walltime"):
		return perfClasses[7]
	case goRuntime:
		return perfClasses[8]
	case strings.HasPrefix(sym, "github.com/envoyproxy/"):
		return perfClasses[9]
	case strings.Contains(dso, "libtokenbucket") || strings.Contains(dso, ".so") && strings.Contains(sym, "/"):
		return perfClasses[10]
	}
	return perfClasses[3]
}

// perfSample is one line of `perf report --sort pid,dso,sym`.
type perfSample struct {
	pct       float64
	tid       string
	dso, sym  string
	isWorker  bool
	className string
}

// parsePerfTidDSOSym parses `perf report --no-children --sort pid,dso,sym
// --stdio -g none`: "  5.12%  12345:wrk:worker_0  envoy  [.] 0x00123",
// and marks the samples of the thread with the most.
func parsePerfTidDSOSym(report []byte) ([]perfSample, error) {
	var out []perfSample
	byTid := map[string]float64{}
	for _, line := range strings.Split(string(report), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || strings.HasPrefix(line, "#") || !strings.HasSuffix(f[0], "%") {
			continue
		}
		pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
		if err != nil {
			continue
		}
		s := perfSample{pct: pct, tid: f[1], dso: f[2]}
		if len(f) >= 5 && strings.HasPrefix(f[3], "[") {
			s.sym = strings.Join(f[4:], " ")
		}
		byTid[s.tid] += pct
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: perf report: no sample lines")
	}
	worker, most := "", -1.0
	for tid, p := range byTid {
		if p > most {
			worker, most = tid, p
		}
	}
	for i := range out {
		out[i].isWorker = out[i].tid == worker
		out[i].className = perfClass(out[i].isWorker, out[i].dso, out[i].sym)
	}
	return out, nil
}

// ordinaryPerf profiles each target at the fixed rate and returns the
// attribution table, with each configuration's top symbols of the module.
func (b *bench) ordinaryPerf() (string, error) {
	p := b.p
	perf, err := exec.LookPath("perf")
	if err != nil {
		return "perf is not installed (Debian: apt-get install linux-perf): no attribution.\n", nil
	}
	dir, err := os.MkdirTemp("", "bench-ordinary-perf")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	type col struct {
		id      int
		label   string
		cpu     float64
		samples int
		classes map[string]float64
		top     []perfSample
	}
	var cols []col
	for _, t := range b.targets {
		pid, err := t.envoy.PID()
		if err != nil {
			return "", err
		}
		out := filepath.Join(dir, strconv.Itoa(t.s.ID)+".data")
		done := make(chan error, 1)
		var lat latResult
		go func() {
			var err error
			lat, err = fixedRate(b.addr(t), b.probe(t), b.reqs, p.openConns, b.rate, p.warmup, p.ordinaryPerf+time.Second)
			done <- err
		}()
		time.Sleep(p.warmup + 500*time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), p.ordinaryPerf+30*time.Second)
		rec := exec.CommandContext(ctx, perf, "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", out,
			"-p", strconv.Itoa(pid), "--", "sleep", strconv.FormatFloat(p.ordinaryPerf.Seconds(), 'f', 1, 64))
		recOut, recErr := rec.CombinedOutput()
		cancel()
		if err := <-done; err != nil {
			return "", err
		}
		if recErr != nil {
			return "", fmt.Errorf("bench: perf record: %v\n%s", recErr, recOut)
		}
		rep, err := exec.Command(perf, "report", "-i", out, "--no-children", "--sort", "pid,dso,sym", "--stdio", "-g", "none", "--percent-limit", "0").Output()
		if err != nil {
			return "", fmt.Errorf("bench: perf report: %v", err)
		}
		ss, err := parsePerfTidDSOSym(rep)
		if err != nil {
			return "", err
		}
		_, n, _ := parsePerfDSO(rep)
		c := col{id: t.s.ID, label: t.s.Label, cpu: lat.CPUPerReqUS, samples: n, classes: map[string]float64{}}
		for _, s := range ss {
			c.classes[s.className] += s.pct
			named := s.sym != "" && !strings.HasPrefix(s.sym, "0x")
			if named && (strings.Contains(s.dso, "libtokenbucket") || strings.HasPrefix(s.dso, "[kernel")) {
				c.top = append(c.top, s)
			}
		}
		sort.Slice(c.top, func(i, j int) bool { return c.top[i].pct > c.top[j].pct })
		c.top = c.top[:min(len(c.top), 6)]
		b.logf("perf (%d): %d samples at %.0f req/s, %.1f µs/req", t.s.ID, n, lat.Achieved, lat.CPUPerReqUS)
		cols = append(cols, c)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "Each Envoy profiled at the fixed rate with `perf record -e cpu-clock -F 2000 -p <pid>` for %v, every sample put in one class by its thread, DSO and symbol "+
		"(the worker is the thread with the most samples; the module is the build with its symbols). A cell is the class's share of the samples and, in brackets, that share of the window's Envoy CPU per request in µs. perf's sampling adds its own cost.\n\n", p.ordinaryPerf)
	md.WriteString("| class |")
	for _, c := range cols {
		fmt.Fprintf(&md, " %s |", c.label)
	}
	md.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n| Envoy CPU µs/req (samples) |")
	for _, c := range cols {
		fmt.Fprintf(&md, " %.1f (%d) |", c.cpu, c.samples)
	}
	md.WriteString("\n")
	for _, cl := range perfClasses {
		seen := false
		for _, c := range cols {
			seen = seen || c.classes[cl] >= 0.05
		}
		if !seen {
			continue
		}
		fmt.Fprintf(&md, "| %s |", cl)
		for _, c := range cols {
			fmt.Fprintf(&md, " %.1f%% (%.1f) |", c.classes[cl], c.classes[cl]/100*c.cpu)
		}
		md.WriteString("\n")
	}
	// What each configuration adds over the local_ratelimit it is like,
	// class by class.
	var ref *col
	for i := range cols {
		if cols[i].id == nativeHeadersSetup.ID {
			ref = &cols[i]
		}
	}
	if ref != nil {
		fmt.Fprintf(&md, "\nWhat each adds over *%s*, class by class, in µs of Envoy CPU per request (the same profiles: the difference of the cells above):\n\n| class |", ref.label)
		var others []col
		for _, c := range cols {
			if c.id != ref.id && c.id != 1 && c.id != 2 {
				others = append(others, c)
				fmt.Fprintf(&md, " %s |", c.label)
			}
		}
		md.WriteString("\n|---|" + strings.Repeat("---|", len(others)) + "\n| all |")
		for _, c := range others {
			fmt.Fprintf(&md, " %+.1f |", c.cpu-ref.cpu)
		}
		md.WriteString("\n")
		for _, cl := range perfClasses {
			seen := false
			for _, c := range others {
				seen = seen || c.classes[cl] >= 0.05 || ref.classes[cl] >= 0.05
			}
			if !seen {
				continue
			}
			fmt.Fprintf(&md, "| %s |", cl)
			for _, c := range others {
				fmt.Fprintf(&md, " %+.1f |", c.classes[cl]/100*c.cpu-ref.classes[cl]/100*ref.cpu)
			}
			md.WriteString("\n")
		}
	}
	for _, c := range cols {
		if len(c.top) == 0 {
			continue
		}
		fmt.Fprintf(&md, "\nThe largest symbols of the module and of the kernel in %s: ", c.label)
		var parts []string
		for _, s := range c.top {
			w := "worker"
			if !s.isWorker {
				w = "other thread"
			}
			parts = append(parts, fmt.Sprintf("`%s` %.1f%% (%s)", s.sym, s.pct, w))
		}
		md.WriteString(strings.Join(parts, ", ") + ".\n")
	}
	return md.String(), nil
}

// threadTimes are one thread's CPU ticks (utime + stime) and context
// switches (voluntary and not), from /proc/<pid>/task/<tid>/.
type threadTimes struct{ ticks, switches int64 }

// readThreads reads every thread of process pid.
func readThreads(pid int) map[string]threadTimes {
	out := map[string]threadTimes{}
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tids, _ := os.ReadDir(dir)
	for _, e := range tids {
		var tt threadTimes
		if stat, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat")); err == nil {
			// Fields after the command's closing parenthesis: utime and
			// stime are the 12th and 13th.
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
				f := strings.Fields(string(stat)[i+1:])
				if len(f) > 12 {
					u, _ := strconv.ParseInt(f[11], 10, 64)
					s, _ := strconv.ParseInt(f[12], 10, 64)
					tt.ticks = u + s
				}
			}
		}
		if status, err := os.ReadFile(filepath.Join(dir, e.Name(), "status")); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				k, v, ok := strings.Cut(line, ":")
				if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					tt.switches += n
				}
			}
		}
		out[e.Name()] = tt
	}
	return out
}

// otherSwitches is the context switches of every thread but the one that
// used the most CPU (the worker) between a and b.
func otherSwitches(a, b map[string]threadTimes) int64 {
	worker, most := "", int64(-1)
	for tid, t := range b {
		if d := t.ticks - a[tid].ticks; d > most {
			worker, most = tid, d
		}
	}
	var n int64
	for tid, t := range b {
		if tid != worker {
			n += t.switches - a[tid].switches
		}
	}
	return n
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ratelimit-wasm/tokenbucket/bench/cmd/bench/nullwasm"
	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
)

// bench is one benchmark run.
type bench struct {
	p *params
	// cleanups run, newest first, in close.
	cleanups []func()
	started  time.Time
	info     info
	reqs     [][]byte
	up       *loadgen.Upstream
	svcPort  int
	svcPID   int
	pinned   bool
	// allCPUs is the affinity this process started with: a Free setup's
	// Envoy gets it back (it inherits this process's pinning).
	allCPUs unix.CPUSet
	// nullWasm and nullCalls are the paths of package nullwasm's modules for
	// setups 9 and 10, nullPath its module making the plugin's host calls
	// (layersSetup).
	nullWasm, nullCalls, nullPath string

	targets []*target
	rate    float64 // offered rate of the latency runs
	cal     map[int]satResult
	// startups are the start measurements (starts), by configuration name.
	startups []startup
	// rls is the RLS section (rls.go); lastRedisPID the redis-server it
	// started last.
	rls          *rlsReport
	lastRedisPID int
	// rlqs is the RLQS section (rlqs.go).
	rlqs *rlqsReport
}

// target is one configuration with its running Envoy and its results.
type target struct {
	s     setup
	limit limit
	envoy *envoy.Process
	sat   []satResult
	lat   []latResult
	// half are the fixed-rate runs at half of (3)'s saturated throughput,
	// for (3) and (11) only (issue 13 compares their p50 there).
	half []latResult
	rss  []uint64
	// latReqs are the requests of the fixed-rate runs: every key for the
	// non-rejecting configurations; for the rejecting ones, as many keys as
	// make the offered rate per key twice the per-key limit.
	latReqs [][]byte
	stats   map[string]uint64
	note    string
	// ports are the listeners of a setup with several (layersSetup).
	ports []int
	// switches are the context switches of Envoy's threads but the
	// worker per request of each fixed-rate run (-ordinary).
	switches []float64
}

// info is what the report says about the machine, the versions and the
// method.
type info struct {
	Machine     machine  `json:"machine"`
	Go          string   `json:"go"`
	Envoy       string   `json:"envoy"`
	Plugin      string   `json:"plugin"`
	Limitd      string   `json:"limitd"`
	Pinning     string   `json:"pinning"`
	Date        string   `json:"date"`
	Duration    string   `json:"duration"`
	Rounds      int      `json:"rounds"`
	Conns       int      `json:"conns"`
	OpenConns   int      `json:"open_conns"`
	Keys        int      `json:"keys"`
	Load        float64  `json:"load_fraction"`
	Warmup      string   `json:"warmup"`
	SatWindow   string   `json:"sat_window"`
	LatWindow   string   `json:"lat_window"`
	Smoke       bool     `json:"smoke"`
	Calibration []string `json:"calibration"`
	Gaps        []string `json:"gaps"`
	// Starved lists the runs that got no answer at all (left out).
	Starved []string `json:"starved_runs"`
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%5.1fs] "+format+"\n", append([]any{time.Since(b.started).Seconds()}, args...)...)
}

// prepare gathers the versions, pins this process and starts the upstream
// and, when built, limitd.
func (b *bench) prepare() error {
	p := b.p
	envoyBin := envoy.DefaultBinary()
	wasm := os.Getenv("PLUGIN_WASM")
	if !fileExists(envoyBin) {
		return fmt.Errorf("bench: %s: no such file (run `make setup`, or set FUNC_E_DATA_HOME)", envoyBin)
	}
	if !fileExists(wasm) {
		return fmt.Errorf("bench: PLUGIN_WASM %q: no such file (run `make build`, or set PLUGIN_WASM)", wasm)
	}
	b.info = info{
		Machine:   readMachine(),
		Go:        runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		Envoy:     envoy.BinaryVersion(envoyBin),
		Plugin:    pluginVersion(wasm),
		Date:      time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Rounds:    p.rounds,
		Conns:     p.conns,
		OpenConns: p.openConns,
		Keys:      p.keys,
		Load:      p.load,
		Warmup:    p.warmup.String(),
		SatWindow: p.satWindow.String(),
		LatWindow: p.latWindow.String(),
		Smoke:     p.smoke,
	}
	b.reqs = keyRequests(p.keys)
	b.pin()

	up, err := loadgen.StartUpstream()
	if err != nil {
		return fmt.Errorf("bench: upstream: %w", err)
	}
	b.up = up
	b.cleanup(up.Close)
	plugin, err := os.ReadFile(wasm)
	if err != nil {
		return err
	}
	if err := nullwasm.CheckLike(plugin); err != nil {
		return fmt.Errorf("bench: %s: %w", wasm, err)
	}
	dir, err := os.MkdirTemp("", "bench-")
	if err != nil {
		return err
	}
	b.cleanup(func() { os.RemoveAll(dir) })
	b.nullWasm = filepath.Join(dir, "null.wasm")
	b.nullCalls = filepath.Join(dir, "null-calls.wasm")
	b.nullPath = filepath.Join(dir, "null-path.wasm")
	for path, m := range map[string][]byte{b.nullWasm: nullwasm.Module, b.nullCalls: nullwasm.ModuleCalls, b.nullPath: nullwasm.ModulePath} {
		if err := os.WriteFile(path, m, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// pin puts this process on -load-cpu; Envoys go to -envoy-cpu as they start.
func (b *bench) pin() {
	p := b.p
	var allowed unix.CPUSet
	err := unix.SchedGetaffinity(0, &allowed)
	b.allCPUs = allowed
	switch {
	case p.noPin:
		b.info.Pinning = "none (-no-pin)"
	case err != nil:
		b.info.Pinning = "none (sched_getaffinity: " + err.Error() + ")"
	case p.envoyCPU == p.loadCPU || !allowed.IsSet(p.envoyCPU) || !allowed.IsSet(p.loadCPU):
		b.info.Pinning = fmt.Sprintf("none (CPUs %d and %d are not both available)", p.envoyCPU, p.loadCPU)
	default:
		if err := pinProcess(os.Getpid(), p.loadCPU); err != nil {
			b.info.Pinning = "none (" + err.Error() + ")"
			return
		}
		b.pinned = true
		b.info.Pinning = fmt.Sprintf("Envoy (all threads, --concurrency 1) on CPU %d; load generator, upstream, limitd and this program on CPU %d (sched_setaffinity)", p.envoyCPU, p.loadCPU)
	}
}

// pluginVersion names the plugin binary by the source tree's commit and its
// content hash.
func pluginVersion(wasm string) string {
	data, err := os.ReadFile(wasm)
	if err != nil {
		return "unknown"
	}
	sum := sha256.Sum256(data)
	v := fmt.Sprintf("%s, %.1f MB, sha256 %s", filepath.Base(wasm), float64(len(data))/1e6, hex.EncodeToString(sum[:6]))
	if out, err := exec.Command("git", "-C", filepath.Dir(wasm), "describe", "--always", "--dirty").Output(); err == nil {
		v = "commit " + strings.TrimSpace(string(out)) + ", " + v
	}
	return v
}

// startLimitd runs the limit service (in-memory buckets) on a free loopback
// port and waits for /healthz.
func (b *bench) startLimitd() error {
	bin := b.p.limitd
	if !fileExists(bin) {
		return fmt.Errorf("%s not built (make build-service)", bin)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logFile, err := os.CreateTemp("", "bench-limitd-*.log")
	if err != nil {
		return err
	}
	logFile.Close()
	// Cleanups run last first: the log goes once spawn's stopped limitd.
	b.cleanup(func() { os.Remove(logFile.Name()) })
	cmd := exec.Command(absPath(bin), "--listen", "127.0.0.1:"+strconv.Itoa(port), "--log-level", "warn")
	exited, err := b.spawn(cmd, logFile.Name())
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile.Name())
			return fmt.Errorf("limitd exited: %s", strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("limitd: no /healthz answer in 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.svcPort = port
	b.svcPID = cmd.Process.Pid
	b.info.Limitd = fmt.Sprintf("%s (in-memory buckets, --listen 127.0.0.1:%d)", bin, port)
	return nil
}

// startEnvoy starts t's Envoy with limit l and pins it.
func (b *bench) startEnvoy(t *target, l limit) error {
	t.limit = l
	opts := t.s.options(b.up.Port(), b.svcPort, b.p.keys, l)
	opts.StartTimeout = b.p.startTimeout
	switch {
	case t.s.Name == "null-wasm":
		opts.PluginWasm = b.nullWasm
	case t.s.Name == "null-wasm-calls":
		opts.PluginWasm = b.nullCalls
	case t.s.isOps():
		opts.PluginWasm = absPath(b.p.opsWasm)
	case t.s.ID == moduleOther.ID:
		opts.NativeModule = absPath(b.p.compareModule)
	case t.s.Kind == kindModule:
		opts.NativeModule = absPath(b.p.module)
	case t.s.ID == layersSetup.ID:
		ls, err := b.layerListeners(l)
		if err != nil {
			return err
		}
		opts.Listeners = ls
		t.ports = make([]int, len(ls))
		for i, x := range ls {
			t.ports[i] = x.Port
		}
	}
	t0 := time.Now()
	e, err := envoy.Start(opts)
	if err != nil {
		return fmt.Errorf("bench: (%d) %s: starting Envoy: %w", t.s.ID, t.s.Label, err)
	}
	t.envoy = e
	b.cleanup(func() { _, _ = e.Stop() })
	pid, err := e.PID()
	if err != nil {
		return err
	}
	switch {
	case b.pinned && t.s.Free:
		if err := setAffinity(pid, &b.allCPUs); err != nil {
			return err
		}
	case b.pinned:
		if err := pinProcess(pid, b.p.envoyCPU); err != nil {
			return err
		}
	}
	b.logf("(%d) %s: Envoy pid %d up in %.1fs", t.s.ID, t.s.Label, pid, time.Since(t0).Seconds())
	// Prime: V8 compiles the plugin lazily and tiers up under load, so the
	// first seconds of traffic are slower than the rest. Not measured.
	for _, ld := range b.loads(t, 0) {
		cs := make([]loadgen.Counts, b.p.conns)
		end := time.Now().Add(b.p.prime)
		do, closeConns := loadgen.HTTP(ld.addr, b.p.conns, end, loadgen.Cycle(ld.reqs, b.p.conns))
		loadgen.Closed(do, cs, time.Time{}, end, nil)
		closeConns()
		if n := loadgen.Sum(cs); n.Total() == 0 {
			return fmt.Errorf("bench: (%d) %s %s: no answer while priming (%d transport errors)", t.s.ID, t.s.Label, ld.name, n.Errors)
		}
	}
	return nil
}

func (b *bench) cleanup(f func()) { b.cleanups = append(b.cleanups, f) }

// close stops every process and removes every file the run started or made.
func (b *bench) close() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
	b.cleanups = nil
}

func (b *bench) stopEnvoy(t *target) {
	if t.envoy != nil {
		t.envoy.Stop()
		t.envoy = nil
	}
}

// startAll starts the Envoys of the non-rejecting configurations; the
// rejecting ones need the calibration first.
func (b *bench) startAll(sel []setup) error {
	for _, s := range sel {
		t := &target{s: s}
		if s.Kind == kindModule && !fileExists(b.p.module) {
			gap := fmt.Sprintf("(%d) %s not measured: %s: no such file (make build-native)", s.ID, s.Label, b.p.module)
			b.info.Gaps = append(b.info.Gaps, gap)
			b.logf("%s", gap)
			continue
		}
		if s.usesLimitd() {
			if err := b.startLimitd(); err != nil {
				gap := fmt.Sprintf("(%d) %s not measured: %v", s.ID, s.Label, err)
				b.info.Gaps = append(b.info.Gaps, gap)
				b.logf("%s", gap)
				continue
			}
		}
		b.targets = append(b.targets, t)
		if !s.Rejecting {
			if err := b.startEnvoy(t, unlimited); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bench) target(id int) *target {
	for _, t := range b.targets {
		if t.s.ID == id {
			return t
		}
	}
	return nil
}

func (b *bench) addr(t *target) string { return "127.0.0.1:" + strconv.Itoa(t.envoy.ListenerPort()) }

func (b *bench) probe(t *target) probe {
	pid, _ := t.envoy.PID() // known since startEnvoy
	pr := probe{envoyPID: pid, envoyCPU: b.p.envoyCPU, loadCPU: b.p.loadCPU, ours: []int{os.Getpid()}}
	if b.svcPID != 0 {
		pr.ours = append(pr.ours, b.svcPID)
	}
	return pr
}

// calibrate measures the saturated throughput and CPU per request of (1),
// (2) and (3) once, sets the latency runs' rate from (1)'s throughput,
// and starts (4) and (5) with limits computed from their non-rejecting
// twins' CPU per request, corrected once for the cost of a rejection when
// p.correct is set.
func (b *bench) calibrate() error {
	p := b.p
	b.cal = map[int]satResult{}
	for _, t := range b.targets {
		if t.s.Rejecting || t.s.usesLimitd() || t.s.isDiag() {
			continue
		}
		r, err := b.calibrationRun(t)
		if err != nil {
			return err
		}
		b.cal[t.s.ID] = r
		b.logf("calibration (%d) %s: %.0f req/s, Envoy CPU %.0f%%, %.1f µs/req", t.s.ID, t.s.Label, r.Throughput, 100*r.EnvoyCPU, r.CPUPerReqUS)
		b.info.Calibration = append(b.info.Calibration, fmt.Sprintf("(%d) %s: %.0f req/s saturated with %.0f%% of its core, %.1f µs of Envoy CPU per request", t.s.ID, t.s.Label, r.Throughput, 100*r.EnvoyCPU, r.CPUPerReqUS))
	}
	baseID := 1
	base, ok := b.cal[1]
	if !ok {
		// Without (1), the first calibrated configuration sets the rate.
		for _, t := range b.targets {
			if r, ok := b.cal[t.s.ID]; ok {
				base, baseID = r, t.s.ID
				break
			}
		}
	}
	if base.Throughput <= 0 {
		base.Throughput, base.CPUPerReqUS = 2000, 500 // nothing calibrated
	}
	b.rate = p.load * base.Throughput
	b.info.Calibration = append(b.info.Calibration, fmt.Sprintf("fixed-rate runs offered %.0f req/s, %.0f%% of the saturated throughput of (%d) in calibration", b.rate, 100*p.load, baseID))

	for _, t := range b.targets {
		if !t.s.Rejecting {
			continue
		}
		twin := 3
		if t.s.Kind == kindNative {
			twin = 2
		}
		sat, ok := b.cal[twin]
		if !ok {
			sat = base
		}
		// With a share s of its core, Envoy spending ca of CPU on an allowed
		// request and cr on a rejected one rejects half of a closed loop's
		// requests at a total limit of s / (ca + cr). Below that share the
		// rejected fraction falls fast (to none at s = limit·ca), so the
		// limit aims at rejectShare, what Envoy typically got here, rather
		// than at the whole core (where it rejects a little more than half). The first try
		// assumes cr = ca; the correction measures cr in a saturated run
		// of the rejecting configuration itself, where the CPU per request
		// with a fraction f rejected is (1-f)·ca + f·cr (ca from the twin).
		ca := sat.CPUPerReqUS / 1e6
		first := 1 / (2 * ca)
		l := b.perKey(first)
		if err := b.startEnvoy(t, l); err != nil {
			return err
		}
		if !p.correct {
			b.info.Calibration = append(b.info.Calibration, fmt.Sprintf("(%d) per-key limit %d/s, burst %d (total %d/s): 1 / (2 × %.1f µs of CPU per allowed request in (%d))", t.s.ID, l.Rate, l.Burst, l.Rate*int64(p.keys), 1e6*ca, twin))
			continue
		}
		r, err := b.calibrationRun(t)
		if err != nil {
			return err
		}
		total, cr := first, ca
		if f := r.Rejected; f > 0.02 {
			if c := (r.CPUPerReqUS/1e6 - (1-f)*ca) / f; c > 0 {
				cr = c
				total = rejectShare / (ca + cr)
			}
			b.logf("calibration (%d): at %.0f/s: %.0f%% rejected, %.1f µs CPU/req: a rejection costs %.1f µs of CPU, an allowed request %.1f µs; limit for 50%%: %.0f/s", t.s.ID, first, 100*f, r.CPUPerReqUS, 1e6*cr, 1e6*ca, total)
		}
		b.stopEnvoy(t)
		l = b.perKey(total)
		if err := b.startEnvoy(t, l); err != nil {
			return err
		}
		b.info.Calibration = append(b.info.Calibration, fmt.Sprintf("(%d) per-key limit %d/s, burst %d (total %d/s) = %.2f / (%.1f µs + %.1f µs), the CPU of an allowed request in (%d) and of a rejected one, measured in a first try at %.0f/s that rejected %.0f%%", t.s.ID, l.Rate, l.Burst, l.Rate*int64(p.keys), rejectShare, 1e6*ca, 1e6*cr, twin, first, 100*r.Rejected))
	}
	for _, t := range b.targets {
		if !t.s.Rejecting {
			continue
		}
		if err := b.checkPerKey(t); err != nil {
			return err
		}
		k := int(math.Round(b.rate / 2 / float64(t.limit.Rate)))
		k = max(1, min(k, maxDescriptors(p.keys)))
		t.latReqs = keyRequests(k)
		b.info.Calibration = append(b.info.Calibration, fmt.Sprintf("(%d) fixed-rate runs over %d keys (%.0f req/s per key against a limit of %d/s)", t.s.ID, k, b.rate/float64(k), t.limit.Rate))
	}
	return nil
}

// rejectShare is the share of its core Envoy is assumed to get when the
// rejecting configurations' limits are computed.
const rejectShare = 0.85

// minCalibrationCPU is the Envoy CPU time a calibration gathers at least
// (within maxCalibrationRuns runs), so that its CPU per request is not
// dominated by the 10 ms tick of /proc/<pid>/stat when the shared machine
// leaves Envoy little of its core.
const (
	minCalibrationCPU  = 1.5 // seconds: 150 ticks
	maxCalibrationRuns = 4
)

// calibrationRun saturates t for the calibration window, repeated until
// Envoy used minCalibrationCPU, and pools the runs.
func (b *bench) calibrationRun(t *target) (satResult, error) {
	var pooled satResult
	var secs float64
	for i := 0; i < maxCalibrationRuns && pooled.CPUSeconds < minCalibrationCPU; i++ {
		r, err := saturate(b.addr(t), b.probe(t), b.reqs, b.p.conns, b.p.warmup, b.p.calWindow)
		if err != nil {
			return r, fmt.Errorf("bench: calibrating (%d): %w", t.s.ID, err)
		}
		if r.Requests == 0 {
			continue // starved: try again
		}
		rejected := pooled.Rejected*float64(pooled.Requests) + r.Rejected*float64(r.Requests)
		pooled.Requests += r.Requests
		pooled.CPUSeconds += r.CPUSeconds
		pooled.Errors += r.Errors
		secs += float64(r.Requests) / r.Throughput
		pooled.Rejected = rejected / float64(pooled.Requests)
	}
	if pooled.Requests == 0 {
		return pooled, fmt.Errorf("bench: calibrating (%d): no answer in %d runs", t.s.ID, maxCalibrationRuns)
	}
	pooled.Throughput = float64(pooled.Requests) / secs
	pooled.EnvoyCPU = pooled.CPUSeconds / secs
	pooled.CPUPerReqUS = pooled.CPUSeconds / float64(pooled.Requests) * 1e6
	return pooled, nil
}

// checkPerKey proves that t limits per x-api-key value: one key sent well
// past its burst gets rejections, and a fresh key right after is allowed.
func (b *bench) checkPerKey(t *target) error {
	n := int(2*t.limit.Burst + 5)
	if n > 5000 {
		return nil
	}
	hot := loadgen.Request("GET", "/probe", "Host: bench", "x-api-key: probe-hot")
	fresh := loadgen.Request("GET", "/probe", "Host: bench", "x-api-key: probe-fresh")
	do, closeConns := loadgen.HTTP(b.addr(t), 1, time.Now().Add(5*time.Second), func(_ int, i int64) []byte {
		if i < int64(n) {
			return hot
		}
		return fresh
	})
	defer closeConns()
	rejected, status := 0, 0
	for i := range n + 1 {
		var err error
		if status, err = do(0, int64(i)); err != nil {
			return fmt.Errorf("bench: (%d) per-key check: %w", t.s.ID, err)
		}
		if status == 429 && i < n {
			rejected++
		}
	}
	if rejected == 0 || status != 200 {
		return fmt.Errorf("bench: (%d) %s does not limit per key: %d requests on one key (burst %d) gave %d rejections, then a new key got %d",
			t.s.ID, t.s.Label, n, t.limit.Burst, rejected, status)
	}
	return nil
}

// perKey splits a total rate over the keys: whole tokens per second, burst
// one second's worth.
func (b *bench) perKey(total float64) limit {
	r := int64(math.Round(total / float64(b.p.keys)))
	r = max(r, 1)
	return limit{Rate: r, Burst: r}
}

// roundOrder is the order of targets in round r: as started in even
// rounds, reversed in odd ones, so that drift cancels.
func roundOrder[T any](targets []T, r int) []T {
	order := slices.Clone(targets)
	if r%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// writeDoc writes a generated markdown page into -out and prints it.
func (b *bench) writeDoc(name, text string) error {
	if err := os.MkdirAll(b.p.out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(b.p.out, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s\nwrote %s\n", text, path)
	return nil
}

// rounds runs every configuration once per round, alternating the order.
func (b *bench) rounds() error {
	p := b.p
	per := p.warmup*2 + p.satWindow + p.latWindow
	b.logf("%d rounds × %d configurations × %.0fs; latency runs at %.0f req/s", p.rounds, len(b.targets), per.Seconds(), b.rate)
	for r := range p.rounds {
		for _, t := range roundOrder(b.targets, r) {
			if err := b.measure(t); err != nil {
				return fmt.Errorf("bench: round %d, (%d) %s: %w", r+1, t.s.ID, t.s.Label, err)
			}
			s, l := t.sat[len(t.sat)-1], t.lat[len(t.lat)-1]
			if s.Requests == 0 || l.Samples == 0 {
				b.info.Starved = append(b.info.Starved, fmt.Sprintf("round %d, (%d): %d answers in the saturation run, %d latency samples", r+1, t.s.ID, s.Requests, l.Samples))
			}
			b.logf("round %d (%d) %-30s %7.0f req/s (%4.1f%% rej, %5.1f µs CPU/req) | at %.0f/s p50 %5.0f p90 %5.0f p99 %6.0f µs, %5.1f µs CPU/req | RSS %.0f MiB | others on CPU %d/%d: %.0f%%/%.0f%%",
				r+1, t.s.ID, t.s.Label, s.Throughput, 100*s.Rejected, s.CPUPerReqUS, l.Achieved, l.P50US, l.P90US, l.P99US, l.CPUPerReqUS,
				float64(t.rss[len(t.rss)-1])/(1<<20), p.envoyCPU, p.loadCPU, 100*s.Core0Other, 100*s.Core1Other)
		}
	}
	return nil
}

func (b *bench) measure(t *target) error {
	p := b.p
	if t.latReqs == nil {
		t.latReqs = b.reqs
	}
	s, err := saturate(b.addr(t), b.probe(t), b.reqs, p.conns, p.warmup, p.satWindow)
	if err != nil {
		return err
	}
	l, err := fixedRate(b.addr(t), b.probe(t), t.latReqs, p.openConns, b.rate, p.warmup, p.latWindow)
	if err != nil {
		return err
	}
	if c3, ok := b.cal[3]; ok && (t.s.ID == 3 || t.s.ID == 11) {
		h, err := fixedRate(b.addr(t), b.probe(t), t.latReqs, p.openConns, c3.Throughput/2, p.warmup, p.latWindow)
		if err != nil {
			return err
		}
		t.half = append(t.half, h)
	}
	rss, err := t.envoy.RSS()
	if err != nil {
		return err
	}
	t.sat = append(t.sat, s)
	t.lat = append(t.lat, l)
	t.rss = append(t.rss, rss)
	return nil
}

// leaseCallsStat counts the plugin's calls to /v1/lease.
const leaseCallsStat = "wasmcustom.tokenbucket.lease_calls"

// verify reads each Envoy's statistics and fails when a limiter did not
// run, a non-rejecting one rejected, or requests failed.
func (b *bench) verify() error {
	var problems []string
	for _, t := range b.targets {
		st, err := t.envoy.Stats("")
		if err != nil {
			return err
		}
		t.stats = map[string]uint64{}
		for _, k := range []string{t.s.allowedStat(), t.s.rejectedStat(), "http.ingress.downstream_rq_total",
			"http.ingress.downstream_rq_5xx", "wasmcustom.tokenbucket.service_errors", "wasmcustom.tokenbucket.cas_retries",
			"wasmcustom.tokenbucket.memory.heap_bytes", "wasmcustom.tokenbucket.memory.gc_cycles", leaseCallsStat} {
			if v, ok := st[k]; ok && k != "" {
				t.stats[k] = v
			}
		}
		var errs int64
		for _, s := range t.sat {
			errs += s.Errors
		}
		for _, l := range t.lat {
			errs += l.Errors
		}
		if errs > 0 {
			problems = append(problems, fmt.Sprintf("(%d): %d failed requests (transport errors or statuses other than 200 and 429)", t.s.ID, errs))
		}
		if t.s.Kind == kindNone {
			continue
		}
		allowed, rejected := st[t.s.allowedStat()], st[t.s.rejectedStat()]
		if !t.s.decides() {
			if allowed+rejected != 0 {
				problems = append(problems, fmt.Sprintf("(%d): %d requests decided, want none", t.s.ID, allowed+rejected))
			}
			continue
		}
		if allowed == 0 {
			problems = append(problems, fmt.Sprintf("(%d): %s is 0: the limiter did not run", t.s.ID, t.s.allowedStat()))
		}
		if !t.s.Rejecting && rejected > 0 {
			problems = append(problems, fmt.Sprintf("(%d): %d rejections (%s) in a configuration that must never reject", t.s.ID, rejected, t.s.rejectedStat()))
		}
		if t.s.Rejecting && rejected == 0 {
			problems = append(problems, fmt.Sprintf("(%d): no rejections (%s)", t.s.ID, t.s.rejectedStat()))
		}
		if n := st["wasmcustom.tokenbucket.service_errors"]; n > 0 {
			t.note = fmt.Sprintf("%d limit-service calls failed open", n)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("bench: the results are not valid:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

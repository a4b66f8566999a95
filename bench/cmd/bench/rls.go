// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"cmp"
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

// The RLS section (issue 31): Envoy's own rate limit filter
// (envoy.filters.http.ratelimit, the rate limit service API over gRPC)
// asking envoyproxy/ratelimit, and asking limitd's gRPC front door, each
// with a redis-server of its own, under the same load; beside them the
// plugin's cluster rule through limitd's HTTP API on a redis-server of its
// own, per request and with leases. Every configuration answers every
// request 200 (keys spread, limits never reached), except the window-edge
// bursts at the end, which run on a descriptor of their own.
//
// What a run measures, per round and configuration: a saturation run and a
// run at a fixed rate (the same rate for all, rlsFixedRate; calibration says
// whether the slowest keeps up), reading the CPU time of Envoy, of
// the limit service and of its Redis from /proc/<pid>/stat over the window.
// Envoy with no filter runs at the same rate for the latency it adds.

// rlsKind is what answers for a configuration of the RLS section.
type rlsKind int

const (
	rlsNone      rlsKind = iota // Envoy with no filter
	rlsRatelimit                // Envoy's ratelimit filter → envoyproxy/ratelimit
	rlsLimitd                   // Envoy's ratelimit filter → limitd --grpc-listen
	rlsPlugin                   // the plugin's cluster rule per request → limitd /v1/decide
	rlsLease                    // the plugin's cluster rule with leases → limitd /v1/lease
	// The RLQS section's (rlqs.go):
	rlsLocal       // Envoy's local_ratelimit
	rlsQuota       // Envoy's rate_limit_quota filter → limitd's RLQS on --grpc-listen
	rlsModuleLease // the native module's cluster rule with leases → limitd /v1/lease
)

// rlsConfig is one configuration of the RLS section.
type rlsConfig struct {
	ID        int    `json:"id"`
	Name      string `json:"name"`
	Label     string `json:"label"`
	Kind      rlsKind
	Algorithm string `json:"algorithm,omitempty"` // limitd's --rls-algorithm
}

// rlsBeforeConfig runs the limitd of -rls-limitd-before with token
// buckets, beside this build's, when the flag is set.
var rlsBeforeConfig = rlsConfig{46, "rls-limitd-before", "ratelimit filter → limitd before (-rls-limitd-before), token buckets", rlsLimitd, "token_bucket"}

// rlsFloorConfig runs the limitd of -rls-limitd-floor (built with the
// benchfloor tag: its plain decisions run take_floor.lua, which reads the
// record and the clock, writes the record and admits). Beside the token
// buckets it splits what Redis adds into the floor of one script call per
// decision (the round trip, the client, Redis running a script that
// touches the record) and the script's own arithmetic.
var rlsFloorConfig = rlsConfig{48, "rls-limitd-floor", "ratelimit filter → limitd, a script's floor (read, clock, write)", rlsLimitd, "token_bucket"}

// configID is c's ID, for byID.
func (c rlsConfig) configID() int { return c.ID }

var rlsConfigs = []rlsConfig{
	{40, "rls-none", "Envoy, no filter", rlsNone, ""},
	{41, "rls-envoy-ratelimit", "ratelimit filter → envoyproxy/ratelimit", rlsRatelimit, "fixed_window"},
	{42, "rls-limitd-fixed", "ratelimit filter → limitd, fixed_window", rlsLimitd, "fixed_window"},
	{43, "rls-limitd", "ratelimit filter → limitd, token buckets", rlsLimitd, "token_bucket"},
	{44, "rls-plugin", "plugin, cluster rule per request → limitd", rlsPlugin, "token_bucket"},
	{45, "rls-plugin-lease", "plugin, cluster rule with leases → limitd (one hot key)", rlsLease, "token_bucket"},
	{rlsMemoryID, "rls-limitd-memory", "ratelimit filter → limitd, token buckets in memory (no Redis)", rlsLimitd, "token_bucket"},
}

// rlsMemoryID is limitd's gRPC door with no --redis: the same decisions in
// its in-memory store, so its CPU per decision is what the door, gRPC and
// the Go runtime cost before any store. Beside the token buckets on Redis
// it splits limitd's figure into the door's floor and what Redis adds (the
// client's round trip and the script), which no change to the scripts can
// take below the door's.
const rlsMemoryID = 47

// The descriptors every RLS service is given (envoyproxy/ratelimit's YAML):
// api_key, one bucket per x-api-key value that no load reaches, and edge,
// one per x-edge-key value, of rlsEdgeLimit a second, for the bursts
// across a window edge.
const (
	rlsDomain    = "bench"
	rlsEdgeLimit = 20
	rlsYAML      = `domain: bench
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
  - key: edge
    rate_limit:
      unit: second
      requests_per_unit: 20
`
)

// rlsRateLimit is Envoy's ratelimit filter of the section: one descriptor
// from x-api-key, another from x-edge-key (each sent only when its header
// is there). Errors answer 500 (failure_mode_deny) and so fail the run; the
// timeout is generous for a loaded machine (Envoy's default is 20 ms).
func rlsRateLimit() *envoy.RateLimit {
	return &envoy.RateLimit{Domain: rlsDomain, FailureModeDeny: true, Timeout: "1s",
		FilterRateLimits: envoy.RateLimitsYAML(
			envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-api-key", "api_key")}},
			envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-edge-key", "edge")}})}
}

// rlsTarget is one configuration with its processes and results.
type rlsTarget struct {
	c      rlsConfig
	envoy  *envoy.Process
	svcPID int // the limit service (0: none)
	rdsPID int // its redis-server
	sat    []satResult
	lat    []latResult
	stats  map[string]uint64
	edges  []edgeTrial

	// svcHTTP is limitd's --listen port (its /metrics), yaml its
	// --rls-config (rlsYAML when empty), denied the requests the quota
	// filter refused before its first assignments (rlqsAwait), points
	// the windows at fixed rates (rlqsRun).
	svcHTTP int
	yaml    string
	denied  int
	points  []ratePoint
	metrics map[string]float64 // limitd's /metrics at the end (RLQS)
}

// rlsTools are the binaries the section runs.
type rlsTools struct {
	ratelimit, limitd, redis string
	before                   string // rlsBeforeConfig's limitd
	floor                    string // rlsFloorConfig's limitd
	grpc                     bool   // limitd has --grpc-listen
	rlqs                     bool   // limitd serves RLQS (--rlqs-ttl)
	module                   string
}

// rlsRun measures the RLS section into b.rls.
func (b *bench) rlsRun() error {
	p := b.p
	started := time.Now()
	b.rls = &rlsReport{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), LoadStart: loadAvg(),
		Rounds: p.rounds, Keys: p.keys, Conns: p.conns, OpenConns: p.openConns, Warmup: p.warmup.String(),
		SatWindow: p.satWindow.String(), LatWindow: p.latWindow.String(), Smoke: p.smoke, EdgeLimit: rlsEdgeLimit, Pinning: b.info.Pinning}
	tools := rlsTools{ratelimit: p.ratelimit, limitd: cmp.Or(p.rlsLimitd, p.limitd), before: p.rlsBefore, floor: p.rlsFloor}
	b.rls.Ratelimit = moduleVersion(tools.ratelimit)
	configs := rlsConfigs
	if tools.floor != "" {
		configs = append(slices.Clip(configs), rlsFloorConfig)
	}
	if tools.before != "" {
		configs = append(slices.Clip(configs), rlsBeforeConfig)
	}
	targets, err := b.rlsStartAll("rls", configs, tools, &b.rls.Redis, &b.rls.Limitd, &b.rls.Gaps)
	if err != nil {
		return err
	}
	// Calibration: every configuration should keep up with the fixed rate;
	// the page says when the slowest does not.
	slowest := 0.0
	for _, t := range targets {
		if t.c.Kind == rlsNone {
			continue
		}
		r, err := saturate(b.rlsAddr(t), b.rlsProbe(t), b.reqs, p.conns, p.warmup, p.calWindow)
		if err != nil {
			return err
		}
		b.logf("rls calibration (%d) %s: %.0f req/s", t.c.ID, t.c.Label, r.Throughput)
		if r.Throughput > 0 && (slowest == 0 || r.Throughput < slowest) {
			slowest = r.Throughput
		}
	}
	b.rls.Rate = rlsFixedRate
	b.rls.Load = rlsFixedRate / max(slowest, 1)
	if slowest < rlsFixedRate {
		b.rls.Gaps = append(b.rls.Gaps, fmt.Sprintf("the slowest configuration saturated at %.0f req/s in calibration, below the fixed rate: its fixed-rate figures are of what it kept up with", slowest))
	}
	for r := range p.rounds {
		for _, t := range roundOrder(targets, r) {
			pr := b.rlsProbe(t)
			pr.counters = b.rlsBatchCounters(t)
			s, err := saturate(b.rlsAddr(t), pr, b.reqs, p.conns, p.warmup, p.satWindow)
			if err != nil {
				return err
			}
			l, err := fixedRate(b.rlsAddr(t), pr, b.reqs, p.openConns, b.rls.Rate, p.warmup, p.latWindow)
			if err != nil {
				return err
			}
			t.sat, t.lat = append(t.sat, s), append(t.lat, l)
			b.logf("rls round %d (%d) %-50s %7.0f req/s, CPU µs/req: Envoy %5.1f service %5.1f redis %5.1f | at %.0f/s p50 %5.0f p99 %6.0f µs%s",
				r+1, t.c.ID, t.c.Label, s.Throughput, s.CPUPerReqUS, perReq(s, 0), perReq(s, 1), l.Achieved, l.P50US, l.P99US, perPipeline(s.Counters, l.Counters))
		}
	}
	// The stats before the bursts, which are refused on purpose.
	for _, t := range targets {
		if t.stats, err = t.envoy.Stats(""); err != nil {
			return err
		}
	}
	trials := 3
	if p.smoke {
		trials = 1
	}
	for i := range trials {
		for _, t := range targets {
			if t.c.Kind != rlsRatelimit && t.c.Kind != rlsLimitd || t.c.ID == rlsFloorConfig.ID { // the floor admits all
				continue
			}
			e, err := b.edgeTrial(t, i)
			if err != nil {
				return err
			}
			b.logf("rls edge (%d) %s: %d + %d admitted of %d + %d sent across a window edge in %.0f ms (limit %d a second; attempt %d, clean %v)",
				t.c.ID, t.c.Label, e.Before, e.After, e.Sent/2, e.Sent/2, e.SpanMS, rlsEdgeLimit, e.Attempts, e.Clean)
			t.edges = append(t.edges, e)
		}
	}
	if !p.smoke {
		if err := b.rlsProfiles(targets); err != nil {
			return err
		}
	}
	b.rls.LoadEnd = loadAvg()
	b.rls.Duration = time.Since(started).Round(time.Second).String()
	return b.rls.summarise(targets)
}

// rlsStartAll starts the configurations of the section named name ("rls",
// "rlqs") with tools, after finding redis-server and what limitd serves:
// it sets *redis and *limitd to their versions, appends to *gaps each
// configuration tools cannot run, and returns those started (their files
// in a temporary directory removed at cleanup).
func (b *bench) rlsStartAll(name string, configs []rlsConfig, tools rlsTools, redis, limitd *string, gaps *[]string) ([]*rlsTarget, error) {
	var err error
	if tools.redis, err = exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("bench: the %s section needs redis-server: %w", strings.ToUpper(name), err)
	}
	if out, err := exec.Command(tools.redis, "--version").Output(); err == nil {
		*redis = strings.TrimSpace(string(out))
	}
	*limitd = moduleVersion(tools.limitd)
	if fileExists(tools.limitd) {
		out, _ := exec.Command(tools.limitd, "-h").CombinedOutput()
		tools.grpc = strings.Contains(string(out), "grpc-listen")
		tools.rlqs = strings.Contains(string(out), "rlqs-ttl")
	}
	dir, err := os.MkdirTemp("", "bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	b.cleanup(func() { os.RemoveAll(dir) })
	var targets []*rlsTarget
	for _, c := range configs {
		t := &rlsTarget{c: c}
		switch {
		case c.ID == rlqsFloorID:
			t.yaml = rlqsAllowYAML
		case c.Kind == rlsQuota:
			t.yaml = rlqsYAML
		}
		if gap := tools.missing(c); gap != "" {
			*gaps = append(*gaps, fmt.Sprintf("%s not measured: %s", c.Label, gap))
			b.logf("%s: %s", name, (*gaps)[len(*gaps)-1])
			continue
		}
		if err := b.rlsStart(t, tools, filepath.Join(dir, c.Name)); err != nil {
			return nil, fmt.Errorf("bench: (%d) %s: %w", c.ID, c.Label, err)
		}
		targets = append(targets, t)
	}
	return targets, nil
}

// rlsFixedRate is the fixed rate of the section's second run, the issue's
// (43): the CPU per decision of a service that is not saturated, and the
// latency.
const rlsFixedRate = 1000.0

// missing says why configuration c cannot run with tools ("" when it can).
func (t rlsTools) missing(c rlsConfig) string {
	switch c.Kind {
	case rlsRatelimit:
		if !fileExists(t.ratelimit) {
			return t.ratelimit + ": no such file (make build-ratelimit)"
		}
	case rlsLimitd, rlsPlugin, rlsLease, rlsQuota, rlsModuleLease:
		if !fileExists(t.limitd) {
			return t.limitd + ": no such file (make build-service)"
		}
		if c.Kind == rlsLimitd && !t.grpc {
			return t.limitd + " has no --grpc-listen (the rate limit service API)"
		}
		if c.Kind == rlsQuota && !t.rlqs {
			return t.limitd + " does not serve the rate limit quota service (no --rlqs-ttl)"
		}
		if c.Kind == rlsModuleLease && !fileExists(t.module) {
			return t.module + ": no such file (make build-native)"
		}
	}
	return ""
}

// moduleVersion names a Go binary by its main module's path and version.
func moduleVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return filepath.Base(path)
	}
	v := bi.Main.Path + " " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += ", commit " + s.Value[:12]
		}
	}
	return v + ", " + bi.GoVersion
}

// rlsStart starts t's Redis, limit service and Envoy (files in dir).
func (b *bench) rlsStart(t *rlsTarget, tools rlsTools, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	opts := envoy.Options{UpstreamPort: b.up.Port(), Concurrency: 1, LogLevel: "warn", StartTimeout: b.p.startTimeout, FailurePolicy: "FAIL_CLOSED"}
	switch t.c.Kind {
	case rlsNone:
		opts.NoWasm = true
	case rlsLocal:
		opts = setup{Kind: kindNative}.options(b.up.Port(), 0, b.p.keys, unlimited)
		opts.StartTimeout = b.p.startTimeout
	default:
		redisPort, err := b.startRedis(tools.redis, dir)
		if err != nil {
			return err
		}
		svcPort, err := b.startService(t, tools, dir, redisPort)
		if err != nil {
			return err
		}
		switch t.c.Kind {
		case rlsRatelimit, rlsLimitd:
			opts.NoWasm, opts.RateLimit, opts.RLSPort = true, rlsRateLimit(), svcPort
		case rlsPlugin:
			opts = setup{Kind: kindCluster}.options(b.up.Port(), svcPort, b.p.keys, unlimited)
		case rlsLease:
			opts = setup{Kind: kindLease}.options(b.up.Port(), svcPort, b.p.keys, unlimited)
		case rlsModuleLease:
			opts = setup{Kind: kindLease}.options(b.up.Port(), svcPort, b.p.keys, unlimited)
			opts.Build, opts.NativeModule = envoy.Native, absPath(tools.module)
		case rlsQuota:
			opts.NoWasm, opts.RateLimitQuota, opts.RLQSPort = true, rlqsFilter(), svcPort
		}
		opts.StartTimeout = b.p.startTimeout
	}
	e, err := envoy.Start(opts)
	if err != nil {
		return fmt.Errorf("starting Envoy: %w", err)
	}
	t.envoy = e
	b.cleanup(func() { _, _ = e.Stop() })
	pid, _ := e.PID()
	if b.pinned {
		if err := pinProcess(pid, b.p.envoyCPU); err != nil {
			return err
		}
	}
	if t.c.Kind == rlsQuota {
		if err := b.rlqsAwait(t); err != nil {
			return err
		}
	}
	// Prime: every connection, the service's and Redis's included, opened
	// and warm before anything is measured.
	cs := make([]loadgen.Counts, b.p.conns)
	end := time.Now().Add(b.p.prime)
	do, closeConns := loadgen.HTTP(b.rlsAddr(t), b.p.conns, end, loadgen.Cycle(b.reqs, b.p.conns))
	loadgen.Closed(do, cs, time.Time{}, end, nil)
	closeConns()
	if n := loadgen.Sum(cs); n.OK == 0 {
		return fmt.Errorf("no 200 while priming (%d answers, %d refused, %d other, %d transport errors):\n%s",
			n.Total(), n.Rejected, n.Other, n.Errors, envoy.Tail(e.Log(), 20))
	}
	b.logf("rls (%d) %s: Envoy pid %d, service pid %d, redis pid %d", t.c.ID, t.c.Label, pid, t.svcPID, t.rdsPID)
	return nil
}

// startRedis runs a redis-server of its own (no persistence) on a free
// loopback port and waits for its PONG.
func (b *bench) startRedis(bin, dir string) (int, error) {
	port, err := loopback.FreePort()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if _, err := b.spawn(cmd, filepath.Join(dir, "redis.log")); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second); err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if strings.HasPrefix(line, "+PONG") {
				return port, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("redis-server on port %d: no PONG in 20 s", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startService runs t's limit service against the Redis on redisPort and
// returns the port Envoy's cluster names: the gRPC port of the rate limit
// service API, or limitd's HTTP port for the plugin.
func (b *bench) startService(t *rlsTarget, tools rlsTools, dir string, redisPort int) (int, error) {
	httpPort, err := loopback.FreePort()
	if err != nil {
		return 0, err
	}
	grpcPort, err := loopback.FreePort()
	if err != nil {
		return 0, err
	}
	for grpcPort == httpPort {
		if grpcPort, err = loopback.FreePort(); err != nil {
			return 0, err
		}
	}
	config := filepath.Join(dir, "config", "bench.yaml")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		return 0, err
	}
	if err := os.WriteFile(config, []byte(cmp.Or(t.yaml, rlsYAML)), 0o644); err != nil {
		return 0, err
	}
	redis := "127.0.0.1:" + strconv.Itoa(redisPort)
	var cmd *exec.Cmd
	health := fmt.Sprintf("http://127.0.0.1:%d/healthz", httpPort)
	port := grpcPort
	switch t.c.Kind {
	case rlsRatelimit:
		// The project's harness: its defaults (USE_STATSD=false, the
		// configuration folder under dir), else envoyproxy/ratelimit's own.
		srv, err := envoyratelimit.StartServer(envoyratelimit.Options{RedisAddr: redis, Binary: tools.ratelimit,
			Configs: map[string]string{"bench.yaml": rlsYAML}, Dir: filepath.Join(dir, "ratelimit-root")})
		if err != nil {
			return 0, err
		}
		b.cleanup(srv.Stop)
		t.svcPID, t.rdsPID = srv.PID(), b.lastRedisPID
		return srv.GRPCPort(), nil
	case rlsLimitd, rlsQuota:
		bin := tools.limitd
		switch t.c.ID {
		case rlsBeforeConfig.ID:
			bin = tools.before
		case rlsFloorConfig.ID:
			bin = tools.floor
		}
		args := []string{"--listen", "127.0.0.1:" + strconv.Itoa(httpPort),
			"--grpc-listen", "127.0.0.1:" + strconv.Itoa(grpcPort), "--rls-config", config,
			"--rls-algorithm", t.c.Algorithm, "--log-level", "warn"}
		if t.c.ID != rlsMemoryID { // its redis-server idles, watched as the others'
			args = append(args, "--redis", redis)
		}
		cmd = exec.Command(bin, args...)
	default:
		cmd = exec.Command(tools.limitd, "--listen", "127.0.0.1:"+strconv.Itoa(httpPort), "--redis", redis, "--log-level", "warn")
		port = httpPort
	}
	exited, err := b.spawn(cmd, filepath.Join(dir, "service.log"))
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get(health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "service.log"))
			return 0, fmt.Errorf("%s exited: %s", cmd.Path, envoy.Tail(string(log), 20))
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "service.log"))
			return 0, fmt.Errorf("%s: no 200 from %s in 30 s: %s", cmd.Path, health, envoy.Tail(string(log), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.svcPID, t.svcHTTP = cmd.Process.Pid, httpPort
	t.rdsPID = b.lastRedisPID
	return port, nil
}

// spawn starts cmd with its output in logPath, killed with this process
// and stopped (SIGTERM, then SIGKILL after 10 s) by close. The channel is
// closed when it exited. A redis-server's pid is kept in lastRedisPID.
func (b *bench) spawn(cmd *exec.Cmd, logPath string) (<-chan struct{}, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	if filepath.Base(cmd.Path) == "redis-server" {
		b.lastRedisPID = cmd.Process.Pid
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	b.cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
	})
	return exited, nil
}

func (b *bench) rlsAddr(t *rlsTarget) string {
	return "127.0.0.1:" + strconv.Itoa(t.envoy.ListenerPort())
}

// rlsProbe watches t's Envoy, and its limit service and Redis apart.
func (b *bench) rlsProbe(t *rlsTarget) probe {
	pid, _ := t.envoy.PID()
	pr := probe{envoyPID: pid, envoyCPU: b.p.envoyCPU, loadCPU: b.p.loadCPU, ours: []int{os.Getpid()}}
	if t.svcPID != 0 {
		pr.ours = append(pr.ours, t.svcPID, t.rdsPID)
		pr.watch = []int{t.svcPID, t.rdsPID}
	}
	return pr
}

// rlsBatchCounters reads, for a target whose service is limitd, how many
// decisions its Redis pipelines carried and how many pipelines there were
// (limitd_redis_batch_size's sum and count); nil for the others.
func (b *bench) rlsBatchCounters(t *rlsTarget) func() ([]float64, error) {
	if (t.c.Kind != rlsLimitd && t.c.Kind != rlsPlugin) || t.svcHTTP == 0 {
		return nil
	}
	return func() ([]float64, error) {
		m, err := b.limitdMetrics(t)
		if err != nil {
			return nil, err
		}
		return []float64{m["limitd_redis_batch_size_sum"], m["limitd_redis_batch_size_count"]}, nil
	}
}

// perPipeline says how many decisions limitd's Redis pipelines carried on
// average in a saturation run and a fixed-rate one, from the growth of
// rlsBatchCounters; empty without them.
func perPipeline(sat, lat []float64) string {
	if len(sat) != 2 || len(lat) != 2 || sat[1] == 0 || lat[1] == 0 {
		return ""
	}
	return fmt.Sprintf(" | decisions a pipeline: saturated %.2f, fixed rate %.2f", sat[0]/sat[1], lat[0]/lat[1])
}

// perReq is watched process i's CPU microseconds per request of run s.
func perReq(s satResult, i int) float64 {
	if i >= len(s.Watched) || s.Requests == 0 {
		return 0
	}
	return s.Watched[i] / float64(s.Requests) * 1e6
}

// edgeTrial is one scripted burst across a window edge: edgeBurst
// requests on one fresh x-edge-key value 250 ms before a second starts and
// as many 50 ms after, against a limit of rlsEdgeLimit a second. A trial
// counts (Clean) only when every answer of the first burst arrived before
// the edge and every answer of the second within the next second: on a
// busy machine a burst may take longer, and the trial is tried again with a
// new key, at most edgeAttempts times.
type edgeTrial struct {
	Sent     int     `json:"sent"`
	Before   int     `json:"admitted_before_edge"`
	After    int     `json:"admitted_after_edge"`
	SpanMS   float64 `json:"span_ms"` // from the first send to the last answer
	Other    int     `json:"other_statuses"`
	Attempts int     `json:"attempts"`
	Clean    bool    `json:"clean"`
}

// Admitted is what the two bursts got through.
func (e edgeTrial) Admitted() int { return e.Before + e.After }

// Bound is the most a token bucket of rlsEdgeLimit, refilled at
// rlsEdgeLimit a second, may admit over the trial's span.
func (e edgeTrial) Bound() int {
	return rlsEdgeLimit + int(float64(rlsEdgeLimit)*e.SpanMS/1000)
}

// edgeBurst is the number of requests of each burst, each on a connection
// of its own, sent at once; edgeAttempts bounds the tries of one trial.
const (
	edgeBurst    = 2 * rlsEdgeLimit
	edgeAttempts = 5
)

// edgeTimes are the two bursts' starts for a trial beginning at now: 250 ms
// before the next whole second at least 600 ms away, and 50 ms after it.
func edgeTimes(now time.Time) (edge, before, after time.Time) {
	edge = now.Truncate(time.Second).Add(time.Second)
	if edge.Sub(now) < 600*time.Millisecond {
		edge = edge.Add(time.Second)
	}
	return edge, edge.Add(-250 * time.Millisecond), edge.Add(50 * time.Millisecond)
}

// edgeTrial runs trial n on t until it is clean or edgeAttempts were made.
func (b *bench) edgeTrial(t *rlsTarget, n int) (edgeTrial, error) {
	var e edgeTrial
	for a := 1; a <= edgeAttempts; a++ {
		var err error
		if e, err = b.edgeAttempt(t, fmt.Sprintf("edge-%d-%d-%d", t.c.ID, n, a)); err != nil {
			return e, err
		}
		e.Attempts = a
		if e.Clean {
			break
		}
	}
	return e, nil
}

// burstResult is one burst: the 200s, other statuses than 200 and 429,
// transport errors, the first send and the last answer.
type burstResult struct {
	admitted, other int
	errs            []error
	first, last     time.Time
}

// edgeAttempt sends the two bursts on the x-edge-key value key.
func (b *bench) edgeAttempt(t *rlsTarget, key string) (edgeTrial, error) {
	edgeReq := loadgen.Request("GET", "/edge", "Host: bench", "x-edge-key: "+key)
	warm := loadgen.Request("GET", "/edge", "Host: bench")
	edge, before, after := edgeTimes(time.Now())
	do, closeConns := loadgen.HTTP(b.rlsAddr(t), edgeBurst, after.Add(10*time.Second), func(_ int, i int64) []byte {
		if i == 0 {
			return warm // no descriptor: opens the connection, decides nothing
		}
		return edgeReq
	})
	defer closeConns()
	var mu sync.Mutex
	burst := func(at time.Time, n int64) burstResult {
		var r burstResult
		time.Sleep(time.Until(at))
		var wg sync.WaitGroup
		for w := range edgeBurst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				status, err := do(w, n)
				t1 := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if r.first.IsZero() || t0.Before(r.first) {
					r.first = t0
				}
				if t1.After(r.last) {
					r.last = t1
				}
				switch {
				case err != nil:
					r.errs = append(r.errs, err)
				case status == 200:
					r.admitted++
				case status != 429:
					r.other++
				}
			}()
		}
		wg.Wait()
		return r
	}
	var wg sync.WaitGroup
	for w := range edgeBurst {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = do(w, 0) }()
	}
	wg.Wait()
	r1 := burst(before, 1)
	r2 := burst(after, 2)
	if errs := append(r1.errs, r2.errs...); len(errs) > 0 {
		return edgeTrial{}, fmt.Errorf("bench: (%d) edge trial: %d transport errors, the first: %w", t.c.ID, len(errs), errs[0])
	}
	return edgeTrial{
		Sent: 2 * edgeBurst, Before: r1.admitted, After: r2.admitted, Other: r1.other + r2.other,
		SpanMS: float64(r2.last.Sub(r1.first).Microseconds()) / 1e3,
		Clean:  r1.last.Before(edge) && !r2.first.Before(edge) && r2.last.Before(edge.Add(time.Second)),
	}, nil
}

// rlsProfileFor is how long each RLS service is profiled, and
// rlsProfileTop how many groups of its samples the page lists.
const (
	rlsProfileFor = 5 * time.Second
	rlsProfileTop = 10
)

// rlsProfile is where one process's CPU went under a saturating load:
// perf's samples of it, grouped (a Go service's by package, Redis's by
// function), with the CPU per decision of the same run.
type rlsProfile struct {
	Label   string         `json:"label"`
	Samples int            `json:"samples"`
	CPUUS   float64        `json:"cpu_us_per_req"`
	Top     []profileEntry `json:"top"`
}

// rlsProfiles profiles envoyproxy/ratelimit and limitd (token buckets),
// and each one's Redis, under a saturating closed loop with `perf record
// -e cpu-clock -p <pid>` and keeps the largest groups. The services must
// keep their symbols (go install does; make bench-rls builds
// limitd-symbols). Without perf it says so in the page and profiles
// nothing.
func (b *bench) rlsProfiles(targets []*rlsTarget) error {
	perf, err := exec.LookPath("perf")
	if err != nil {
		b.rls.Gaps = append(b.rls.Gaps, "no CPU profile of the services: perf is not installed (Debian: apt-get install linux-perf)")
		return nil
	}
	dir, err := os.MkdirTemp("", "bench-rls-perf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, t := range targets {
		if t.c.ID != 41 && t.c.ID != 43 && t.c.ID != rlsMemoryID {
			continue
		}
		name := "envoyproxy/ratelimit"
		if t.c.Kind == rlsLimitd {
			name = "limitd (" + strings.ReplaceAll(t.c.Algorithm, "_", " ") + "s)"
		}
		procs := []struct {
			label  string
			pid    int
			byFunc bool
		}{{name, t.svcPID, false}, {"the Redis of " + name, t.rdsPID, true}}
		if t.c.ID == rlsMemoryID { // its Redis idles
			procs = procs[:1]
			procs[0].label = "limitd (token buckets in memory)"
		}
		outs := make([]string, len(procs))
		done := make(chan error, 1)
		var sat satResult
		go func() {
			var err error
			sat, err = saturate(b.rlsAddr(t), b.rlsProbe(t), b.reqs, b.p.conns, b.p.warmup, rlsProfileFor+time.Second)
			done <- err
		}()
		time.Sleep(b.p.warmup)
		ctx, cancel := context.WithTimeout(context.Background(), rlsProfileFor+30*time.Second)
		recErrs := make([]error, len(procs))
		var wg sync.WaitGroup
		for i, pr := range procs {
			outs[i] = filepath.Join(dir, t.c.Name+"-"+strconv.Itoa(i)+".data")
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec := exec.CommandContext(ctx, perf, "record", "-e", "cpu-clock", "-F", "1999", "-o", outs[i],
					"-p", strconv.Itoa(pr.pid), "--", "sleep", strconv.FormatFloat(rlsProfileFor.Seconds(), 'f', 1, 64))
				if out, err := rec.CombinedOutput(); err != nil {
					recErrs[i] = fmt.Errorf("bench: perf record -p %d: %v\n%s", pr.pid, err, out)
				}
			}()
		}
		wg.Wait()
		cancel()
		if err := <-done; err != nil {
			return err
		}
		for i, pr := range procs {
			if recErrs[i] != nil {
				return recErrs[i]
			}
			rep, err := exec.Command(perf, "report", "-i", outs[i], "--no-children", "--sort", "sym", "--stdio").CombinedOutput()
			if err != nil {
				return fmt.Errorf("bench: perf report: %v\n%s", err, rep)
			}
			groups, samples, err := perfGroups(rep, pr.byFunc)
			if err != nil {
				return err
			}
			p := rlsProfile{Label: pr.label, Samples: samples, CPUUS: perReq(sat, i), Top: groups[:min(len(groups), rlsProfileTop)]}
			b.logf("rls profile (%d) %s: %d samples, %.1f µs/req, top %v", t.c.ID, pr.label, samples, p.CPUUS, p.Top[:min(len(p.Top), 4)])
			b.rls.Profiles = append(b.rls.Profiles, p)
		}
	}
	return nil
}

// perfGroups reads `perf report --sort sym --stdio`: each line's share
// ("  2.33%  [.] runtime.step"; "[k]" marks the kernel), summed by Go
// package (byFunc false: "kernel" for the kernel's, the package path for a
// Go symbol, the symbol itself otherwise) or kept by function; largest
// first, with the sample count.
func perfGroups(report []byte, byFunc bool) ([]profileEntry, int, error) {
	lines, samples, err := parsePerfDSO(report)
	if err != nil {
		return nil, 0, err
	}
	sum := map[string]float64{}
	for _, l := range lines {
		mark, sym, ok := strings.Cut(l.DSO, " ")
		if !ok {
			mark, sym = "", l.DSO
		}
		g := sym
		switch {
		case byFunc:
		case mark == "[k]":
			g = "kernel"
		default:
			g = goPackage(sym)
		}
		sum[g] += l.Percent / 100
	}
	var out []profileEntry
	for g, v := range sum {
		out = append(out, profileEntry{Function: g, Share: v})
	}
	slices.SortFunc(out, func(a, b profileEntry) int {
		return cmp.Or(cmp.Compare(b.Share, a.Share), strings.Compare(a.Function, b.Function))
	})
	return out, samples, nil
}

// goPackage is the package path of a Go symbol ("runtime.step" →
// "runtime", "google.golang.org/grpc/internal/transport.(*loopyWriter).run"
// → "google.golang.org/grpc/internal/transport"); a symbol of another
// language (no dot after its last slash) is returned as it is.
func goPackage(sym string) string {
	slash := strings.LastIndex(sym, "/")
	rest := sym[slash+1:]
	dot := strings.Index(rest, ".")
	if dot <= 0 {
		return sym
	}
	return sym[:slash+1+dot]
}

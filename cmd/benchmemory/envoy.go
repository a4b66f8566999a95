// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/loopback"
)

// Bounds on starting and stopping Envoy.
const (
	startTimeout = 180 * time.Second
	stopGrace    = 10 * time.Second
	pollInterval = 50 * time.Millisecond
)

// configYAML is the bootstrap of the benchmark: the Wasm filter runs on every
// request, then Envoy answers 200 itself (a direct response), so no upstream
// takes CPU from Envoy on a small machine. Template data as in
// envoytest.DemoConfigYAML.
const configYAML = `admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: {{.AdminPort}}}
static_resources:
  listeners:
  - name: main
    address:
      socket_address: {address: 127.0.0.1, port_value: {{.ListenerPort}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "ok\n"}}
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: {{.Data.name}}
                root_id: {{.Data.name}}
                vm_config:
                  runtime: envoy.wasm.runtime.v8
                  vm_id: {{.Data.name}}
                  code:
                    local:
                      filename: {{yamlstr .PluginWasm}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {{yamlstr .PluginConfig}}
                failure_policy: FAIL_CLOSED
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`

// envoy is one Envoy process of the benchmark.
type envoy struct {
	cmd   *exec.Cmd
	done  chan struct{}
	dir   string
	admin string // base URL of the admin interface
	addr  string // listener host:port
	hc    *http.Client
}

// startEnvoy starts bin with the plugin at wasm (filter and VM named name,
// configuration pluginConfig) and waits until it serves.
func startEnvoy(bin, wasm, name, pluginConfig string, concurrency int) (*envoy, error) {
	ports := make([]int, 2)
	for i := range ports {
		p, err := loopback.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	cfg, err := envoytest.RenderConfig(configYAML, envoytest.TemplateData{
		ListenerPort: ports[0], AdminPort: ports[1], PluginWasm: wasm, PluginConfig: pluginConfig,
		Data: map[string]any{"name": name},
	})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "benchmemory-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "envoy.yaml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	cmd := exec.Command(bin, "-c", filepath.Join(dir, "envoy.yaml"), "--concurrency", strconv.Itoa(concurrency),
		"--disable-hot-restart", "-l", "warn")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Envoy dies with this program, even on a crash.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("benchmemory: start %s: %w", bin, err)
	}
	e := &envoy{
		cmd: cmd, done: make(chan struct{}), dir: dir,
		admin: "http://127.0.0.1:" + strconv.Itoa(ports[1]),
		addr:  "127.0.0.1:" + strconv.Itoa(ports[0]),
		hc:    &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}},
	}
	go func() { _ = cmd.Wait(); close(e.done) }()
	if err := e.awaitReady(time.Now().Add(startTimeout)); err != nil {
		tail := e.logTail()
		e.stop()
		return nil, fmt.Errorf("%w\n%s", err, tail)
	}
	return e, nil
}

var errExited = errors.New("benchmemory: envoy exited")

// awaitReady polls /ready until it says LIVE and the listener accepts a
// connection.
func (e *envoy) awaitReady(deadline time.Time) error {
	for {
		select {
		case <-e.done:
			return errExited
		default:
		}
		body, err := e.adminGet("/ready")
		if err == nil && strings.TrimSpace(string(body)) == "LIVE" {
			if c, err := net.DialTimeout("tcp", e.addr, time.Second); err == nil {
				c.Close()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("benchmemory: envoy not ready in time")
		}
		time.Sleep(pollInterval)
	}
}

func (e *envoy) adminGet(path string) ([]byte, error) {
	resp, err := e.hc.Get(e.admin + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("benchmemory: admin %s: status %d", path, resp.StatusCode)
	}
	return b, err
}

// stats returns the counters and gauges whose names match the RE2 filter.
func (e *envoy) stats(filter string) (map[string]uint64, error) {
	b, err := e.adminGet("/stats?format=json&filter=" + url.QueryEscape(filter))
	if err != nil {
		return nil, err
	}
	return envoytest.ParseStatsJSON(b)
}

// allocator is what Envoy's allocator (tcmalloc) reports on the admin
// endpoint /memory.
type allocator struct {
	// allocated is the bytes handed out and not taken back. Unlike RSS it
	// does not count memory the allocator keeps free for reuse, nor the Wasm
	// VMs' memory (V8 maps that itself); shared data is in it.
	allocated uint64
	// pageheapFree is the bytes of free pages the allocator holds: RSS that
	// new allocations reuse before RSS grows.
	pageheapFree uint64
}

func (e *envoy) allocator() (allocator, error) {
	b, err := e.adminGet("/memory")
	if err != nil {
		return allocator{}, err
	}
	return parseAllocator(b)
}

// parseAllocator reads the JSON of Envoy's /memory.
func parseAllocator(body []byte) (allocator, error) {
	var m struct {
		Allocated    string `json:"allocated"`
		PageheapFree string `json:"pageheap_free"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return allocator{}, fmt.Errorf("benchmemory: /memory: %w", err)
	}
	var a allocator
	var err error
	if a.allocated, err = strconv.ParseUint(m.Allocated, 10, 64); err != nil {
		return allocator{}, fmt.Errorf("benchmemory: /memory: allocated: %w", err)
	}
	if a.pageheapFree, err = strconv.ParseUint(m.PageheapFree, 10, 64); err != nil {
		return allocator{}, fmt.Errorf("benchmemory: /memory: pageheap_free: %w", err)
	}
	return a, nil
}

// rss returns Envoy's resident memory in bytes (VmRSS).
func (e *envoy) rss() (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(e.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("benchmemory: rss: %w", err)
	}
	return parseVmRSS(string(b))
}

// parseVmRSS reads the VmRSS line of a /proc/<pid>/status file, in bytes.
func parseVmRSS(status string) (uint64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("benchmemory: rss: unexpected VmRSS line %q", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("benchmemory: rss: VmRSS: %w", err)
		}
		return kb * 1024, nil
	}
	return 0, errors.New("benchmemory: rss: no VmRSS line (zombie process?)")
}

// alive reports whether Envoy is still running.
func (e *envoy) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, then SIGKILL after stopGrace, and removes the
// temporary directory.
func (e *envoy) stop() {
	if e.alive() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.done:
		case <-time.After(stopGrace):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
	}
	_ = os.RemoveAll(e.dir)
}

// logTail returns the end of Envoy's log.
func (e *envoy) logTail() string {
	b, _ := os.ReadFile(filepath.Join(e.dir, "envoy.log"))
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

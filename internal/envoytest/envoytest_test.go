// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoytest

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --- without Envoy ---

func TestRenderConfig(t *testing.T) {
	tricky := `{"rules":[{"name":"a: b # c","header":"x-key","note":"quote \" backslash \\ newline
tab	<html> & 'single' {{braces}} ünïcode"}]}`
	tests := []struct {
		name    string
		tmpl    string
		data    TemplateData
		want    string // substring of the output
		wantErr string // substring of the error
	}{
		{"ports", "a: {{.ListenerPort}} b: {{.AdminPort}} c: {{.UpstreamPort}} d: {{.ServicePort}}",
			TemplateData{ListenerPort: 1, AdminPort: 2, UpstreamPort: 3, ServicePort: 4}, "a: 1 b: 2 c: 3 d: 4", ""},
		{"yamlstr", "v: {{yamlstr .PluginConfig}}", TemplateData{PluginConfig: `{"a":"<b>"}`},
			`v: "{\"a\":\"<b>\"}"`, ""},
		{"json", "v: {{json .Data.m}}", TemplateData{Data: map[string]any{"m": map[string]int{"k": 1}}},
			`v: {"k":1}`, ""},
		{"data", "v: {{.Data.x}}", TemplateData{Data: map[string]any{"x": "y"}}, "v: y", ""},
		{"missing data key", "v: {{.Data.nope}}", TemplateData{Data: map[string]any{}}, "", "nope"},
		{"unknown field", "v: {{.Nope}}", TemplateData{}, "", "Nope"},
		{"parse error", "v: {{", TemplateData{}, "", "config template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RenderConfig(tt.tmpl, tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("RenderConfig() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !strings.Contains(got, tt.want) {
				t.Fatalf("RenderConfig() = %q, %v; want it to contain %q", got, err, tt.want)
			}
		})
	}

	t.Run("yamlstr round trip", func(t *testing.T) {
		for _, s := range []string{"", tricky, "\x00\x7f\u2028", strings.Repeat("é", 100)} {
			q, err := yamlString(s)
			if err != nil {
				t.Fatal(err)
			}
			if strings.ContainsAny(q, "\n\r\t") {
				t.Errorf("yamlstr(%q) = %s: not a single-line scalar", s, q)
			}
			var back string
			if err := json.Unmarshal([]byte(q), &back); err != nil || back != s {
				t.Errorf("yamlstr(%q) = %s, reads back as %q, %v", s, q, back, err)
			}
		}
	})
}

func TestDemoConfigYAML(t *testing.T) {
	d := TemplateData{ListenerPort: 10000, AdminPort: 10001, UpstreamPort: 10002,
		PluginWasm: "/p/plugin.wasm", PluginConfig: `{"a":1}`, FailurePolicy: "FAIL_CLOSED"}
	got, err := RenderConfig(DemoConfigYAML, d)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"port_value: 10000}", "port_value: 10001}", "port_value: 10002}",
		`filename: "/p/plugin.wasm"`, `value: "{\"a\":1}"`, "failure_policy: FAIL_CLOSED",
		"root_id: tokenbucket", "vm_id: tokenbucket", "envoy.wasm.runtime.v8",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("DemoConfigYAML lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "limit_service") {
		t.Errorf("DemoConfigYAML has limit_service with ServicePort 0")
	}
	d.ServicePort = 10003
	got, err = RenderConfig(DemoConfigYAML, d)
	if err != nil || !strings.Contains(got, "cluster_name: limit_service") || !strings.Contains(got, "port_value: 10003}") {
		t.Errorf("DemoConfigYAML with ServicePort lacks limit_service: %v\n%s", err, got)
	}
}

func TestParseStatsJSON(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    map[string]uint64
		wantErr bool
	}{
		{"counters and gauges", `{"stats":[{"name":"a.b","value":3},{"name":"g","value":0}]}`,
			map[string]uint64{"a.b": 3, "g": 0}, false},
		{"histograms skipped", `{"stats":[{"name":"c","value":1},{"histograms":{"supported_quantiles":[0,50]}}]}`,
			map[string]uint64{"c": 1}, false},
		{"max uint64", `{"stats":[{"name":"big","value":18446744073709551615}]}`,
			map[string]uint64{"big": 1<<64 - 1}, false},
		{"float form", `{"stats":[{"name":"f","value":1e3}]}`, map[string]uint64{"f": 1000}, false},
		{"empty", `{"stats":[]}`, map[string]uint64{}, false},
		{"negative", `{"stats":[{"name":"n","value":-1}]}`, nil, true},
		{"string value", `{"stats":[{"name":"s","value":"x"}]}`, nil, true},
		{"not json", `a.b: 3`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStatsJSON([]byte(tt.body))
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseStatsJSON() error = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("ParseStatsJSON() = %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("ParseStatsJSON()[%q] = %d, want %d", k, got[k], v)
				}
			}
		})
	}
}

func FuzzParseStatsJSON(f *testing.F) {
	f.Add([]byte(`{"stats":[{"name":"a","value":1},{"histograms":{}}]}`))
	f.Add([]byte(`{"stats":[{"name":"a","value":1.5e19}]}`))
	f.Add([]byte(`{"stats":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseStatsJSON(b)
		if err != nil && m != nil {
			t.Fatalf("ParseStatsJSON() = %v with error %v", m, err)
		}
	})
}

func TestTail(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"a\nb\nc", 1, "c"},
		{"", 3, ""},
		{"\nx", 1, "x"},
		{"a\nb", 2, "a\nb"},
		{"a\nb", 0, ""},
		{strings.Repeat("y", logTailBytes+1), 1, "..." + strings.Repeat("y", logTailBytes)},
	}
	for i, tt := range tests {
		if got := tail(tt.s, tt.n); got != tt.want {
			t.Errorf("step %d: tail(%q, %d) = %q, want %q", i, tt.s, tt.n, got, tt.want)
		}
	}
}

// fakeTB records Skipf and Fatalf; both end the calling goroutine as the
// real ones do.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (*fakeTB) Helper() {}
func (f *fakeTB) Skipf(string, ...any) {
	f.skipped = true
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(string, ...any) {
	f.failed = true
	runtime.Goexit()
}

func TestEnvoyBinFromEnv(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "envoy")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, env, ci       string
		want                string
		wantSkip, wantFatal bool
	}{
		{"set", exe, "", exe, false, false},
		{"unset locally", "", "", "", true, false},
		{"unset in CI", "", "true", "", false, true},
		{"missing file locally", exe + ".nope", "false", "", true, false},
		{"missing file in CI", exe + ".nope", "1", "", false, true},
		{"directory", filepath.Dir(exe), "", "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("ENVOY_BIN", tt.env)
			t.Setenv("CI", tt.ci)
			f := &fakeTB{TB: t}
			var got string
			done := make(chan struct{})
			go func() {
				defer close(done)
				got = EnvoyBin(f)
			}()
			<-done
			if got != tt.want || f.skipped != tt.wantSkip || f.failed != tt.wantFatal {
				t.Errorf("EnvoyBin() = %q, skipped %v, failed %v; want %q, %v, %v",
					got, f.skipped, f.failed, tt.want, tt.wantSkip, tt.wantFatal)
			}
		})
	}
}

func TestUpstream(t *testing.T) {
	tests := []struct {
		name       string
		opts       UpstreamOptions
		wantStatus int
		wantLen    int
		minElapsed time.Duration
	}{
		{"default", UpstreamOptions{}, 200, 3, 0},
		{"body size", UpstreamOptions{BodySize: 100000}, 200, 100000, 0},
		{"status", UpstreamOptions{Status: 503}, 503, 3, 0},
		{"delay", UpstreamOptions{Delay: 50 * time.Millisecond}, 200, 3, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := StartUpstream(t, tt.opts)
			c := NewClient(u.URL())
			defer c.Close()
			r := c.Get("/p?q=1", map[string]string{"x-test": "v", "Host": "example.test"})
			if r.Err != nil || r.Status != tt.wantStatus || len(r.Body) != tt.wantLen || r.Elapsed < tt.minElapsed {
				t.Fatalf("Get() = %v (len %d, %v); want %d, len %d, >= %v",
					r, len(r.Body), r.Elapsed, tt.wantStatus, tt.wantLen, tt.minElapsed)
			}
			if got := u.Requests(); got != 1 {
				t.Errorf("Requests() = %d, want 1", got)
			}
			h := u.LastHeader()
			if h.Get("X-Test") != "v" || h.Get("Host") != "example.test" {
				t.Errorf("LastHeader() = %v", h)
			}
			if u.Port() <= 0 || !strings.HasSuffix(u.URL(), ":"+strconv.Itoa(u.Port())) {
				t.Errorf("Port() = %d, URL() = %s", u.Port(), u.URL())
			}
		})
	}
}

func TestBurst(t *testing.T) {
	u := StartUpstream(t, UpstreamOptions{})
	c := NewClient(u.URL())
	defer c.Close()
	const n = 50
	res := c.Burst(n, func(i int) *http.Request {
		return c.NewRequest(http.MethodGet, "/"+strconv.Itoa(i), nil)
	})
	if got := Statuses(res); got[200] != n {
		t.Fatalf("Burst statuses = %v, want %d × 200", got, n)
	}
	if got := u.Requests(); got != n {
		t.Errorf("upstream saw %d requests, want %d", got, n)
	}
	if res := c.Burst(MaxBurst+1, nil); len(res) != MaxBurst+1 || res[0].Err == nil {
		t.Errorf("Burst(MaxBurst+1) gave no error")
	}
	if res := c.Burst(1, func(int) *http.Request { return c.NewRequest("BAD METHOD", "/", nil) }); res[0].Err == nil {
		t.Errorf("Burst with an invalid request gave no error")
	}
}

// --- with the real Envoy (skipped without ENVOY_BIN) ---

func TestEnvoyPlain(t *testing.T) {
	EnvoyBin(t)
	u := StartUpstream(t, UpstreamOptions{})
	e := Start(t, Options{Config: PlainConfigYAML, UpstreamPort: u.Port(), Concurrency: 2})
	c := e.Client()
	defer c.Close()

	r := c.Get("/hello", map[string]string{"x-client": "a"})
	if r.Err != nil || r.Status != 200 || string(r.Body) != "ok\n" {
		t.Fatalf("GET /hello = %v, want 200 ok", r)
	}
	if got := u.LastHeader().Get("X-Client"); got != "a" {
		t.Errorf("upstream saw x-client %q, want a", got)
	}
	e.WaitStat("http.ingress.downstream_rq_2xx", 1, 5*time.Second)
	stats := e.Stats()
	if len(stats) < 100 || stats["cluster.upstream.upstream_rq_total"] != 1 {
		t.Errorf("Stats(): %d stats, cluster.upstream.upstream_rq_total = %d; want > 100 and 1",
			len(stats), stats["cluster.upstream.upstream_rq_total"])
	}
	if got := e.Stat("server.concurrency"); got != 2 {
		t.Errorf("Stat(server.concurrency) = %d, want 2", got)
	}
	if got := e.Stat("no.such.stat"); got != 0 {
		t.Errorf("Stat(no.such.stat) = %d, want 0", got)
	}

	res := c.Burst(100, func(i int) *http.Request { return c.NewRequest(http.MethodGet, "/b", nil) })
	if got := Statuses(res); got[200] != 100 {
		t.Errorf("Burst statuses = %v, want 100 × 200", got)
	}
	if got := u.Requests(); got != 101 {
		t.Errorf("upstream saw %d requests, want 101", got)
	}

	rss := e.RSS()
	if rss == 0 {
		t.Errorf("RSS() = 0")
	}
	line := e.WaitLog("starting main dispatch loop", 5*time.Second)
	t.Logf("pid %d, RSS %.1f MiB, log: %s", e.PID(), float64(rss)/(1<<20), line)

	if code := e.Stop(); code != 0 {
		t.Errorf("Stop() = %d, want 0\n%s", code, tail(e.Log(), 20))
	}
	if _, err := net.DialTimeout("tcp", e.URL("")[len("http://"):], time.Second); err == nil {
		t.Errorf("listener still accepts after Stop")
	}
	if e.Stop() != 0 {
		t.Errorf("second Stop() differs")
	}
}

func TestEnvoysSideBySide(t *testing.T) {
	EnvoyBin(t)
	u := StartUpstream(t, UpstreamOptions{})
	var es [3]*Envoy
	for i := range es {
		es[i] = Start(t, Options{Config: PlainConfigYAML, UpstreamPort: u.Port(), Concurrency: 1})
	}
	for i, e := range es {
		c := e.Client()
		if r := c.Get("/", nil); r.Status != 200 {
			t.Errorf("envoy %d: GET / = %v", i, r)
		}
		c.Close()
	}
}

func TestExpectStartFailure(t *testing.T) {
	EnvoyBin(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	addr, ok := held.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("held address %v is not TCP", held.Addr())
	}
	heldPort := addr.Port

	tests := []struct {
		name    string
		opts    Options
		want    Outcome
		wantLog string
	}{
		{"unknown field", Options{Config: strings.Replace(PlainConfigYAML, "connect_timeout", "connect_timeoutt", 1)},
			Exited, "connect_timeoutt"},
		{"route to unknown cluster", Options{Config: strings.Replace(PlainConfigYAML, "cluster: upstream,", "cluster: nowhere,", 1)},
			Exited, "nowhere"},
		{"bad enum", Options{Config: DemoConfigYAML, PluginWasm: "/nonexistent.wasm", FailurePolicy: "FAIL_SOMETIMES"},
			Exited, "FAIL_SOMETIMES"},
		{"listener port taken", Options{Config: PlainConfigYAML, ListenerPort: heldPort},
			Exited, "Address already in use"},
		{"not ready in time", Options{Config: PlainConfigYAML, StartTimeout: time.Nanosecond},
			NeverReady, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.UpstreamPort = 9 // discard; never connected
			f := ExpectStartFailure(t, tt.opts)
			if f.Outcome != tt.want || (f.Outcome == Exited && f.ExitCode != 1) || !strings.Contains(f.Log, tt.wantLog) {
				t.Fatalf("ExpectStartFailure() = %v; want %v (code 1), log containing %q\n%s",
					f, tt.want, tt.wantLog, tail(f.Log, 20))
			}
			t.Logf("%v", f)
		})
	}
}

// TestDemoConfigWasm proves DemoConfigYAML against the real plugin: the
// configuration, quotes and all, reaches it and requests pass.
func TestDemoConfigWasm(t *testing.T) {
	EnvoyBin(t)
	u := StartUpstream(t, UpstreamOptions{})
	e := Start(t, Options{
		Config:     DemoConfigYAML,
		PluginWasm: PluginWasm(t),
		PluginConfig: `{"rules":[{"name":"r","body":"quoted \" and: colon # hash {{x}}",` +
			`"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1000,"burst":1000}}]}`,
		UpstreamPort: u.Port(),
		ServicePort:  u.Port(),
		Concurrency:  2,
	})
	c := e.Client()
	defer c.Close()
	if r := c.Get("/", nil); r.Err != nil || r.Status != 200 {
		t.Fatalf("GET / through the plugin = %v, want 200", r)
	}
	if got := e.Stat("wasm.envoy.wasm.runtime.v8.active"); got == 0 {
		t.Errorf("no active V8 Wasm VM")
	}
	if got := e.Stat("cluster_manager.active_clusters"); got != 2 {
		t.Errorf("active clusters = %d, want 2 (upstream, limit_service)", got)
	}
	t.Logf("RSS with the plugin (2 workers): %.1f MiB", float64(e.RSS())/(1<<20))
}

// TestDemoConfigWasmRejected shows how Envoy 1.40 refuses a plugin
// configuration that the plugin rejects in OnPluginStart: on a static
// listener the process exits with code 1, whatever the failure_policy.
func TestDemoConfigWasmRejected(t *testing.T) {
	EnvoyBin(t)
	wasm := PluginWasm(t)
	for _, policy := range []string{"FAIL_CLOSED", "FAIL_OPEN"} {
		t.Run(policy, func(t *testing.T) {
			f := ExpectStartFailure(t, Options{
				Config:        DemoConfigYAML,
				PluginWasm:    wasm,
				PluginConfig:  `{"no_such_field":1}`,
				FailurePolicy: policy,
				UpstreamPort:  9,
				Concurrency:   1,
			})
			if f.Outcome != Exited || f.ExitCode != 1 || !strings.Contains(f.Log, "Unable to create Wasm plugin") {
				t.Fatalf("ExpectStartFailure() = %v, want exit code 1 and \"Unable to create Wasm plugin\"\n%s",
					f, tail(f.Log, 20))
			}
			t.Logf("%v", f)
		})
	}
}

func BenchmarkEnvoyPlainRequest(b *testing.B) {
	EnvoyBin(b)
	u := StartUpstream(b, UpstreamOptions{})
	e := Start(b, Options{Config: PlainConfigYAML, UpstreamPort: u.Port(), Concurrency: 2})
	c := e.Client()
	defer c.Close()
	req := c.NewRequest(http.MethodGet, "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		if r := c.DoRequest(req); r.Status != 200 {
			b.Fatalf("GET / = %v", r)
		}
	}
}

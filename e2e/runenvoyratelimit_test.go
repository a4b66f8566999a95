// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// `make run-envoy-ratelimit` (examples/envoy-ratelimit/run.sh) is tested as
// TestRunCluster tests `make run-cluster`: the script itself, on its fixed
// ports moved by PORT_OFFSET, with a real redis-server; the README's block "console
// run-envoy-ratelimit" is replayed against each service the script can run.
// The session is the same for all three: that is the drop-in.

// runEnvoyRatelimitPorts are the loopback ports run.sh and envoy.yaml fix:
// Redis, the service's HTTP and gRPC ports, envoyproxy/ratelimit's debug
// port, Envoy's listener, the demo upstream and Envoy's admin.
var runEnvoyRatelimitPorts = []int{6380, 8080, 8081, 6070, 10000, 10001, 9901}

var runEnvoyRatelimitBlockRE = regexp.MustCompile("(?m)^```console run-envoy-ratelimit[ \t]*$")

// TestRunEnvoyRatelimit starts run.sh once per SERVICE, waits until Envoy
// and the service are ready, replays the README session, and for limitd
// checks that its metrics counted the refusals per domain.
func TestRunEnvoyRatelimit(t *testing.T) {
	t.Parallel()
	envoyBin := envoytest.EnvoyBin(t)
	redistest.Require(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	needFile(t, filepath.Join(root, "build/bin/func-e"), "make setup")
	cmds := scriptSession(t, filepath.Join(root, "examples", "envoy-ratelimit", "README.md"), runEnvoyRatelimitBlockRE)
	ratelimitBin := os.Getenv("RATELIMIT_BIN")
	if ratelimitBin == "" {
		ratelimitBin = filepath.Join(root, "build", "ratelimit", "service_cmd")
	}
	for _, tc := range []struct {
		service, bin, hint, health, ready string
		fixedWindow                       bool
	}{
		{"limitd", filepath.Join(root, "build/limitd"), "make build-service", "http://127.0.0.1:8080/readyz", "ready", false},
		{"limitd-fixed", filepath.Join(root, "build/limitd"), "make build-service", "http://127.0.0.1:8080/readyz", "ready", true},
		{"envoyproxy", ratelimitBin, "make build-ratelimit", "http://127.0.0.1:8080/healthcheck", "OK", true},
	} {
		t.Run(tc.service, func(t *testing.T) {
			needFile(t, tc.bin, tc.hint)
			mp := ownFixedPorts(t, runEnvoyRatelimitPorts)
			logPath := filepath.Join(t.TempDir(), "run.log")
			logf, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer logf.Close()
			cmd := exec.Command(filepath.Join(root, "examples", "envoy-ratelimit", "run.sh"))
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "ENVOY_BIN="+envoyBin, "SERVICE="+tc.service, "RATELIMIT_BIN="+ratelimitBin, mp.env())
			cmd.Stdout, cmd.Stderr = logf, logf
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { stopScript(t, cmd.Process.Pid, exited, logPath, mp) })
			awaitReady(t, exited, logPath, mp, mp.url(tc.health), tc.ready)
			if tc.fixedWindow {
				// A fixed window restarts on the minute: a session across that
				// edge would see a's five requests come back.
				time.Sleep(clearOfMinuteEdge(time.Now()))
			}
			runSession(t, mp.route, cmds, 0)
			if !strings.HasPrefix(tc.service, "limitd") {
				return
			}
			code, body := httpGet(t, mp.url("http://127.0.0.1:8080/metrics"))
			if code != 200 {
				t.Fatalf("limitd /metrics: %d", code)
			}
			if got := metricSum(body, "limitd_rls_over_limit_total", `domain="example"`); got != 3 {
				t.Errorf("limitd_rls_over_limit_total{domain=\"example\"} sums to %v, want 3 (a's refusals):\n%s", got, body)
			}
		})
	}
}

// sessionSpan is how long the README's session may take: a fixed-window
// service must not cross a minute's edge within it.
const sessionSpan = 15 * time.Second

// clearOfMinuteEdge is how long to wait from now so that the next
// sessionSpan stays within one minute (0 when it already does).
func clearOfMinuteEdge(now time.Time) time.Duration {
	next := now.Truncate(time.Minute).Add(time.Minute)
	if next.Sub(now) >= sessionSpan {
		return 0
	}
	return next.Sub(now) + 100*time.Millisecond
}

// metricSum adds the values of the Prometheus series name whose labels
// contain label.
func metricSum(text, name, label string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok || !strings.Contains(labels, label) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			sum += v
		}
	}
	return sum
}

// TestClearOfMinuteEdge: no wait with the session's span left in the
// minute, else past the edge.
func TestClearOfMinuteEdge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 27, 7, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Duration
		want time.Duration
	}{
		{0, 0},
		{44 * time.Second, 0},
		{45 * time.Second, 0},
		{45*time.Second + time.Millisecond, 15*time.Second - time.Millisecond + 100*time.Millisecond},
		{59 * time.Second, time.Second + 100*time.Millisecond},
	} {
		if got := clearOfMinuteEdge(t0.Add(c.at)); got != c.want {
			t.Errorf("clearOfMinuteEdge(+%v) = %v, want %v", c.at, got, c.want)
		}
	}
}

// TestMetricSum reads the series with the label, and only those.
func TestMetricSum(t *testing.T) {
	t.Parallel()
	text := "# HELP x\nlimitd_rls_over_limit_total{domain=\"example\",descriptor=\"api_key\"} 2\n" +
		"limitd_rls_over_limit_total{domain=\"example\",descriptor=\"other\"} 1\n" +
		"limitd_rls_over_limit_total{domain=\"else\",descriptor=\"api_key\"} 7\n" +
		"limitd_rls_over_limit_total_other{domain=\"example\"} 9\n"
	if got := metricSum(text, "limitd_rls_over_limit_total", `domain="example"`); got != 3 {
		t.Errorf("got %v, want 3", got)
	}
}

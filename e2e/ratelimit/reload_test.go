// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoy"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// reloadYAML has a busy key (a) whose limit never changes, a key (b) whose
// limit the reload raises, and a probe whose limit says which version of
// the file is applied.
func reloadYAML(b, probe int) string {
	return fmt.Sprintf(`domain: reload
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10000}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: %d}
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: %d}
`, b, probe)
}

var reloadRateLimits = envoy.RateLimitsYAML(
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-a", "a")}},
	envoy.Descriptor{Actions: []envoy.Action{envoy.RequestHeaders("x-b", "b")}},
)

// traffic sends requests on key a through e from two goroutines, each
// pausing 5 ms between requests, until stop is closed or 3000 requests were
// sent, and counts them.
type traffic struct {
	sent, admitted, other atomic.Int64
	lastErr               atomic.Value
	wg                    sync.WaitGroup
}

func startTraffic(e *envoytest.Envoy, stop <-chan struct{}) *traffic {
	tr := &traffic{}
	for range 2 {
		tr.wg.Go(func() {
			c := e.Client()
			defer c.Close()
			for tr.sent.Add(1) <= 3000 {
				select {
				case <-stop:
					tr.sent.Add(-1)
					return
				default:
				}
				switch r := c.Get("/", map[string]string{"x-a": "busy"}); r.Status {
				case 200:
					tr.admitted.Add(1)
				default:
					tr.other.Add(1)
					tr.lastErr.Store(r.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
			tr.sent.Add(-1)
		})
	}
	return tr
}

// TestReloadUnderTraffic rewrites the configuration file while requests
// flow on a key whose limit does not change: no request fails, the new
// limit of the changed key applies, and the unchanged key's count goes on
// where it was (its bucket or window was kept).
func TestReloadUnderTraffic(t *testing.T) {
	t.Parallel()
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"reload.yaml": reloadYAML(5, 101)}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "reload", FailureModeDeny: true, RouteRateLimits: reloadRateLimits})
			c := e.Client()
			defer c.Close()
			var (
				before, after []seen
				tr            *traffic
				elapsed       time.Duration
				remainingA    int
				sentAtWrite   int64
				sentAtReload  int64
			)
			inOneWindow(t, []*redistest.Server{s.redis}, func() {
				before, after = nil, nil
				s.writeFile(t, "reload.yaml", reloadYAML(5, 101)) // again on a second attempt
				s.waitLimit(t, "reload", entries{"probe", "p"}, 101)
				start := time.Now()
				for range 3 {
					before = append(before, seenOf(c.Get("/", map[string]string{"x-b": "k"})))
				}
				stop := make(chan struct{})
				tr = startTraffic(e, stop)
				for tr.sent.Load() < 50 && time.Since(start) < waitTimeout {
					time.Sleep(10 * time.Millisecond)
				}
				s.writeFile(t, "reload.yaml", reloadYAML(8, 102))
				sentAtWrite = tr.sent.Load()
				s.waitLimit(t, "reload", entries{"probe", "p"}, 102)
				sentAtReload = tr.sent.Load()
				for range 9 {
					after = append(after, seenOf(c.Get("/", map[string]string{"x-b": "k"})))
				}
				for tr.sent.Load() < sentAtReload+50 && time.Since(start) < waitTimeout {
					time.Sleep(10 * time.Millisecond)
				}
				close(stop)
				tr.wg.Wait()
				last := seenOf(c.Get("/", map[string]string{"x-a": "busy"}))
				elapsed = time.Since(start)
				var err error
				if remainingA, err = strconv.Atoi(last.Remaining); err != nil || last.Status != 200 {
					t.Fatalf("key a after the traffic: %v", last)
				}
			})
			if sentAtWrite < 50 || tr.sent.Load() < sentAtReload+50 {
				t.Errorf("traffic: %d requests sent when the file was written, %d when it was applied, %d in all: want 50 before and 50 after", sentAtWrite, sentAtReload, tr.sent.Load())
			}
			if n := tr.other.Load(); n != 0 {
				t.Errorf("traffic on the unchanged key: %d of %d requests not admitted (last: %v)", n, tr.sent.Load(), tr.lastErr.Load())
			}
			// Key a: everything sent on it so far (the traffic and the last
			// request) came out of its 10000: nothing was reset.
			used := int(tr.admitted.Load()) + 1
			if f.window {
				if remainingA != 10000-used {
					t.Errorf("key a: remaining %d after %d requests, want %d: its window was not kept", remainingA, used, 10000-used)
				}
			} else if refill := int(elapsed.Seconds()*10000/3600) + 1; remainingA < 10000-used || remainingA > 10000-used+refill {
				t.Errorf("key a: remaining %d after %d requests in %v, want %d..%d: its bucket was not kept", remainingA, used, elapsed, 10000-used, 10000-used+refill)
			}
			t.Logf("%d requests on the unchanged key, %d sent while the file was being applied", tr.sent.Load(), sentAtReload-sentAtWrite)
			for i, g := range before {
				if g.Status != 200 || g.Limit != "5, 5;w=3600" || g.Remaining != strconv.Itoa(4-i) {
					t.Errorf("key b before the reload, request %d: %v, want 200 with %d of 5 left", i, g, 4-i)
				}
			}
			admitted := 0
			for i, g := range after {
				if g.Limit != "8, 8;w=3600" {
					t.Errorf("key b after the reload, request %d: %v, want the new limit \"8, 8;w=3600\"", i, g)
				}
				if g.Status == 200 {
					admitted++
				}
			}
			// A fixed window goes on counting b's window (its counter is
			// named without the limit): 5 of the new 8 are left. limitd's
			// token bucket of a changed limit is a new one: 8.
			want := 5
			if !f.window {
				want = 8
			}
			if admitted != want {
				t.Errorf("key b after the reload: %d of 9 admitted, want %d\n%v", admitted, want, after)
			}
		})
	}
}

// TestRefusedFile writes a file the services must refuse: each says so in
// its log, limitd naming the file, the line and the field, and the
// previous configuration keeps deciding.
func TestRefusedFile(t *testing.T) {
	t.Parallel()
	bad := `domain: reload
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 10000}
  - key: b
    rate_limit: {unit: fortnight, requests_per_unit: 5}
`
	for _, f := range flavours {
		t.Run(f.name, func(t *testing.T) {
			s := startService(t, f.kind, map[string]string{"reload.yaml": reloadYAML(5, 101)}, f.args...)
			e := startEnvoy(t, s, envoy.RateLimit{Domain: "reload", FailureModeDeny: true, RouteRateLimits: reloadRateLimits})
			s.writeFile(t, "reload.yaml", bad)
			var line string
			if f.kind == limitd {
				// The file and line of the bad unit, and its field.
				line = s.waitLog(t, "configuration refused", "reload.yaml:6:", "descriptors[1].rate_limit.unit", "fortnight")
			} else {
				line = s.waitLog(t, "Error loading new configuration", "reload.yaml", "fortnight")
			}
			t.Logf("%s refused the file: %s", f.name, line)
			// The old configuration still decides: the probe's limit is 101
			// and b's 5.
			s.waitLimit(t, "reload", entries{"probe", "p"}, 101)
			c := e.Client()
			defer c.Close()
			if g := seenOf(c.Get("/", map[string]string{"x-b": "k"})); g.Status != 200 || g.Limit != "5, 5;w=3600" {
				t.Errorf("key b after the refused file: %v, want 200 under the old limit of 5", g)
			}
		})
	}
}

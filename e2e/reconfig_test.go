package e2e

import (
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// Three versions of one configuration. Every rule applies to its own path,
// is keyed by x-user and refills 0.001 or 0.002 tokens a second (nothing
// that shows in a test), so RateLimit-Remaining counts what each bucket
// admitted.
//
// v1 → v2: "keep" is unchanged; "shrink" goes from burst 10 to 4 and "grow"
// from 3 to 20 (and both double their rate); "renamed-v1" becomes
// "renamed-v2"; "rekeyed" adds the method to its limit keys; "marker" is new.
// v2 → v3: only max_keys changes.
const (
	reconfigV1 = `{"rules": [
 {"name": "keep", "match": {"path": {"prefix": "/keep"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "shrink", "match": {"path": {"prefix": "/shrink"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 10}},
 {"name": "grow", "match": {"path": {"prefix": "/grow"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "renamed-v1", "match": {"path": {"prefix": "/rename"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "rekeyed", "match": {"path": {"prefix": "/rekey"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`

	reconfigV2 = `{"rules": [
 {"name": "marker", "match": {"path": {"prefix": "/marker"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
 {"name": "rekeyed", "match": {"path": {"prefix": "/rekey"}}, "limit_keys": ["header:x-user", "method"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "renamed-v2", "match": {"path": {"prefix": "/rename"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}},
 {"name": "grow", "match": {"path": {"prefix": "/grow"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.002, "burst": 20}},
 {"name": "shrink", "match": {"path": {"prefix": "/shrink"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.002, "burst": 4}},
 {"name": "keep", "match": {"path": {"prefix": "/keep"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`

	// reconfigV3 is reconfigV2 with max_keys 1000 instead of the default.
	reconfigV3 = `{"max_keys": 1000, "rules": [
 {"name": "marker3", "match": {"path": {"prefix": "/marker"}},
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1000, "burst": 1000}},
 {"name": "keep", "match": {"path": {"prefix": "/keep"}}, "limit_keys": ["header:x-user"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 3}}]}`
)

// reconfigEnv is an Envoy whose listener file (Options.LDS) the test rewrites.
type reconfigEnv struct {
	t       *testing.T
	e       *envoytest.Envoy
	version int
}

// write installs the listener file's next version, with pluginConfig.
func (r *reconfigEnv) write(pluginConfig string) {
	r.t.Helper()
	r.version++
	r.e.WriteLDS(strconv.Itoa(r.version), pluginConfig)
}

// update installs pluginConfig and waits until Envoy accepted it and the
// listener's new plugin answers: the marker rule (whose name only that
// configuration has) shows in RateLimit-Policy of /marker.
func (r *reconfigEnv) update(pluginConfig, marker string) {
	r.t.Helper()
	accepted := r.e.Stat("listener_manager.lds.update_success") + 1
	start := time.Now()
	r.write(pluginConfig)
	r.e.WaitStat("listener_manager.lds.update_success", accepted, 30*time.Second)
	r.e.WaitStat("listener_manager.total_listeners_warming", 0, 60*time.Second)
	if n := r.e.Stat("listener_manager.lds.update_rejected"); n != 0 {
		r.t.Fatalf("Envoy rejected a listener update (%d)\n%s", n, r.e.Log())
	}
	// Connections opened before the update stay with the old listener
	// configuration until they drain: each probe uses a new one.
	for {
		c := r.e.Client()
		res := c.Get("/marker", nil)
		c.Close()
		if rlOf(res).rule == marker {
			break
		}
		if time.Since(start) > 30*time.Second {
			r.t.Fatalf("the new configuration does not answer 30 s after the update: GET /marker: %v %v", res, res.Header)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Logf("configuration %d in effect %v after the rename (listeners updated in place: %d, modified: %d; Wasm VMs created so far: %d, active: %d)",
		r.version, time.Since(start).Round(time.Millisecond),
		r.e.Stat("listener_manager.listener_in_place_updated"), r.e.Stat("listener_manager.listener_modified"),
		r.e.Stat("wasm.envoy.wasm.runtime.v8.created"), r.e.Stat("wasm.envoy.wasm.runtime.v8.active"))
}

// TestReconfigure updates the plugin's configuration on a running Envoy
// through a file-based listener (LDS) and checks which buckets keep their
// state: those of rules whose name and limit keys are unchanged, continuing
// from their current tokens clamped to the new burst. A renamed or re-keyed
// rule starts afresh, and so does every rule when max_keys changes (it sets
// the number of shared-data groups, which is part of the keys' prefix).
func TestReconfigure(t *testing.T) {
	t.Parallel()
	forEachBuild(t, testReconfigure)
}

func testReconfigure(t *testing.T, build envoytest.Build) {
	t.Parallel()
	up := envoytest.StartUpstream(t, envoytest.UpstreamOptions{})
	r := &reconfigEnv{t: t, version: 1}
	r.e = envoytest.Start(t, envoytest.Options{Build: build, LDS: true, PluginConfig: reconfigV1, UpstreamPort: up.Port(), Concurrency: 2})
	r.e.WaitStat("listener_manager.total_listeners_active", 1, 60*time.Second)
	t.Logf("started: Wasm VMs created %d, active %d", r.e.Stat("wasm.envoy.wasm.runtime.v8.created"), r.e.Stat("wasm.envoy.wasm.runtime.v8.active"))

	user := func(u string) map[string]string { return map[string]string{"x-user": u} }
	ok := func(rule, remaining string) rl { return rl{200, rule, remaining, ""} }
	limited := func(rule string) rl { return rl{429, rule, "0", "token_bucket_exceeded"} }
	run := func(t *testing.T, steps []rlStep) {
		t.Helper()
		c := r.e.Client()
		defer c.Close()
		runSteps(t, c, steps)
	}

	// v1: spend tokens.
	run(t, []rlStep{
		{"/keep", user("u1"), ok("keep", "2")},
		{"/keep", user("u1"), ok("keep", "1")},
		{"/keep", user("u1"), ok("keep", "0")},
		{"/keep", user("u1"), limited("keep")},
		// u1 keeps 7 of 10 (more than v2's burst), u2 keeps 2 (less).
		{"/shrink", user("u1"), ok("shrink", "9")},
		{"/shrink", user("u1"), ok("shrink", "8")},
		{"/shrink", user("u1"), ok("shrink", "7")},
	})
	for i := 9; i >= 2; i-- {
		run(t, []rlStep{{"/shrink", user("u2"), ok("shrink", strconv.Itoa(i))}})
	}
	run(t, []rlStep{
		{"/grow", user("u1"), ok("grow", "2")}, // 2 of 3 left
		{"/rename", user("u1"), ok("renamed-v1", "2")},
		{"/rename", user("u1"), ok("renamed-v1", "1")},
		{"/rename", user("u1"), ok("renamed-v1", "0")},
		{"/rename", user("u1"), limited("renamed-v1")},
		{"/rekey", user("u1"), ok("rekeyed", "2")},
		{"/rekey", user("u1"), ok("rekeyed", "1")},
		{"/rekey", user("u1"), ok("rekeyed", "0")},
		{"/rekey", user("u1"), limited("rekeyed")},
	})
	if t.Failed() {
		t.FailNow()
	}

	r.update(reconfigV2, "marker")
	t.Run("unchanged rule keeps its state", func(t *testing.T) {
		run(t, []rlStep{
			{"/keep", user("u1"), limited("keep")}, // no new burst
			{"/keep", user("u3"), ok("keep", "2")}, // a new client gets one
		})
	})
	t.Run("smaller burst clamps the tokens", func(t *testing.T) {
		run(t, []rlStep{
			{"/shrink", user("u1"), ok("shrink", "3")}, // 7 clamped to 4, minus 1
			{"/shrink", user("u1"), ok("shrink", "2")},
			{"/shrink", user("u1"), ok("shrink", "1")},
			{"/shrink", user("u1"), ok("shrink", "0")},
			{"/shrink", user("u1"), limited("shrink")},
			{"/shrink", user("u2"), ok("shrink", "1")}, // 2 left, under the new burst: kept
			{"/shrink", user("u2"), ok("shrink", "0")},
			{"/shrink", user("u2"), limited("shrink")},
		})
	})
	t.Run("larger burst continues from the current tokens", func(t *testing.T) {
		run(t, []rlStep{
			{"/grow", user("u1"), ok("grow", "1")}, // from 2, not from 20
			{"/grow", user("u1"), ok("grow", "0")},
			{"/grow", user("u1"), limited("grow")},
			{"/grow", user("u4"), ok("grow", "19")},
		})
	})
	t.Run("renamed rule starts afresh", func(t *testing.T) {
		run(t, []rlStep{{"/rename", user("u1"), ok("renamed-v2", "2")}})
	})
	t.Run("rule with other limit keys starts afresh", func(t *testing.T) {
		run(t, []rlStep{{"/rekey", user("u1"), ok("rekeyed", "2")}})
	})

	r.update(reconfigV3, "marker3")
	t.Run("a new max_keys starts every bucket afresh", func(t *testing.T) {
		run(t, []rlStep{{"/keep", user("u1"), ok("keep", "2")}})
	})
}

package engine_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/fakehost"
)

// TestConfigurationRefused: a configuration the plugin refuses fails New
// with a *RefusalError whose text (the line the host logs) says why, the
// same as CheckConfiguration's; one it accepts starts.
func TestConfigurationRefused(t *testing.T) {
	for _, tc := range []struct {
		name, cfg, why string // why: in the refusal ("": accepted)
	}{
		{"burst below the rate", `{"rules": [{"name": "x", "limit_keys": ["header:k"], "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 10, "burst": 5}}]}`, "rules[0].algorithm_config.burst: must be >= tokens_per_second (10), got 5"},
		{"an unknown field", `{"no_such_field": 1}`, "no_such_field"},
		{"empty", ``, "invalid configuration"},
		{"truncated", `{"rules": [`, "invalid configuration"},
		{"two services for one call", `{"service": {"cluster": "limitd"}, "rules": [{"name": "a", "scope": "cluster", "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}, {"name": "b", "scope": "cluster",
		  "service": {"cluster": "limitd", "failure_mode": "deny"}, "algorithm": "token_bucket",
		  "algorithm_config": {"tokens_per_second": 1, "burst": 2}}]}`, "invalid configuration"},
		{"accepted", perKey, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := engine.New(fakehost.New(), []byte(tc.cfg), "", engine.Options{})
			check := engine.CheckConfiguration([]byte(tc.cfg))
			if tc.why == "" {
				if err != nil || check != nil || p.Rules() != 1 || p.MaxKeys() <= 0 {
					t.Fatalf("New: %v, CheckConfiguration: %v; want it accepted", err, check)
				}
				return
			}
			var re *engine.RefusalError
			if !errors.As(err, &re) || check == nil || err.Error() != check.Error() || !strings.Contains(err.Error(), tc.why) ||
				!strings.HasPrefix(err.Error(), engine.Name+": invalid configuration, refusing to start: ") || errors.Unwrap(err) == nil {
				t.Fatalf("New: %v, CheckConfiguration: %v; want the same *RefusalError saying %q", err, check, tc.why)
			}
		})
	}
}

// TestTickReportsMemory: each tick adds the change of the runtime's memory
// figures since the last report to the gauges, and the collections since
// then to gc_cycles.
func TestTickReportsMemory(t *testing.T) {
	h := fakehost.New()
	p := newPlugin(t, h, perKey)
	p.Tick(&runtime.MemStats{HeapAlloc: 1000, Sys: 5000, NumGC: 3})
	heap, sys, gc := h.Count("memory.heap_bytes"), h.Count("memory.sys_bytes"), h.Count("memory.gc_cycles")
	p.Tick(&runtime.MemStats{HeapAlloc: 1500, Sys: 4000, NumGC: 7})
	if d := [3]int64{h.Count("memory.heap_bytes") - heap, h.Count("memory.sys_bytes") - sys, h.Count("memory.gc_cycles") - gc}; d != [3]int64{500, -1000, 4} {
		t.Fatalf("heap, sys, gc changed by %v, want 500, -1000, 4", d)
	}
}

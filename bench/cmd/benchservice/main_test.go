package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// TestRunSmoke runs a tiny benchmark end to end and checks the table.
func TestRunSmoke(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil || !redistest.Installed() {
		ci.Skip(t, "redis-server, redis-cli and redis-benchmark are not installed")
	}
	var out strings.Builder
	cfg := config{duration: 300 * time.Millisecond, warmup: 50 * time.Millisecond, conc: 4, keys: 10, n: 2000, batchMax: 8, workers: 2, rounds: 1}
	if err := run(cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| redis-benchmark EVALSHA (ceiling) |", "| service → Redis, no batching |",
		"| service → Redis, batching |", "| store only (no HTTP) → Redis, batching |", "service throughput / EVALSHA ceiling: without batching"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

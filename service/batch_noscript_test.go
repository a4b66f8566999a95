// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package service

import (
	"slices"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// After Redis forgot its scripts (SCRIPT FLUSH, as a restart does), each
// batcher loads its own script again: a pipelined Count runs window.lua,
// not the decision script, and a pipelined decision still decides.
func TestBatchReloadsItsOwnScript(t *testing.T) {
	srv := redistest.Start(t)
	c := realClient(t, srv.Addr())
	rs := realStore(t, c, 64)
	count := func(step string, want uint64) {
		t.Helper()
		a, err := rs.Count(t.Context(), &CountRequest{Windows: []Window{{Key: "w:flush_1", Hits: 1, Expiry: 60}}})
		if err != nil || !slices.Equal(a.Counts, []uint64{want}) {
			t.Fatalf("%s: Count = %v, %v; want [%d]", step, a.Counts, err, want)
		}
	}
	count("before the flush", 1)
	if err := c.ScriptFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	count("after the flush", 2)
	count("once more", 3)
	if _, err := rs.Decide(t.Context(), one("after-flush", 1, 5, 1)); err != nil {
		t.Fatalf("a decision after the flush: %v", err)
	}
}

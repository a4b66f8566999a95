// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package nullwasm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/ratelimit-wasm/tokenbucket/internal/ci"
)

// TestGenerated compiles the .wat sources again: the committed .wasm must
// be what they say.
func TestGenerated(t *testing.T) {
	if _, err := exec.LookPath("wat2wasm"); err != nil {
		ci.Skip(t, "wat2wasm not installed (apt-get install wabt)")
	}
	for src, committed := range map[string][]byte{"null.wat": Module, "null-calls.wat": ModuleCalls} {
		out := filepath.Join(t.TempDir(), "m.wasm")
		if b, err := exec.Command("wat2wasm", src, "-o", out).CombinedOutput(); err != nil {
			t.Fatalf("wat2wasm %s: %v\n%s", src, err, b)
		}
		if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, committed) {
			t.Errorf("%s compiles to other bytes than the committed module (%v): run go generate ./cmd/bench/nullwasm", src, err)
		}
	}
}

// TestCallbacks runs a stream's callbacks in wazero: they continue, and
// ModuleCalls calls the host HostCalls times per request.
func TestCallbacks(t *testing.T) {
	for _, tt := range []struct {
		wasm  []byte
		calls int
	}{{Module, 0}, {ModuleCalls, HostCalls}} {
		ctx := context.Background()
		rt := wazero.NewRuntime(ctx)
		defer rt.Close(ctx)
		calls := 0
		_, err := rt.NewHostModuleBuilder("wasi_snapshot_preview1").NewFunctionBuilder().
			WithFunc(func(context.Context, uint32, uint64, uint32) uint32 { calls++; return 0 }).
			Export("clock_time_get").Instantiate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mod, err := rt.Instantiate(ctx, tt.wasm)
		if err != nil {
			t.Fatalf("instantiate: %v", err)
		}
		for _, c := range []struct {
			name       string
			args, want []uint64
		}{
			{"_initialize", nil, nil},
			{"proxy_on_context_create", []uint64{1, 0}, nil},
			{"proxy_on_vm_start", []uint64{1, 0}, []uint64{1}},
			{"proxy_on_configure", []uint64{1, 10}, []uint64{1}},
			{"proxy_on_request_headers", []uint64{2, 5, 1}, []uint64{0}},
			{"proxy_on_response_headers", []uint64{2, 3, 0}, []uint64{0}},
			{"proxy_on_delete", []uint64{2}, nil},
			{"proxy_on_memory_allocate", []uint64{100}, []uint64{1024}},
		} {
			got, err := mod.ExportedFunction(c.name).Call(ctx, c.args...)
			if err != nil || len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
				t.Errorf("%s(%v) = %v, %v; want %v", c.name, c.args, got, err, c.want)
			}
		}
		if calls != tt.calls {
			t.Errorf("%d host calls, want %d", calls, tt.calls)
		}
	}
}

// TestExportsLikePlugin checks that the no-op modules export what the
// built plugin exports.
func TestExportsLikePlugin(t *testing.T) {
	plugin, err := os.ReadFile(os.Getenv("PLUGIN_WASM"))
	if err != nil {
		ci.Skip(t, "PLUGIN_WASM: %v (run make build)", err)
	}
	if err := CheckLike(plugin); err != nil {
		t.Fatal(err)
	}
}

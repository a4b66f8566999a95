// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package nullwasm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// TestGenerated compiles the .wat sources again: the committed .wasm must
// be what they say.
func TestGenerated(t *testing.T) {
	if _, err := exec.LookPath("wat2wasm"); err != nil {
		ci.Skip(t, "wat2wasm not installed (apt-get install wabt)")
	}
	for src, committed := range map[string][]byte{"null.wat": Module, "null-calls.wat": ModuleCalls, "null-path.wat": ModulePath} {
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

// TestPathCalls runs ModulePath's callbacks in wazero against a host that
// records its calls: per request one header read, a shared-data read and a
// write of 128 bytes under the header's value with the CAS read (0 when the
// key is missing), one increment of the counter it defined, one clock read,
// and five response headers.
func TestPathCalls(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	var calls []string
	shared := map[string]uint32{} // key -> CAS
	var mod api.Module
	str := func(m api.Module, p, n uint32) string {
		b, _ := m.Memory().Read(p, n)
		return string(b)
	}
	// give hands v to the module through its allocator, as Envoy does.
	give := func(m api.Module, v string, ptrSlot, sizeSlot uint32) {
		res, err := mod.ExportedFunction("proxy_on_memory_allocate").Call(ctx, uint64(len(v)))
		if err != nil {
			t.Fatal(err)
		}
		p := uint32(res[0])
		m.Memory().Write(p, []byte(v))
		m.Memory().WriteUint32Le(ptrSlot, p)
		m.Memory().WriteUint32Le(sizeSlot, uint32(len(v)))
	}
	_, err := rt.NewHostModuleBuilder("env").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, mt, kp, ks, rp, rs uint32) uint32 {
		calls = append(calls, fmt.Sprintf("get_header %d %s", mt, str(m, kp, ks)))
		give(m, "k7", rp, rs)
		return 0
	}).Export("proxy_get_header_map_value").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, mt, kp, ks, vp, vs uint32) uint32 {
		calls = append(calls, fmt.Sprintf("add_header %d %s: %s", mt, str(m, kp, ks), str(m, vp, vs)))
		return 0
	}).Export("proxy_add_header_map_value").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, kp, ks, rp, rs, rc uint32) uint32 {
		k := str(m, kp, ks)
		calls = append(calls, "get_shared "+k)
		cas, ok := shared[k]
		if !ok {
			return 1 // NotFound
		}
		give(m, strings.Repeat("v", 128), rp, rs)
		m.Memory().WriteUint32Le(rc, cas)
		return 0
	}).Export("proxy_get_shared_data").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, kp, ks, vp, vs, cas uint32) uint32 {
		k := str(m, kp, ks)
		calls = append(calls, fmt.Sprintf("set_shared %s %d bytes cas %d", k, vs, cas))
		shared[k] = shared[k] + 1
		return 0
	}).Export("proxy_set_shared_data").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, typ, np, ns, rp uint32) uint32 {
		calls = append(calls, fmt.Sprintf("define_metric %d %s", typ, str(m, np, ns)))
		m.Memory().WriteUint32Le(rp, 42)
		return 0
	}).Export("proxy_define_metric").
		NewFunctionBuilder().WithFunc(func(_ context.Context, id uint32, by uint64) uint32 {
		calls = append(calls, fmt.Sprintf("increment_metric %d %d", id, by))
		return 0
	}).Export("proxy_increment_metric").
		NewFunctionBuilder().WithFunc(func(_ context.Context, m api.Module, rp uint32) uint32 {
		calls = append(calls, "now")
		m.Memory().WriteUint64Le(rp, 1)
		return 0
	}).Export("proxy_get_current_time_nanoseconds").
		Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mod, err = rt.Instantiate(ctx, ModulePath); err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	call := func(name string, args ...uint64) {
		if _, err := mod.ExportedFunction(name).Call(ctx, args...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	call("_initialize")
	call("proxy_on_context_create", 1, 0)
	call("proxy_on_vm_start", 1, 0)
	call("proxy_on_configure", 1, 0)
	headers := []string{
		`add_header 2 ratelimit-policy: "per-key";q=1000000000;w=1`,
		`add_header 2 ratelimit: "per-key";r=999999999;t=0`,
		`add_header 2 ratelimit-limit: 1000000000`,
		`add_header 2 ratelimit-remaining: 999999999`,
		`add_header 2 ratelimit-reset: 0`,
	}
	want := []string{"define_metric 0 bench_path"}
	for req, cas := range []int{0, 1} { // the key is missing, then written once
		id := uint64(2 + req)
		call("proxy_on_context_create", id, 1)
		call("proxy_on_request_headers", id, 5, 1)
		call("proxy_on_response_headers", id, 3, 0)
		call("proxy_on_delete", id)
		want = append(want, "get_header 0 x-api-key", "get_shared k7", fmt.Sprintf("set_shared k7 128 bytes cas %d", cas),
			"increment_metric 42 1", "now")
		want = append(want, headers...)
	}
	if !slices.Equal(calls, want) {
		t.Errorf("host calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
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

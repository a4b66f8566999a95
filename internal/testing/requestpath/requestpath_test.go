package requestpath_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/requestpath"
	"github.com/ratelimit-wasm/tokenbucket/plugin"
)

// OneRule is the configuration of the measured request: one local rule
// keyed by a header.
const OneRule = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}]}`

// OneToken is the configuration of the measured refused request: the
// same rule with a burst of one, which the key's first request spends.
const OneToken = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}]}`

// wasmRequest starts the plugin under the SDK's emulator on cfg, sends a
// key's first request, and returns the second one's context and headers.
func wasmRequest(t *testing.T, cfg string) (proxytest.HostEmulator, uint32, [][2]string) {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().WithVMContext(plugin.NewVMContext()).
		WithPluginConfiguration([]byte(cfg)))
	t.Cleanup(reset)
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin = %v: %v", st, host.GetCriticalLogs())
	}
	headers := [][2]string{{":path", "/"}, {"x-api-key", "a"}}
	host.CallOnRequestHeaders(host.InitializeHttpContext(), headers, false) // the key's first request
	return host, host.InitializeHttpContext(), headers
}

// TestRequestPathWasm: what one allowed request runs through in the Wasm
// plugin (a key's second), from OnHttpRequestHeaders to its Continue (the
// native module's is native/filter's TestRequestPathNative).
func TestRequestPathWasm(t *testing.T) {
	host, id, headers := wasmRequest(t, OneRule)
	p := requestpath.Measure(t, func() {
		if a := host.CallOnRequestHeaders(id, headers, false); a != types.ActionContinue {
			t.Errorf("the request was not allowed: %v", a)
		}
	})
	t.Logf("one allowed request on the Wasm plugin: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 16, Calls: 14, Hops: 6})
}

// TestRequestPathWasmRefused: what one refused request runs through in
// the Wasm plugin (a key's second, its one token spent), from
// OnHttpRequestHeaders to its local reply, a 429.
func TestRequestPathWasmRefused(t *testing.T) {
	host, id, headers := wasmRequest(t, OneToken)
	p := requestpath.Measure(t, func() {
		host.CallOnRequestHeaders(id, headers, false)
		if r := host.GetSentLocalResponse(id); r == nil || r.StatusCode != 429 {
			t.Errorf("the request was not refused: local reply %+v", r)
		}
	})
	t.Logf("one refused request on the Wasm plugin: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 19, Calls: 13, Hops: 6})
}

// TestRequestPathWasmWhole: the same request from its request headers to
// its end: its response's headers (the rate-limit headers added) and its
// context's completion.
func TestRequestPathWasmWhole(t *testing.T) {
	host, id, headers := wasmRequest(t, OneRule)
	p := requestpath.Measure(t, func() {
		if a := host.CallOnRequestHeaders(id, headers, false); a != types.ActionContinue {
			t.Errorf("the request was not allowed: %v", a)
		}
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		host.CompleteHttpContext(id)
	})
	t.Logf("one allowed request on the Wasm plugin, to its end: %v", p)
	p.Within(t, requestpath.Ceiling{Files: 19, Calls: 17, Hops: 6})
}

// reported keeps what Within reports instead of failing the test.
type reported struct {
	testing.TB
	got []string
}

func (e *reported) Errorf(format string, args ...any) {
	e.got = append(e.got, fmt.Sprintf(format, args...))
}

// TestCeilingOneBelowFails: a path one file and one call above its
// ceiling fails, with a message that names what grew, by how much, and
// the file and line where the ceiling lives; a path at its ceiling passes.
func TestCeilingOneBelowFails(t *testing.T) {
	p := requestpath.Path{Files: []string{"engine/a.go", "engine/b.go"}, Calls: []string{"plugin/p.go:1 -> engine.New"}, Hops: []string{"plugin -> engine"}}
	at := &reported{TB: t}
	p.Within(at, requestpath.Ceiling{Files: 2, Calls: 1, Hops: 1})
	if len(at.got) != 0 {
		t.Fatalf("at its ceiling: %q", at.got)
	}
	below := &reported{TB: t}
	_, file, line, _ := runtime.Caller(0)
	p.Within(below, requestpath.Ceiling{Files: 1, Calls: 0, Hops: 1})
	where := "internal/testing/requestpath/" + filepath.Base(file) + ":" + strconv.Itoa(line+1)
	if len(below.got) != 2 || !strings.HasPrefix(below.got[0], "the request path's files grew from 1 to 2 (ceiling at "+where+")") ||
		!strings.HasPrefix(below.got[1], "the request path's cross-package calls grew from 0 to 1 (ceiling at "+where+")") {
		t.Fatalf("one below: %q; want files and calls, each with its ceiling at %s", below.got, where)
	}
}

package hostcontract_test

import (
	"bytes"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/hostcontract"
)

// TestContractWasm runs the host contract on the Wasm adapter (package
// plugin) compiled into a guest module (testdata/wasmguest, the tag
// hostcontract: the adapter runs the Driver where it runs the engine) in
// a real Envoy with two workers.
func TestContractWasm(t *testing.T) {
	envoytest.Needs(t, false)
	wasm := filepath.Join(t.TempDir(), "hostcontract.wasm")
	build(t, []string{"GOOS=wasip1", "GOARCH=wasm"}, wasm, "./internal/testing/hostcontract/testdata/wasmguest")
	runOnEnvoy(t, envoytest.Options{PluginWasm: wasm})
}

// TestContractNative runs the host contract on the native adapter (package
// native/filter) compiled into a dynamic module (testdata/nativemodule, the
// tag hostcontract) in a real Envoy with two workers.
func TestContractNative(t *testing.T) {
	envoytest.Needs(t, false)
	so := filepath.Join(t.TempDir(), "libhostcontract.so")
	build(t, []string{"CGO_ENABLED=1"}, so, "./internal/testing/hostcontract/testdata/nativemodule")
	runOnEnvoy(t, envoytest.Options{Build: envoytest.Native, NativeModule: so})
}

// engineConfig is the filter's configuration: the Driver ignores it, but
// the native adapter checks it with the engine first, as always.
const engineConfig = `{"rules": [{"name": "contract", "limit_keys": ["header:x-contract-none"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}},
 {"name": "contract-body", "limit_keys": ["request_json:x-contract-none"],
  "algorithm": "token_bucket", "algorithm_config": {"tokens_per_second": 1, "burst": 1}}]}`

// runOnEnvoy starts Envoy with opts' build of the adapter before the
// cluster hostcontract.UpstreamCluster, served by hostcontract.Upstream,
// and runs the suite through it.
func runOnEnvoy(t *testing.T, opts envoytest.Options) {
	up := httptest.NewServer(hostcontract.NewUpstream())
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	opts.UpstreamPort, _ = strconv.Atoi(u.Port())
	opts.PluginConfig = engineConfig
	opts.Concurrency = 2
	opts.StartTimeout = 5 * time.Minute // V8 compiles the guest (7 MB) before the listener is up
	e := envoytest.Start(t, opts)
	c := e.Client()
	t.Cleanup(c.Close)
	hostcontract.Run(t, envoyTarget{c})
}

// envoyTarget sends the suite's requests to Envoy; the host's clock is
// this process's (one machine).
type envoyTarget struct{ c *envoytest.Client }

func (e envoyTarget) Do(path string, header map[string]string) (hostcontract.Outcome, error) {
	sent := time.Now().UnixNano()
	var r envoytest.Result
	if n, err := strconv.Atoi(header[hostcontract.HeaderBodyBytes]); err == nil {
		req := e.c.NewRequest("POST", path, header)
		body := hostcontract.Body(n)
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r = e.c.DoRequest(req)
	} else {
		r = e.c.Get(path, header)
	}
	if r.Err != nil {
		return hostcontract.Outcome{}, r.Err
	}
	return hostcontract.Outcome{Status: r.Status, Header: r.Header, Body: string(r.Body), Sent: sent, Received: time.Now().UnixNano()}, nil
}

// build builds the program pkg (relative to the repository's root) with
// the tag hostcontract into out, as the Makefile builds the adapters
// (-buildmode=c-shared). The go command's cache makes a rebuild cheap.
func build(t *testing.T, env []string, out, pkg string) {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-tags", "hostcontract", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, strings.TrimSpace(string(b)))
	}
}

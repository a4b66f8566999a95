package bodycost

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bench/cmd/bench/nullwasm"
	"github.com/ratelimit-wasm/tokenbucket/bench/internal/loadgen"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
)

// TestBodyCallbackCost measures what the response body callback costs a
// configuration without response_json rules, in Envoy CPU: the plugin as
// built (which exports proxy_on_response_body) against the same module with
// that export renamed (Envoy then skips the callback), both with a per-key
// rule, behind one upstream. For scale, the same pair of the benchmark's
// no-op module (package nullwasm): the floor, what any module that reads
// bodies pays for Envoy calling into it. One callback is far below this
// machine's noise per request (tens of µs), so the upstream speaks HTTP/2
// and sends each body as bodyFrames DATA frames: Envoy calls the body
// callback once per frame and once at the end, and the difference per
// request divided by bodyFrames+1 is the cost of one callback (a response
// read at once costs one or two). Rounds rotate the Envoys, each at
// --concurrency 1 under the same closed-loop load; the result is the median
// of the per-round differences. It runs only with BODY_COST=1 (make
// bench-body): it takes a few minutes and wants a quiet machine.
func TestBodyCallbackCost(t *testing.T) {
	if os.Getenv("BODY_COST") == "" {
		t.Skip("set BODY_COST=1 (make bench-body) to measure the body callback")
	}
	envoytest.Needs(t, true)
	plugin, err := os.ReadFile(envoytest.PluginWasm(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	modules := map[string][]byte{"plugin": plugin, "no-op": nullwasm.Module}
	paths := map[string]string{}
	for name, m := range modules {
		paths[name] = filepath.Join(dir, name+".wasm")
		paths[name+" without"] = filepath.Join(dir, name+"-nobody.wasm")
		// Renamed (same length, so the module stays valid), the export is
		// one Envoy does not know: it skips the callback.
		without, err := renameExport(m, bodyExport, unknownExport)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := os.WriteFile(paths[name], m, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(paths[name+" without"], without, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rounds, _ := strconv.Atoi(os.Getenv("BODY_COST_ROUNDS"))
	if rounds <= 0 {
		rounds = 8
	}
	const perKey = `{"rules": [{"name": "per-key", "limit_keys": ["header:x-api-key"], "algorithm": "token_bucket",
	  "algorithm_config": {"tokens_per_second": 1000000000, "burst": 1000000000}}]}`
	port := startFramedUpstream(t)
	h2 := strings.ReplaceAll(envoytest.DemoConfigYAML, "explicit_http_config: {http_protocol_options: {}}",
		"explicit_http_config: {http2_protocol_options: {}}")
	if h2 == envoytest.DemoConfigYAML {
		t.Fatal("the bootstrap no longer sets the upstream's protocol where this test expects it")
	}
	names := []string{"plugin", "plugin without", "no-op", "no-op without"}
	envoys := map[string]*envoytest.Envoy{}
	for _, name := range names {
		envoys[name] = envoytest.Start(t, envoytest.Options{Config: h2, PluginConfig: perKey,
			PluginWasm: paths[name], UpstreamPort: port, Concurrency: 1, LogLevel: "warn"})
	}
	reqs := make([][]byte, 100)
	for i := range reqs {
		reqs[i] = loadgen.Request("GET", "/body", "Host: bench", "x-api-key: k"+strconv.Itoa(i))
	}
	const conns, window = 8, 3 * time.Second
	run := func(e *envoytest.Envoy) float64 { // µs of Envoy CPU per request
		addr := strings.TrimPrefix(e.URL(""), "http://")
		warm := time.Now().Add(300 * time.Millisecond)
		do, closeAll := loadgen.HTTP(addr, conns, warm, loadgen.Cycle(reqs, conns))
		loadgen.Closed(do, make([]loadgen.Counts, conns), time.Time{}, warm, nil)
		closeAll()
		cpu0 := processCPU(t, e.PID())
		end := time.Now().Add(window)
		do, closeAll = loadgen.HTTP(addr, conns, end, loadgen.Cycle(reqs, conns))
		cs := make([]loadgen.Counts, conns)
		loadgen.Closed(do, cs, time.Time{}, end, nil)
		closeAll()
		cpu := processCPU(t, e.PID()) - cpu0
		tally := loadgen.Sum(cs)
		if tally.OK == 0 || tally.Other > 0 {
			t.Fatalf("load: %+v", tally)
		}
		return cpu / float64(tally.Total()) * 1e6
	}
	const callbacks = bodyFrames + 1 // the frames, then the end of the stream
	diffs := map[string][]float64{}
	var lines []string
	for r := 0; r < rounds; r++ {
		got := map[string]float64{}
		for i := range names {
			name := names[(i+r)%len(names)]
			got[name] = run(envoys[name])
		}
		line := fmt.Sprintf("round %d:", r+1)
		for _, m := range []string{"plugin", "no-op"} {
			d := (got[m] - got[m+" without"]) / callbacks
			diffs[m] = append(diffs[m], d)
			line += fmt.Sprintf(" %s %.0f/%.0f µs per request (%+.3f µs a callback);", m, got[m], got[m+" without"], d)
		}
		lines = append(lines, line)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	summary := ""
	for _, m := range []string{"plugin", "no-op"} {
		d := diffs[m]
		slices.Sort(d)
		summary += fmt.Sprintf("\n%s: a body callback costs %+.3f µs of Envoy CPU (median; rounds %+.3f … %+.3f)",
			m, (d[(len(d)-1)/2]+d[len(d)/2])/2, d[0], d[len(d)-1])
	}
	t.Logf("Envoy CPU per request with and without the body callback, %d DATA frames per response, --concurrency 1, "+
		"%d connections, %v windows:\n%s%s\nload average %s",
		bodyFrames, conns, window, strings.Join(lines, "\n"), summary, strings.TrimSpace(string(load)))
}

// bodyExport is the body callback's export; unknownExport, of the same
// length, is a name Envoy does not call.
const (
	bodyExport    = "proxy_on_response_body"
	unknownExport = "unset_on_response_body"
)

// bodyFrames is how many HTTP/2 DATA frames the measurement's upstream
// sends per response body.
const bodyFrames = 256

// startFramedUpstream serves cleartext HTTP/2 on a loopback port: every
// answer is 200 with a body of bodyFrames DATA frames of 8 bytes (one
// flush each). It returns the port.
func startFramedUpstream(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protocols, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := w.(http.Flusher)
		w.Header().Set("Content-Length", strconv.Itoa(8*bodyFrames)) // the load generator reads no chunked bodies
		w.WriteHeader(200)
		for i := 0; i < bodyFrames; i++ {
			_, _ = w.Write([]byte("0123456\n"))
			if f != nil {
				f.Flush()
			}
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// processCPU is the user + system CPU seconds of process pid so far (all its
// threads), from /proc/<pid>/stat in clock ticks of 10 ms.
func processCPU(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The command may hold spaces: fields count from after its ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return (utime + stime) / 100
}

// renameExport returns a copy of the Wasm module m whose export from is
// named to instead (a name of the same length, so no size changes).
func renameExport(m []byte, from, to string) ([]byte, error) {
	if len(from) != len(to) || len(m) < 8 {
		return nil, fmt.Errorf("renameExport: want names of one length and a module")
	}
	uleb := func(b []byte) (v, n int) {
		for shift := 0; n < len(b); shift += 7 {
			c := b[n]
			n++
			v |= int(c&0x7f) << shift
			if c < 0x80 {
				return v, n
			}
		}
		return -1, 0
	}
	out := bytes.Clone(m)
	for i := 8; i < len(out); {
		id := out[i]
		size, n := uleb(out[i+1:])
		if n == 0 || i+1+n+size > len(out) {
			return nil, fmt.Errorf("renameExport: malformed section at %d", i)
		}
		payload := out[i+1+n : i+1+n+size]
		if id == 7 { // the export section
			if j := bytes.Index(payload, []byte(from)); j > 0 && int(payload[j-1]) == len(from) && bytes.Count(payload, []byte(from)) == 1 {
				copy(payload[j:], to)
				return out, nil
			}
			return nil, fmt.Errorf("renameExport: no export %q", from)
		}
		i += 1 + n + size
	}
	return nil, fmt.Errorf("renameExport: no export section")
}

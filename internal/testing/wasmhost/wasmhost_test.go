// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/ci"
)

// The tests run the guest in testdata/guest, built for wasip1 the way the
// Makefile builds the plugin. Without a toolchain they skip, unless CI=true.
var guest struct {
	once sync.Once
	wasm []byte
	err  error
}

func guestWasm(t testing.TB) []byte {
	t.Helper()
	guest.once.Do(func() { guest.wasm, guest.err = buildGuest() })
	if guest.err != nil {
		ci.Skip(t, "building the test guest: %v", guest.err)
	}
	return guest.wasm
}

// buildGuest builds testdata/guest into build/testguest.wasm. The go
// command's cache makes a rebuild cheap, so it always rebuilds rather than
// trusting a file that may be stale.
func buildGuest() ([]byte, error) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		return nil, err
	}
	return BuildModule(root, "./internal/testing/wasmhost/testdata/guest", "testguest.wasm")
}

// newHost returns a host for the guest; its log is printed if the test fails.
func newHost(t testing.TB, opts ...Option) *Host {
	t.Helper()
	h, err := NewHost(context.Background(), guestWasm(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs := h.Logs()
			if len(logs) > 200 {
				logs = logs[len(logs)-200:]
			}
			for _, e := range logs {
				t.Logf("guest log: worker %d %s: %s", e.VM, e.Level, e.Message)
			}
		}
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func newVM(t testing.TB, h *Host, config string) *VM {
	t.Helper()
	vm, err := h.NewVM([]byte(config), "guest")
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

func get(path string, extra ...string) Request {
	r := Request{Headers: Headers{{":method", "GET"}, {":path", path}, {":authority", "example.com"}, {":scheme", "http"}}}
	for i := 0; i+1 < len(extra); i += 2 {
		r.Headers = append(r.Headers, [2]string{extra[i], extra[i+1]})
	}
	return r
}

func do(t testing.TB, vm *VM, req Request) Response {
	t.Helper()
	resp, err := vm.HTTP(req)
	if err != nil {
		t.Fatalf("HTTP %s: %v", req.Headers.Get(":path"), err)
	}
	return resp
}

func noErrorLogs(t *testing.T, h *Host) {
	t.Helper()
	for _, e := range h.LogsAtLeast(LogError) {
		t.Errorf("guest logged at %s: %s", e.Level, e.Message)
	}
}

func hasLog(h *Host, substr string) bool {
	for _, e := range h.Logs() {
		if strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

func TestStartConfigureTick(t *testing.T) {
	h := newHost(t, WithVMConfiguration([]byte("vmcfg")))
	vm := newVM(t, h, "alpha")
	root := vm.RootContextID()
	if !hasLog(h, fmt.Sprintf(`configured root=%d config="alpha" vm_config="vmcfg"`, root)) {
		t.Errorf("no configuration log; logs: %v", h.Logs())
	}
	if got := vm.TickPeriod(); got != time.Second {
		t.Errorf("TickPeriod = %v, want 1s", got)
	}
	if err := vm.Tick(); err != nil {
		t.Fatal(err)
	}
	if !hasLog(h, fmt.Sprintf("tick root=%d", root)) {
		t.Error("no tick log")
	}
	noErrorLogs(t, h)
}

// TestSharedQueue: the last registration of a name takes the queue; an
// enqueue runs proxy_on_queue_ready for that VM's root context once the
// callbacks of its current step have returned, or at its next step when
// another VM enqueued.
func TestSharedQueue(t *testing.T) {
	h := newHost(t)
	a, b := newVM(t, h, "a"), newVM(t, h, "b") // b registers last
	enqueue := func(vm *VM, item string) {
		t.Helper()
		r, err := vm.HTTP(Request{Headers: Headers{{":method", "GET"}, {":path", "/enqueue"}, {":authority", "x"}, {"x-item", item}}})
		if err != nil || r.Status != 200 {
			t.Fatalf("enqueue %s: %d, %v", item, r.Status, err)
		}
	}
	dequeued := func() []LogEntry {
		var out []LogEntry
		for _, e := range h.Logs() {
			if strings.Contains(e.Message, "dequeued") {
				out = append(out, e)
			}
		}
		return out
	}
	enqueue(a, "one")
	if d := dequeued(); len(d) != 0 {
		t.Fatalf("dequeued in a's step: %v; want it posted to b", d)
	}
	if n, _ := h.QueueLen("guest.q"); n != 1 {
		t.Fatalf("queue length %d, want 1", n)
	}
	if err := b.Tick(); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("guest: dequeued root=%d items=[one]", b.RootContextID())
	if d := dequeued(); len(d) != 1 || d[0].VM != 2 || d[0].Message != want {
		t.Fatalf("after b's tick: %v; want b's %q", d, want)
	}
	enqueue(b, "two")
	logs := h.Logs()
	done, ready := -1, -1
	for i, e := range logs {
		switch {
		case strings.Contains(e.Message, "done /enqueue") && e.VM == 2:
			done = i
		case strings.Contains(e.Message, "items=[two]"):
			ready = i
		}
	}
	if done < 0 || ready < done {
		t.Fatalf("stream done at log %d, queue ready at %d: want the queue's callback after the step's", done, ready)
	}
	if n, ok := h.QueueLen("guest.q"); !ok || n != 0 {
		t.Fatalf("queue length %d (registered %v), want 0", n, ok)
	}
	noErrorLogs(t, h)
}

func TestConfigureFails(t *testing.T) {
	h := newHost(t)
	_, err := h.NewVM([]byte("fail"), "guest")
	if err == nil || !strings.Contains(err.Error(), "proxy_on_configure returned false; guest log: critical: guest: configuration rejected") {
		t.Fatalf("NewVM(fail) error = %v, want proxy_on_configure returned false and the guest's reason", err)
	}
	if len(h.LogsAtLeast(LogCritical)) != 1 {
		t.Errorf("critical logs = %v, want 1", h.LogsAtLeast(LogCritical))
	}
}

func TestHeadersAndProperties(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")
	req := get("/echo", "X-Forwarded-For", "203.0.113.7", "x-replace", "old", "x-replace", "older", "x-remove", "gone")
	req.SourceAddress = "10.1.2.3:4567"
	req.Properties = map[string][]byte{PropertyPath("metadata", "filter_metadata", "guest", "tier"): []byte("gold")}
	req.UpstreamHeaders = Headers{{":status", "201"}, {"server", "upstream"}, {"x-upstream-secret", "s"}}
	resp := do(t, vm, req)

	want := map[string]string{
		"x-guest-source": "10.1.2.3:4567",
		"x-guest-tier":   "gold",
		"x-guest-xff":    "203.0.113.7",
		"x-guest-path":   "/echo",
		"x-guest-count":  "8",
		"x-replace":      "new",
	}
	for k, v := range want {
		if got := resp.Forwarded.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("forwarded %s = %q, want [%q]", k, got, v)
		}
	}
	if _, ok := resp.Forwarded.Lookup("x-remove"); ok {
		t.Error("x-remove was forwarded")
	}
	if resp.Status != 201 || resp.Paused || resp.LocalReply != nil {
		t.Errorf("response = %+v, want 201 from upstream", resp)
	}
	if got := resp.Headers.Get("server"); got != "guest" {
		t.Errorf("server = %q, want guest", got)
	}
	if _, ok := resp.Headers.Lookup("x-upstream-secret"); ok {
		t.Error("x-upstream-secret was not removed")
	}
	if got := resp.Headers.Values("x-guest-resp"); len(got) != 1 || got[0] != "/echo" {
		t.Errorf("x-guest-resp = %q", got)
	}
	noErrorLogs(t, h)
}

func TestLocalReply(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")
	resp := do(t, vm, get("/deny"))
	if resp.Status != 429 || string(resp.Body) != "denied" || resp.Forwarded != nil || resp.Paused {
		t.Fatalf("response = %+v, want a 429 local reply", resp)
	}
	if resp.LocalReply == nil || resp.LocalReply.Status != 429 || resp.LocalReply.GRPCStatus != -1 {
		t.Errorf("LocalReply = %+v", resp.LocalReply)
	}
	want := Headers{
		{":status", "429"}, {"x-deny", "1"}, {"retry-after", "3"},
		{"content-length", "6"}, {"content-type", "text/plain"},
		{"x-guest-resp", "/deny"}, // added once, by the plugin's response path
	}
	if fmt.Sprint(resp.Headers) != fmt.Sprint(want) {
		t.Errorf("headers = %v\nwant      %v", resp.Headers, want)
	}
	if n, _ := h.Metric("guest.denied"); n != 1 {
		t.Errorf("guest.denied = %d, want 1", n)
	}
	noErrorLogs(t, h)
}

func TestSharedDataSemantics(t *testing.T) {
	h := &Host{shared: make(map[string]sharedEntry), nextCAS: 1}
	steps := []struct {
		key     string
		cas     uint32
		want    Status
		wantCAS uint32 // CAS of key afterwards
	}{
		{"a", 0, StatusOK, 1},          // create
		{"b", 12345, StatusOK, 2},      // create ignores the CAS
		{"a", 0, StatusOK, 3},          // cas 0 always wins
		{"a", 1, StatusCasMismatch, 3}, // stale
		{"a", 3, StatusOK, 4},          // current
		{"b", 4, StatusCasMismatch, 2}, // another key's CAS
		{"b", 2, StatusOK, 5},          // the counter is process-wide
		{"a", 0xFFFFFFFF, StatusCasMismatch, 4},
	}
	for i, s := range steps {
		if got := h.SetSharedData(s.key, []byte{byte(i)}, s.cas); got != s.want {
			t.Errorf("step %d: SetSharedData(%q, cas %d) = %v, want %v", i, s.key, s.cas, got, s.want)
		}
		if _, cas, _ := h.GetSharedData(s.key); cas != s.wantCAS {
			t.Errorf("step %d: CAS of %q = %d, want %d", i, s.key, cas, s.wantCAS)
		}
	}
	h.nextCAS = 0xFFFFFFFF
	h.SetSharedData("c", nil, 0)
	h.SetSharedData("d", nil, 0)
	_, c, _ := h.GetSharedData("c")
	_, d, ok := h.GetSharedData("d")
	if c != 0xFFFFFFFF || d != 1 || !ok {
		t.Errorf("wrap: CAS c = %d, d = %d, want 4294967295 and 1 (0 is skipped)", c, d)
	}
	if h.SharedDataLen() != 4 {
		t.Errorf("len = %d, want 4", h.SharedDataLen())
	}
}

func TestSharedDataCAS(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")
	for i := 1; i <= 3; i++ {
		if got := do(t, vm, get("/count")).Headers.Get("x-count"); got != strconv.Itoa(i) {
			t.Fatalf("request %d: x-count = %q", i, got)
		}
	}

	// A competing worker writes between the guest's get and set, once.
	raced := false
	h.OnSetSharedData(func(key string, _ []byte, _ uint32) (Status, bool) {
		if !raced {
			raced = true
			h.SetSharedData(key, []byte("100"), 0)
		}
		return 0, false
	})
	if got := do(t, vm, get("/count")).Headers.Get("x-count"); got != "101" {
		t.Errorf("after a race: x-count = %q, want 101", got)
	}
	if !hasLog(h, "cas mismatch") {
		t.Error("the guest did not see a CAS mismatch")
	}

	// Every set fails: the guest gives up after its bounded retries.
	sets := 0
	h.OnSetSharedData(func(string, []byte, uint32) (Status, bool) {
		sets++
		return StatusCasMismatch, true
	})
	resp := do(t, vm, get("/count"))
	if resp.Status != 503 || sets != 8 {
		t.Errorf("under permanent contention: status %d after %d sets, want 503 after 8", resp.Status, sets)
	}
	h.OnSetSharedData(nil)

	// A failing get reaches the guest as an error.
	h.OnGetSharedData(func(string) ([]byte, uint32, Status, bool) { return nil, 0, StatusInternalFailure, true })
	do(t, vm, get("/count"))
	if !hasLog(h, "guest: get: ") {
		t.Error("the guest did not see the failing get")
	}
	h.OnGetSharedData(nil)

	if v, _, _ := h.GetSharedData("count"); string(v) != "101" {
		t.Errorf("count = %q, want 101", v)
	}
	if snap := h.SharedData(); len(snap) != 1 || string(snap["count"].Value) != "101" {
		t.Errorf("SharedData() = %v", snap)
	}
}

func TestClock(t *testing.T) {
	t0 := time.Date(2027, 3, 4, 5, 6, 7, 891011121, time.UTC)
	h := newHost(t, WithStartTime(t0))
	vm := newVM(t, h, "")
	check := func(want time.Time) {
		t.Helper()
		resp := do(t, vm, get("/time"))
		for _, k := range []string{"x-time", "x-time-again"} {
			if got := resp.Headers.Get(k); got != strconv.FormatInt(want.UnixNano(), 10) {
				t.Errorf("%s = %s, want %d", k, got, want.UnixNano())
			}
		}
	}
	check(t0)
	h.Advance(1500 * time.Millisecond)
	check(t0.Add(1500 * time.Millisecond))
	t1 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	h.SetTime(t1)
	check(t1)
	if !h.Now().Equal(t1) {
		t.Errorf("Now = %v, want %v", h.Now(), t1)
	}
}

// TestCalloutRefused: a call OnHTTPCall refuses is not made; the guest gets
// the status.
func TestCalloutRefused(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")
	var clusters []string
	h.OnHTTPCall(func(cluster string) Status {
		clusters = append(clusters, cluster)
		return StatusBadArgument
	})
	resp := do(t, vm, get("/callout"))
	if resp.Status != 500 || len(vm.PendingCallouts()) != 0 || fmt.Sprint(clusters) != "[auth]" {
		t.Fatalf("response %d, pending %v, refused %v; want 500 (the guest's answer to a refused call), none pending, [auth]",
			resp.Status, vm.PendingCallouts(), clusters)
	}
	if !hasLog(h, "guest: dispatch: error status returned by host: bad argument") {
		t.Errorf("no dispatch error log: %v", h.Logs())
	}
}

func TestCallout(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")

	start := func() Response {
		t.Helper()
		resp := do(t, vm, get("/callout"))
		if !resp.Paused || len(resp.Callouts) != 1 || resp.Status != 0 {
			t.Fatalf("response = %+v, want paused on one callout", resp)
		}
		return resp
	}

	resp := start()
	c := resp.Callouts[0]
	wantHeaders := Headers{{":method", "POST"}, {":path", "/check"}, {":authority", "auth.local"}, {"x-from", "guest"}, {"content-length", "8"}}
	if c.Cluster != "auth" || string(c.Body) != "question" || c.Timeout != 500*time.Millisecond ||
		fmt.Sprint(c.Headers) != fmt.Sprint(wantHeaders) || c.ContextID != resp.StreamID {
		t.Errorf("callout = %+v", c)
	}
	got, err := vm.AnswerCallout(c.ID, Headers{{":status", "200"}}, []byte("ok"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Paused || got.Status != 200 || got.Forwarded.Get("x-callout-body") != "ok" {
		t.Errorf("after a 200 answer: %+v", got)
	}
	if _, err := vm.AnswerCallout(c.ID, nil, nil); err == nil {
		t.Error("answering a callout twice succeeded")
	}

	c = start().Callouts[0]
	got, err = vm.AnswerCallout(c.ID, Headers{{":status", "401"}}, []byte("nope"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != 403 || got.Headers.Get("x-callout-status") != "401" || string(got.Body) != "nope" ||
		got.Headers.Get("x-guest-resp") != "/callout" || got.Forwarded != nil {
		t.Errorf("after a 401 answer: %+v", got)
	}

	c = start().Callouts[0]
	got, err = vm.FailCallout(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != 503 || got.Headers.Get("x-callout") != "failed" {
		t.Errorf("after a failed callout: %+v", got)
	}

	// The stream goes away before the answer: the answer still reaches the
	// root context, which ignores it.
	resp = start()
	if r, err := vm.ResetStream(resp.StreamID); err != nil || !r.Reset || r.Paused {
		t.Fatalf("ResetStream = %+v, %v", r, err)
	}
	if n := len(vm.PendingCallouts()); n != 1 {
		t.Fatalf("pending callouts after reset = %d, want 1", n)
	}
	if _, err := vm.AnswerCallout(resp.Callouts[0].ID, Headers{{":status", "200"}}, nil); err != nil {
		t.Fatal(err)
	}
	if n, _ := h.Metric("guest.inflight"); n != 0 {
		t.Errorf("guest.inflight = %d, want 0", n)
	}
	noErrorLogs(t, h)
}

func TestReconfigure(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "a")
	r1 := vm.RootContextID()
	if err := vm.Reconfigure([]byte("b")); err != nil {
		t.Fatal(err)
	}
	r2 := vm.RootContextID()
	if r2 == r1 || !hasLog(h, fmt.Sprintf(`configured root=%d config="b"`, r2)) {
		t.Errorf("new root %d (old %d) not configured", r2, r1)
	}
	if !hasLog(h, fmt.Sprintf("plugin done root=%d", r1)) {
		t.Errorf("old root %d not retired", r1)
	}

	if err := vm.Reconfigure([]byte("fail")); err == nil {
		t.Fatal("Reconfigure(fail) succeeded")
	}
	if vm.RootContextID() != r2 {
		t.Errorf("a failed reconfiguration replaced the root context")
	}

	// A stream in flight keeps its root context alive until it ends.
	paused := do(t, vm, get("/callout"))
	if err := vm.Reconfigure([]byte("c")); err != nil {
		t.Fatal(err)
	}
	if hasLog(h, fmt.Sprintf("plugin done root=%d", r2)) {
		t.Errorf("root %d retired with a stream in flight", r2)
	}
	if resp := do(t, vm, get("/count")); resp.Status != 200 {
		t.Errorf("request on the new root: %+v", resp)
	}
	got, err := vm.AnswerCallout(paused.Callouts[0].ID, Headers{{":status", "200"}}, nil)
	if err != nil || got.Status != 200 {
		t.Fatalf("AnswerCallout = %+v, %v", got, err)
	}
	if !hasLog(h, fmt.Sprintf("plugin done root=%d", r2)) {
		t.Errorf("root %d not retired after its last stream", r2)
	}
}

func TestMetricsAcrossVMs(t *testing.T) {
	h := newHost(t)
	vms := []*VM{newVM(t, h, ""), newVM(t, h, "")}
	for _, vm := range vms {
		for range 3 {
			do(t, vm, get("/alloc"))
		}
	}
	if n, ok := h.Metric("guest.requests"); n != 6 || !ok {
		t.Errorf("guest.requests = %d, %v, want 6", n, ok)
	}
	if n, ok := h.Metric("guest.inflight"); n != 0 || !ok {
		t.Errorf("guest.inflight = %d, %v, want 0", n, ok)
	}
	if got := h.Histogram("guest.sizes"); len(got) != 6 || got[0] != 32<<10 {
		t.Errorf("guest.sizes = %v", got)
	}
	if got := strings.Join(h.Metrics(), ","); got != "guest.denied,guest.inflight,guest.requests,guest.sizes" {
		t.Errorf("Metrics() = %s", got)
	}
}

func TestGuestTrap(t *testing.T) {
	h := newHost(t)
	vm := newVM(t, h, "")
	_, err := vm.HTTP(get("/panic"))
	if err == nil || !strings.Contains(err.Error(), "guest: boom") {
		t.Fatalf("HTTP(/panic) error = %v, want the guest's panic message", err)
	}
	if _, err2 := vm.HTTP(get("/echo")); err2 == nil {
		t.Error("a trapped VM still serves requests")
	}
}

// TestConcurrentWorkers runs several VMs from goroutines against one shared
// counter: every increment that the guest reports must be distinct, and the
// stored count must equal the number of successes.
func TestConcurrentWorkers(t *testing.T) {
	h := newHost(t)
	const workers, perWorker = 4, 150
	vms := make([]*VM, workers)
	for i := range vms {
		vms[i] = newVM(t, h, "")
	}
	// The key exists before the race: a set on a missing key ignores the CAS
	// (as in Envoy), so two workers creating it at once would both win.
	h.SetSharedData("count", []byte("0"), 0)
	var mu sync.Mutex
	seen := make(map[string]bool)
	failures := 0
	var wg sync.WaitGroup
	for _, vm := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				resp, err := vm.HTTP(get("/count"))
				mu.Lock()
				switch {
				case err != nil:
					t.Error(err)
				case resp.Status == 503:
					failures++
				case seen[resp.Headers.Get("x-count")]:
					t.Errorf("count %s handed out twice", resp.Headers.Get("x-count"))
				default:
					seen[resp.Headers.Get("x-count")] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	v, _, _ := h.GetSharedData("count")
	if string(v) != strconv.Itoa(len(seen)) || len(seen)+failures != workers*perWorker {
		t.Errorf("count = %s, successes = %d, failures = %d, want count = successes and %d requests", v, len(seen), failures, workers*perWorker)
	}
	t.Logf("%d successes, %d gave up under contention", len(seen), failures)
}

// TestGCSoak runs 20k allocating requests through one guest: the Go runtime
// in the guest must collect many times without trapping.
func TestGCSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	h := newHost(t)
	vm := newVM(t, h, "")
	gcs := func() int {
		n, err := strconv.Atoi(do(t, vm, get("/gc")).Headers.Get("x-gc"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := gcs()
	start := time.Now()
	const n = 20000
	for i := range n {
		if resp := do(t, vm, get("/alloc")); resp.Status != 200 {
			t.Fatalf("request %d: %+v", i, resp)
		}
	}
	elapsed := time.Since(start)
	after := gcs()
	t.Logf("%d requests in %v (%v each); %d collections", n, elapsed, elapsed/n, after-before)
	if after-before < 20 {
		t.Errorf("only %d collections in %d requests; the soak did not exercise the collector", after-before, n)
	}
	if got, _ := h.Metric("guest.requests"); got != n+2 {
		t.Errorf("guest.requests = %d, want %d", got, n+2)
	}
	noErrorLogs(t, h)
}

func BenchmarkHTTP(b *testing.B) {
	h := newHost(b)
	vm := newVM(b, h, "")
	req := get("/echo", "x-forwarded-for", "203.0.113.7")
	req.SourceAddress = "10.0.0.1:1234"
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := vm.HTTP(req); err != nil {
			b.Fatal(err)
		}
	}
}

package rls

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// NEAR_LIMIT_RATIO's threshold is floor(float32(limit) × ratio): with 0.5
// the hits past 5 of a window of 10 are near the limit; with 0.29 of 100
// the hits past 29 (float32 rounds the product to 29, where float64's is
// 28.999999999999996, floored to 28).
func TestNearLimitRatio(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: k
    value: ten
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: k
    value: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	for _, tc := range []struct {
		ratio             float32
		value             string
		calls             int
		wantNear, wantOut float64
	}{
		{0, "ten", 10, 2, 0},        // the default, 0.8
		{0.5, "ten", 10, 5, 0},      // 6..10
		{0.5, "ten", 12, 5, 2},      // and 2 over
		{0.29, "hundred", 30, 1, 0}, // the 30th only
	} {
		c := newClock(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
		f := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now,
			options: func(o *Options) { o.NearLimitRatio = tc.ratio }})
		for range tc.calls {
			f.call(request("d", desc("k", tc.value)))
		}
		l := map[string]string{"descriptor": "k_" + tc.value}
		if near, out := f.counter("limitd_rls_near_limit_total", l), f.counter("limitd_rls_over_limit_total", l); near != tc.wantNear || out != tc.wantOut {
			t.Errorf("ratio %v, %d calls of %s: near %v over %v, want %v %v", tc.ratio, tc.calls, tc.value, near, out, tc.wantNear, tc.wantOut)
		}
	}
	if _, err := NewServer(Options{Store: memory(newClock(time.Unix(0, 0))), Metrics: &Metrics{}, NearLimitRatio: 1.5}); err == nil {
		t.Error("NewServer accepted a near limit ratio of 1.5")
	}
}

// peerLines are the series of reg as "name{label="value",...} value"
// lines, the labels in name order, of the names that start with prefix.
func peerLines(t *testing.T, reg *prometheus.Registry, prefix string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+strconv.Quote(l.GetValue()))
			}
			v := m.GetCounter().GetValue()
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				v = float64(m.GetHistogram().GetSampleCount())
			}
			out = append(out, fmt.Sprintf("%s{%s} %v", mf.GetName(), strings.Join(ls, ","), v))
		}
	}
	slices.Sort(out)
	return out
}

// envoyproxy/ratelimit's Prometheus series, as its default mapping makes
// them of its statsd names: a key of two parts is labelled domain and
// key1, a longer one domain, key1 and key2 (the parts past the third
// dropped, so eg.outer.inner and eg.outer.inner.deep_x add up), a series
// appears with its first hit, and the calls, errors and loads are counted.
func TestPeerSeries(t *testing.T) {
	const yaml = `
domain: eg
descriptors:
  - key: k
    value: a
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: outer
    descriptors:
      - key: inner
        rate_limit: {unit: hour, requests_per_unit: 5}
        descriptors:
          - key: deep
            value: x
            rate_limit: {unit: hour, requests_per_unit: 5}
`
	c := newClock(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	peer := NewPeerSeries()
	preg := prometheus.NewRegistry()
	if err := preg.Register(peer); err != nil {
		t.Fatal(err)
	}
	f := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now,
		options: func(o *Options) { o.Metrics.WithPeerSeries(peer) }})
	for range 3 {
		f.call(request("eg", desc("k", "a")))
	}
	f.call(request("eg", desc("outer", "o", "inner", "i")))
	f.call(request("eg", desc("outer", "o", "inner", "i", "deep", "x")))
	if _, err := f.try(context.Background(), request("eg")); err == nil {
		t.Fatal("a request without descriptors was answered")
	}
	want := []string{
		`ratelimit_service_config_load_success{} 1`,
		`ratelimit_service_rate_limit_near_limit{domain="eg",key1="k_a"} 1`,
		`ratelimit_service_rate_limit_over_limit{domain="eg",key1="k_a"} 1`,
		`ratelimit_service_rate_limit_total_hits{domain="eg",key1="k_a"} 3`,
		`ratelimit_service_rate_limit_total_hits{domain="eg",key1="outer",key2="inner"} 2`,
		`ratelimit_service_rate_limit_within_limit{domain="eg",key1="k_a"} 2`,
		`ratelimit_service_rate_limit_within_limit{domain="eg",key1="outer",key2="inner"} 2`,
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"} 6`,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"} 1`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 6`,
	}
	if got := peerLines(t, preg, "ratelimit_service_"); !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The peer's series are bounded as limitd's: past MaxSeries label sets,
// hits are counted under key1 "_overflow".
func TestPeerSeriesBound(t *testing.T) {
	p := NewPeerSeries()
	for i := range MaxSeries + 5 {
		p.add("d.k_"+strconv.Itoa(i)+".x", counts{total: 1})
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(p)
	lines := peerLines(t, reg, "ratelimit_service_rate_limit_total_hits")
	if len(lines) != MaxSeries+1 || !slices.Contains(lines, `ratelimit_service_rate_limit_total_hits{domain="d",key1="_overflow"} 5`) {
		t.Errorf("%d series (want %d), overflow: %v", len(lines), MaxSeries+1, slices.Contains(lines, `ratelimit_service_rate_limit_total_hits{domain="d",key1="_overflow"} 5`))
	}
}

// headerList is an answer's response_headers_to_add as "key: value" lines.
func headerList(r *pb.RateLimitResponse) []string {
	var out []string
	for _, h := range r.GetResponseHeadersToAdd() {
		out = append(out, h.GetKey()+": "+h.GetValue())
	}
	return out
}

// With Options.Headers, an answer reports the limit closest to refusing as
// envoyproxy/ratelimit does: the last one refused, else the first of the
// fewest remaining; shadow_mode and quota_mode are never refused, so only
// their remaining counts; a fixed window's reset is the window's end, a
// token bucket's the seconds until it is full, rounded up.
func TestResponseHeaders(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: token_bucket}
`
	c := newClock(time.Date(2026, 11, 29, 10, 20, 15, 0, time.UTC))
	f := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now,
		options: func(o *Options) { o.Headers = &ResponseHeaders{Limit: "L", Remaining: "R", Reset: "T"} }})
	hm := request("d", desc("hour", "h"), desc("minute", "m"), desc("free", "f"))
	for i, want := range [][]string{
		{"L: 3", "R: 2", "T: 45"}, // 2 < 4: the minute's
		{"L: 3", "R: 1", "T: 45"},
		{"L: 3", "R: 0", "T: 45"},
		{"L: 3", "R: 0", "T: 45"}, // refused by the minute
	} {
		if got := headerList(f.call(hm)); !slices.Equal(got, want) {
			t.Errorf("call %d: %q, want %q", i+1, got, want)
		}
	}
	// The minute's refusal wins over the shadow's 0 before it.
	r := f.call(request("d", desc("shadow", "s"), desc("shadow", "s"), desc("minute", "m"), desc("hour", "h")))
	if got, want := headerList(r), []string{"L: 3", "R: 0", "T: 45"}; r.OverallCode != over || !slices.Equal(got, want) {
		t.Errorf("shadow then minute: %v %q, want %q", r.OverallCode, got, want)
	}
	// A shadow over its limit is reported by its remaining (0), the first 0.
	if got, want := headerList(f.call(request("d", desc("free", "f"), desc("shadow", "s")))), []string{"L: 1", "R: 0", "T: 45"}; !slices.Equal(got, want) {
		t.Errorf("shadow: %q, want %q", got, want)
	}
	// A token bucket of 4 a minute: 1 taken, 45 s to full again (15 s a token, 3 s → rounded up).
	c.Add(3 * time.Second)
	f.call(request("d", desc("bucket", "b")))
	c.Add(3 * time.Second)
	if got, want := headerList(f.call(request("d", desc("bucket", "b")))), []string{"L: 4", "R: 2", "T: 27"}; !slices.Equal(got, want) {
		t.Errorf("bucket: %q, want %q", got, want)
	}
	// Unlimited and unknown descriptors alone: no headers.
	if got := headerList(f.call(request("d", desc("free", "f"), desc("nothing", "x")))); got != nil {
		t.Errorf("no limit: %q", got)
	}
}

// With Options.Metadata, an answer carries the request as decided, as
// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA gives it: the domain,
// each descriptor's entries, limit override and own hits, the request's
// hits, the quota_mode descriptors over their limit and whether any limit
// is in quota_mode. Without it, none.
func TestDynamicMetadata(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	c := newClock(time.Date(2026, 11, 29, 10, 20, 15, 0, time.UTC))
	f := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now,
		options: func(o *Options) { o.Metadata = true }})
	override := desc("plain", "p")
	override.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}
	req := &pb.RateLimitRequest{Domain: "d", HitsAddend: 2,
		Descriptors: []*rlpb.RateLimitDescriptor{withHits(desc("plain", "p"), 3), desc("quota", "q"), override, desc("none", "n")}}
	r := f.call(req)
	if r.OverallCode != ok {
		t.Fatalf("quota mode refused: %v", codesOf(r))
	}
	want, err := structpb.NewStruct(map[string]any{
		"domain": "d",
		"descriptors": []any{
			map[string]any{"entries": []any{"plain=p"}, "hitsAddend": 3},
			map[string]any{"entries": []any{"quota=q"}},
			map[string]any{"entries": []any{"plain=p"}, "limit": override.Limit.String()},
			map[string]any{"entries": []any{"none=n"}},
		},
		"hitsAddend":          2,
		"quotaModeViolations": []any{1},
		"quotaModeEnabled":    true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(r.DynamicMetadata, want) {
		t.Errorf("dynamic metadata:\n%v\nwant:\n%v", r.DynamicMetadata, want)
	}
	r = f.call(request("d", desc("plain", "p")))
	if got := r.GetDynamicMetadata().GetFields(); got["quotaModeEnabled"].GetBoolValue() || got["quotaModeViolations"] != nil || got["hitsAddend"] != nil {
		t.Errorf("a plain request: %v", r.DynamicMetadata)
	}

	g := start(t, yaml, fixtureOpts{store: memory(c), algo: rlsconfig.FixedWindow, now: c.Now})
	if r := g.call(req); r.DynamicMetadata != nil {
		t.Errorf("without Options.Metadata: %v", r.DynamicMetadata)
	}
}

// A caller of ShouldRateLimit that skips the handler's decoder (which puts
// invalid UTF-8 in a valid form) still gets an answer that can be sent:
// the dynamic metadata's strings are made valid, else the answer would not
// marshal and the call would fail.
func TestDynamicMetadataInvalidUTF8(t *testing.T) {
	c := newClock(time.Date(2026, 11, 29, 10, 20, 15, 0, time.UTC))
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Options{Store: memory(c), Now: c.Now, Logger: quiet, Metrics: m, Metadata: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rlsconfig.Parse([]rlsconfig.File{{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}})
	if err != nil {
		t.Fatal(err)
	}
	s.SetConfig(cfg)
	r, err := s.ShouldRateLimit(context.Background(), request("d", desc("k\xff", "v\xfe")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(r); err != nil {
		t.Fatalf("the answer does not marshal: %v", err)
	}
	if got := r.DynamicMetadata.Fields["descriptors"].GetListValue().GetValues()[0].GetStructValue().Fields["entries"].GetListValue().GetValues()[0].GetStringValue(); got != "k\uFFFD=v\uFFFD" {
		t.Errorf("entry %q", got)
	}
}

// A call before any configuration is a service_error in the peer's
// series, as envoyproxy/ratelimit counts its "no rate limit configuration
// loaded".
func TestPeerSeriesNoConfig(t *testing.T) {
	peer := NewPeerSeries()
	preg := prometheus.NewRegistry()
	preg.MustRegister(peer)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Options{Store: memory(newClock(time.Unix(0, 0))), Logger: quiet, Metrics: m.WithPeerSeries(peer)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ShouldRateLimit(context.Background(), request("d", desc("k", "v"))); err == nil {
		t.Fatal("answered without a configuration")
	}
	want := []string{
		`ratelimit_service_response_time_seconds{grpc_method="ShouldRateLimit"} 1`,
		`ratelimit_service_should_rate_limit_error{err_type="service_error"} 1`,
		`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 1`,
	}
	if got := peerLines(t, preg, "ratelimit_service_"); !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

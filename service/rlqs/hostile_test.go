package rlqs

import (
	"fmt"
	"math"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
)

var callers = []service.Token{{Name: "honest", Value: "honest-token"}, {Name: "hostile", Value: "hostile-token"}}

// code sends msg (when not nil) and reads until the stream ends, returning
// the status code it ended with.
func code(t *testing.T, s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, msg *rlqspb.RateLimitQuotaUsageReports) codes.Code {
	t.Helper()
	if msg != nil {
		_ = s.Send(msg) // an error shows at Recv
	}
	for {
		if _, err := s.Recv(); err != nil {
			return status.Code(err)
		}
	}
}

// buckets is a report of n distinct new buckets from the n-th on.
func buckets(from, n int) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: "quota"}
	for i := range n {
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, usage(map[string]string{"api_key": fmt.Sprint(from + i)}, 0, 1, 0))
	}
	return r
}

// A stream reporting beyond the bounds is refused with a clear status: too
// many usages in a report, too many buckets (a million asked for, refused
// at MaxBuckets), too many reports, oversized entries, no domain, another
// domain, too many streams of one caller, a wrong token.
func TestHostileBounds(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{tokens: callers})
	s, _ := f.open("hostile-token")
	if c := code(t, s, buckets(0, MaxUsages+1)); c != codes.InvalidArgument {
		t.Errorf("a report of %d usages: %v, want InvalidArgument", MaxUsages+1, c)
	}

	s, _ = f.open("hostile-token")
	sent := 0
	for sent < 1_000_000 {
		if err := s.Send(buckets(sent, MaxUsages)); err != nil {
			break
		}
		if _, err := s.Recv(); err != nil {
			if c := status.Code(err); c != codes.ResourceExhausted {
				t.Fatalf("a million buckets: %v, want ResourceExhausted", err)
			}
			break
		}
		sent += MaxUsages
	}
	if sent != MaxBuckets {
		t.Errorf("a million buckets: refused after %d, want %d", sent, MaxBuckets)
	}

	s, _ = f.open("hostile-token")
	one := buckets(0, 1)
	n := 0
	for ; n <= ReportBurst+1; n++ {
		if err := s.Send(one); err != nil {
			break
		}
		if _, err := s.Recv(); err != nil {
			if c := status.Code(err); c != codes.ResourceExhausted {
				t.Fatalf("a flood of reports: %v, want ResourceExhausted", err)
			}
			break
		}
	}
	if n != ReportBurst {
		t.Errorf("a flood of reports at one instant: refused after %d, want %d", n, ReportBurst)
	}
	var m dto.Metric
	if err := f.srv.opts.Metrics.refused.WithLabelValues("ResourceExhausted").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 2 {
		t.Errorf("limitd_rlqs_refused_streams_total{code=ResourceExhausted} = %v, want 2", got)
	}

	long := string(make([]byte, MaxEntryBytes+1))
	for name, msg := range map[string]*rlqspb.RateLimitQuotaUsageReports{
		"a long key":   {Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{long: "x"}, 0, 1, 0)}},
		"a long value": {Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api_key": long}, 0, 1, 0)}},
		"no bucket_id": {Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{}}},
		"no domain":    {BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api_key": "a"}, 0, 1, 0)}},
	} {
		s, _ := f.open("hostile-token")
		if c := code(t, s, msg); c != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, c)
		}
	}
}

// Streams are bounded per caller and in all; a wrong token is refused; an
// honest caller still opens a stream while a hostile one holds its
// maximum, each reporting an absurd demand on the honest one's key, and
// its Envoy, asking more than the rate, still admits most of its half.
func TestHostileStreams(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{tokens: callers})
	honest := f.node(map[string]string{"api_key": "a"}, "honest-token")
	var hostile []rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range MaxStreamsPerCaller {
		s, _ := f.open("hostile-token")
		exchange(t, s, "quota", usage(map[string]string{"api_key": "a"}, 0, 1, 0))
		hostile = append(hostile, s)
	}
	for range 60 {
		run(f, []*node{honest}, []float64{1}, time.Second, time.Second, func(time.Time) {})
		for _, s := range hostile {
			exchange(t, s, "quota", usage(map[string]string{"api_key": "a"}, 1000, 1_000_000, time.Second))
		}
	}
	// Half the rate is the honest caller's: 20 of the minute's 40.
	t.Logf("the honest Envoy (60 requests in a minute) against %d hostile streams on its key: %d admitted", MaxStreamsPerCaller, honest.e.total)
	if honest.e.total < 15 {
		t.Errorf("the honest Envoy admitted %d in a minute, want at least 15 of its 20", honest.e.total)
	}
	s, _ := f.open("hostile-token")
	if c := code(t, s, buckets(0, 1)); c != codes.ResourceExhausted {
		t.Errorf("stream %d of one caller: %v, want ResourceExhausted", MaxStreamsPerCaller+1, c)
	}
	s, _ = f.open("wrong")
	if c := code(t, s, buckets(0, 1)); c != codes.Unauthenticated {
		t.Errorf("a wrong token: %v, want Unauthenticated", c)
	}
	s, _ = f.open("honest-token")
	exchange(t, s, "quota", usage(map[string]string{"api_key": "a"}, 0, 1, 0))
	if c := code(t, s, &rlqspb.RateLimitQuotaUsageReports{Domain: "other", BucketQuotaUsages: buckets(0, 1).BucketQuotaUsages}); c != codes.InvalidArgument {
		t.Errorf("another domain on the stream: %v, want InvalidArgument", c)
	}
}

// A hostile stream claiming absurd counts and intervals on an honest
// Envoy's key is clamped: the honest Envoy keeps at least an equal split of
// the rate, and the fleet stays within burst + rate × t counting everything
// the hostile stream's assignments let it admit.
func TestHostileDemand(t *testing.T) {
	stores(t, func(t *testing.T, st service.Store, c *clock) {
		f := start(t, quotaYAML, fixtureOpts{store: st, clock: c, tokens: callers})
		id := map[string]string{"api_key": "contested"}
		honest := f.node(id, "honest-token")
		bad := f.node(id, "hostile-token")
		t0 := c.Now()
		liar := func(time.Time) {}
		for i := range 180 {
			run(f, []*node{honest}, []float64{2}, time.Second, time.Second, liar)
			// The hostile stream admits all it may and claims absurd numbers.
			for bad.e.request(c.Now()) {
			}
			bad.e.report(c.Now())
			elapsed := []time.Duration{-time.Hour, 0, 1000 * time.Hour, time.Duration(math.MaxInt64)}[i%4]
			r := exchange(t, bad.s, "quota", usage(id, math.MaxUint64, math.MaxUint64, elapsed))
			for _, a := range r.BucketAction {
				bad.e.apply(a, c.Now())
			}
		}
		el := c.Now().Sub(t0)
		total := float64(honest.e.total + bad.e.total)
		bound := 40 + 40.0/60*el.Seconds()
		t.Logf("over %v: honest admitted %d, hostile %d, bound %.1f", el, honest.e.total, bad.e.total, bound)
		if _, ok := st.(*service.MemoryStore); ok {
			if total > bound {
				t.Errorf("admitted %v, bound %.1f", total, bound)
			}
			if float64(honest.e.total) < 0.4*40.0/60*el.Seconds() {
				t.Errorf("the honest Envoy (2/s) admitted %d over %v against a liar, want at least 40%% of the rate", honest.e.total, el)
			}
		}
	})
}

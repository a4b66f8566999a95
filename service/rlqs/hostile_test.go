package rlqs

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
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

// counter reads a counter of m's series.
func counter(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// kinds counts the actions of r: token buckets, blanket rules, abandons.
func kinds(r *rlqspb.RateLimitQuotaResponse) (tb, bl, ab int) {
	for _, a := range r.BucketAction {
		switch {
		case a.GetAbandonAction() != nil:
			ab++
		case a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil:
			tb++
		default:
			bl++
		}
	}
	return tb, bl, ab
}

// A stream is never ended for what its Envoy reports: buckets past the
// stream's bound are abandoned (or take an idle bucket's place), bucket_ids
// that cannot be read are answered as unmatched, a report of more than
// MaxUsages is answered up to MaxUsages, and a flood of reports is booked
// without answers, its new buckets abandoned; the buckets kept go on being
// assigned throughout. Only a report without a domain ends a stream.
func TestHostileBounds(t *testing.T) {
	lower := defaultBounds
	lower.buckets = 8
	f := start(t, quotaYAML, fixtureOpts{tokens: callers, bounds: &lower})
	s, _ := f.open("hostile-token")
	want := func(step string, r *rlqspb.RateLimitQuotaResponse, tb, bl, ab int) {
		t.Helper()
		if gtb, gbl, gab := kinds(r); gtb != tb || gbl != bl || gab != ab {
			t.Errorf("%s: %d token buckets, %d blanket rules, %d abandons; want %d, %d, %d", step, gtb, gbl, gab, tb, bl, ab)
		}
	}
	want("8 buckets, the bound", exchange(t, s, "quota", buckets(0, 8).BucketQuotaUsages...), 8, 0, 0)
	want("4 more", exchange(t, s, "quota", buckets(8, 4).BucketQuotaUsages...), 0, 0, 4)

	f.clock.Add(time.Second)
	long := string(make([]byte, MaxEntryBytes+1))
	unreadable := []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": long}, 1, 0, time.Second),
		usage(map[string]string{long: "x"}, 1, 0, time.Second),
		usage(map[string]string{"api_key": strings.Repeat("k", MaxEntryBytes), "b": strings.Repeat("v", MaxEntryBytes),
			"c": strings.Repeat("v", MaxEntryBytes), "d": strings.Repeat("v", MaxEntryBytes)}, 1, 0, time.Second), // MaxIDBytes
		usage(nil, 1, 0, time.Second),
		{NumRequestsAllowed: 1},
	}
	r := exchange(t, s, "quota", append(buckets(0, 8).BucketQuotaUsages, unreadable...)...)
	want("the 8 kept and 5 unreadable", r, 8, 5, 0)
	for _, a := range r.BucketAction[8:] {
		if got := blanket(t, a); got != typev3.RateLimitStrategy_ALLOW_ALL {
			t.Errorf("an unreadable bucket_id: %v, want the Unmatched default ALLOW_ALL", got)
		}
	}

	// Bucket 7 reported idle, then a new busy bucket takes its place.
	f.clock.Add(time.Second)
	idle := buckets(0, 8)
	idle.BucketQuotaUsages[7] = usage(map[string]string{"api_key": "7"}, 0, 0, time.Second)
	want("7 busy and one idle", exchange(t, s, "quota", idle.BucketQuotaUsages...), 8, 0, 0)
	r = exchange(t, s, "quota", usage(map[string]string{"api_key": "new"}, 1, 0, 0))
	want("a new bucket at the bound, one idle", r, 1, 0, 1)
	if got := r.BucketAction[0].BucketId.Bucket["api_key"]; r.BucketAction[0].GetAbandonAction() == nil || got != "7" {
		t.Errorf("a new bucket at the bound: want the idle bucket 7 abandoned first, got %v", r.BucketAction[0])
	}

	// A flood of reports at one instant: booked, unanswered; once the
	// report budget is spent, a new bucket is abandoned, and a bucket that
	// needs no store call is still answered.
	for range ReportBurst + 50 {
		if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: buckets(0, 1).BucketQuotaUsages}); err != nil {
			t.Fatal(err)
		}
	}
	r = exchange(t, s, "quota", usage(map[string]string{"api_key": "flood"}, 1, 0, 0), unreadable[0])
	want("past the report budget", r, 0, 1, 1)
	if got := counter(t, f.srv.opts.Metrics.overBudget); got < 40 {
		t.Errorf("limitd_rlqs_reports_over_budget_total = %v after %d reports at once, want at least 40", got, ReportBurst+50)
	}
	f.clock.Add(time.Second)
	want("a second on, the buckets kept", exchange(t, s, "quota", buckets(0, 7).BucketQuotaUsages...), 7, 0, 0)

	if got := counter(t, f.srv.opts.Metrics.refused.WithLabelValues("ResourceExhausted")); got != 0 {
		t.Errorf("limitd_rlqs_refused_streams_total{code=ResourceExhausted} = %v, want 0", got)
	}
	s, _ = f.open("hostile-token")
	if c := code(t, s, &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: buckets(0, 1).BucketQuotaUsages}); c != codes.InvalidArgument {
		t.Errorf("a first report without a domain: %v, want InvalidArgument", c)
	}
}

// Many buckets at the default bounds: a report of more new buckets than
// MaxBuckets keeps MaxBuckets and abandons the rest, the stream going on;
// of a report of more than MaxUsages, MaxUsages are answered.
func TestManyBuckets(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{tokens: callers})
	s, _ := f.open("hostile-token")
	msg := buckets(0, MaxBuckets+100)
	for _, u := range msg.BucketQuotaUsages {
		u.BucketId.Bucket = map[string]string{"free": u.BucketId.Bucket["api_key"]}
	}
	r := exchange(t, s, "quota", msg.BucketQuotaUsages...)
	if tb, bl, ab := kinds(r); tb != 0 || bl != MaxBuckets || ab != 100 {
		t.Errorf("%d new buckets in one report: %d blanket rules, %d abandons; want %d, 100", MaxBuckets+100, bl, ab, MaxBuckets)
	}
	if got := f.srv.tracked.Load(); got != MaxBuckets {
		t.Errorf("%d buckets kept, want %d", got, MaxBuckets)
	}
	f.clock.Add(time.Second)
	r = exchange(t, s, "quota", usage(map[string]string{"free": "0"}, 1, 0, time.Second), usage(map[string]string{"api_key": "a"}, 1, 0, 0))
	if tb, bl, ab := kinds(r); tb != 0 || bl != 1 || ab != 1 {
		t.Errorf("a bucket kept and a new one with none idle: %v, want the first's blanket rule and the second abandoned", r)
	}

	// A report of more than MaxUsages: MaxUsages read and answered.
	s, _ = f.open("hostile-token")
	msg = buckets(0, MaxUsages+5)
	for _, u := range msg.BucketQuotaUsages {
		u.BucketId.Bucket = map[string]string{"free": u.BucketId.Bucket["api_key"]}
	}
	if got := len(exchange(t, s, "quota", msg.BucketQuotaUsages...).BucketAction); got != MaxUsages {
		t.Errorf("a report of %d usages: %d answered, want %d", MaxUsages+5, got, MaxUsages)
	}
	if got := counter(t, f.srv.opts.Metrics.untracked.WithLabelValues("past_max_usages")); got != 5 {
		t.Errorf("limitd_rlqs_untracked_buckets_total{why=past_max_usages} = %v, want 5", got)
	}
}

// Streams are bounded per caller and in all; a wrong token is refused; an
// honest caller still opens a stream while a hostile one holds its
// maximum, each reporting an absurd demand on the honest one's key, and
// its Envoy, asking more than the rate, still admits most of its half.
func TestHostileStreams(t *testing.T) {
	const perCaller = 64 // MaxStreamsPerCaller, lowered to keep the test short
	lower := defaultBounds
	lower.perCaller = perCaller
	f := start(t, quotaYAML, fixtureOpts{tokens: callers, bounds: &lower})
	honest := f.node(map[string]string{"api_key": "a"}, "honest-token")
	var hostile []rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range perCaller {
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
	t.Logf("the honest Envoy (60 requests in a minute) against %d hostile streams on its key: %d admitted", perCaller, honest.e.total)
	if honest.e.total < 15 {
		t.Errorf("the honest Envoy admitted %d in a minute, want at least 15 of its 20", honest.e.total)
	}
	s, _ := f.open("hostile-token")
	if c := code(t, s, buckets(0, 1)); c != codes.ResourceExhausted {
		t.Errorf("stream %d of one caller: %v, want ResourceExhausted", perCaller+1, c)
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

// The buckets kept are bounded in memory: MaxTracked buckets, each with a
// bucket_id of about MaxIDBytes (the most a bucket kept can carry; each
// stream's MaxStreamIDBytes lifted), hold well under 256 MiB of heap.
func TestKeptBucketsMemory(t *testing.T) {
	lifted := defaultBounds
	lifted.idBytes = MaxBuckets * MaxIDBytes // the process's bound, not the stream's
	f := start(t, quotaYAML, fixtureOpts{bounds: &lifted})
	cfg := f.srv.opts.Config()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var kept []*stream
	now := f.clock.Now()
	for s := range MaxTracked / MaxBuckets {
		st := &stream{id: uint64(s + 1), caller: "x", buckets: map[string]*bucket{}, reports: ReportBurst, last: now, domain: "quota"}
		for i := range MaxBuckets {
			v := fmt.Sprintf("%d-%d-", s, i)
			b, err := proto.Marshal(usage(map[string]string{"free": v + strings.Repeat("v", 250-len(v)), "x": strings.Repeat("w", 250)}, 1, 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			var u rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage // decoded, as from the wire
			if err := proto.Unmarshal(b, &u); err != nil {
				t.Fatal(err)
			}
			if err := f.srv.usage(context.Background(), cfg, st, &u, true, now, &rlqspb.RateLimitQuotaResponse{}); err != nil {
				t.Fatal(err)
			}
		}
		kept = append(kept, st)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	n := f.srv.tracked.Load()
	t.Logf("%d buckets kept with bucket_ids of 505 bytes: %.1f MiB of heap, %.0f bytes a bucket", n, heap/(1<<20), heap/float64(n))
	if n != MaxTracked {
		t.Errorf("%d buckets kept, want %d", n, MaxTracked)
	}
	if heap > 256<<20 {
		t.Errorf("%d buckets kept hold %.1f MiB, want under 256", n, heap/(1<<20))
	}
	runtime.KeepAlive(kept)
}

// The bucket_ids a stream keeps are bounded in bytes, so that the report of
// the buckets kept fits the gRPC server's 64 KiB message bound: of 300 busy
// buckets of 254-byte ids, those past MaxStreamIDBytes are abandoned.
func TestKeptIDBytes(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{})
	s, _ := f.open("")
	var all []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range 300 {
		v := fmt.Sprintf("%d-", i)
		all = append(all, usage(map[string]string{"free": v + strings.Repeat("v", 250-len(v))}, 1, 0, time.Second))
	}
	kept := 0
	for i := 0; i < len(all); i += 100 {
		tb, bl, ab := kinds(exchange(t, s, "quota", all[i:i+100]...))
		kept += tb + bl
		if tb+bl+ab != 100 {
			t.Errorf("a report of 100 buckets: %d answered", tb+bl+ab)
		}
	}
	if want := MaxStreamIDBytes / 254; kept != want {
		t.Errorf("%d buckets of 254-byte ids kept, want %d", kept, want)
	}
	size := proto.Size(&rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: all[:kept]})
	t.Logf("%d buckets kept; their report: %d bytes", kept, size)
	if size > grpcdoor.DefaultMaxRecvBytes {
		t.Errorf("the report of the buckets kept is %d bytes, over the gRPC bound %d", size, grpcdoor.DefaultMaxRecvBytes)
	}
}

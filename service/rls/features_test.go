package rls

import (
	"math"
	"slices"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// featuresYAML has one descriptor of every kind the format has.
const featuresYAML = `
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        rate_limit:
          unit: minute
          requests_per_unit: 3
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: quota
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
  - key: detailed
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: zero
    rate_limit:
      unit: minute
      requests_per_unit: 0
  - key: burst
    rate_limit:
      unit: minute
      requests_per_unit: 60
      burst: 3
`

func TestFeatures(t *testing.T) {
	type call struct {
		name  string
		req   *pb.RateLimitRequest
		codes []pb.RateLimitResponse_Code
		check func(t *testing.T, r *pb.RateLimitResponse)
	}
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			c := newClock(epoch)
			f := start(t, featuresYAML, fixtureOpts{store: memory(c), now: c.Now, algo: algo})
			calls := []call{
				// Nested: the second level's value, then its default key.
				{"nested value", request("rl", desc("source_cluster", "proxy", "destination_cluster", "bkthomps")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"nested value", request("rl", desc("source_cluster", "proxy", "destination_cluster", "bkthomps")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"nested value over", request("rl", desc("source_cluster", "proxy", "destination_cluster", "bkthomps")), []pb.RateLimitResponse_Code{over, over}, nil},
				{"nested default key", request("rl", desc("source_cluster", "proxy", "destination_cluster", "other")), []pb.RateLimitResponse_Code{ok, ok}, func(t *testing.T, r *pb.RateLimitResponse) {
					if got := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 3 {
						t.Errorf("limit %d, want the default key's 3", got)
					}
				}},
				// Deeper than the configuration: no limit.
				{"too deep", request("rl", desc("source_cluster", "proxy", "destination_cluster", "x", "more", "y")), []pb.RateLimitResponse_Code{ok, ok}, func(t *testing.T, r *pb.RateLimitResponse) {
					if r.Statuses[0].CurrentLimit != nil {
						t.Errorf("a limit for a descriptor deeper than the configuration: %v", r.Statuses[0])
					}
				}},
				// Replaces: bkthomps (1/minute, named) is replaced by the
				// nested limit that names it, so only the latter counts.
				{"replaces", request("rl", desc("foo", "x", "bar", "bkthomps"), desc("source_cluster", "proxy", "destination_cluster", "bkthomps")), []pb.RateLimitResponse_Code{over, ok, over}, func(t *testing.T, r *pb.RateLimitResponse) {
					if r.Statuses[0].CurrentLimit != nil {
						t.Errorf("the replaced limit answered %v", r.Statuses[0])
					}
				}},
				{"named alone", request("rl", desc("foo", "x", "bar", "bkthomps")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"named alone over", request("rl", desc("foo", "x", "bar", "bkthomps")), []pb.RateLimitResponse_Code{over, over}, nil},
				// Wildcard: every value starting with foo has the wildcard's
				// limit, each value its own counter.
				{"wildcard", request("rl", desc("wild", "foo1")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"wildcard other value", request("rl", desc("wild", "foo2")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"wildcard over", request("rl", desc("wild", "foo1")), []pb.RateLimitResponse_Code{over, over}, nil},
				{"wildcard no match", request("rl", desc("wild", "bar")), []pb.RateLimitResponse_Code{ok, ok}, func(t *testing.T, r *pb.RateLimitResponse) {
					if r.Statuses[0].CurrentLimit != nil {
						t.Errorf("wild=bar matched %v", r.Statuses[0])
					}
				}},
				// Shadow: over the limit is OK, counted.
				{"shadow", request("rl", desc("shadow", "a")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"shadow over", request("rl", desc("shadow", "a")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				// Quota: over the limit is OK without a reset.
				{"quota", request("rl", desc("quota", "a")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				{"quota over", request("rl", desc("quota", "a")), []pb.RateLimitResponse_Code{ok, ok}, func(t *testing.T, r *pb.RateLimitResponse) {
					if r.Statuses[0].DurationUntilReset != nil || r.Statuses[0].CurrentLimit == nil {
						t.Errorf("quota over the limit: %v", r.Statuses[0])
					}
				}},
				// Unlimited: OK, remaining the largest uint32, no limit.
				{"unlimited", request("rl", desc("free", "x")), []pb.RateLimitResponse_Code{ok, ok}, func(t *testing.T, r *pb.RateLimitResponse) {
					if st := r.Statuses[0]; st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
						t.Errorf("unlimited: %v", st)
					}
				}},
				// A limit of 0 refuses every hit; hits_addend 0 only looks.
				{"zero", request("rl", desc("zero", "x")), []pb.RateLimitResponse_Code{over, over}, nil},
				{"zero looked at", request("rl", withHits(desc("zero", "y"), 0)), []pb.RateLimitResponse_Code{ok, ok}, nil},
				// ... unless its counter is already over (a fixed window
				// counted the refused hit, as envoyproxy/ratelimit does).
				{"zero looked at again", request("rl", withHits(desc("zero", "x"), 0)), []pb.RateLimitResponse_Code{over, over}, nil},
				// An unknown domain has no limits.
				{"unknown domain", request("nope", desc("foo", "x")), []pb.RateLimitResponse_Code{ok, ok}, nil},
				// detailed_metric names the value in the statistics.
				{"detailed", request("rl", desc("detailed", "v1")), []pb.RateLimitResponse_Code{ok, ok}, nil},
			}
			for _, cl := range calls {
				r := f.call(cl.req)
				if !slices.Equal(codesOf(r), cl.codes) {
					t.Errorf("%s: %v, want %v", cl.name, codesOf(r), cl.codes)
					continue
				}
				if cl.check != nil {
					cl.check(t, r)
				}
			}
			for _, s := range []struct {
				name, desc string
				want       float64
			}{
				{"limitd_rls_total_hits_total", "source_cluster_proxy.destination_cluster_bkthomps", 4},
				{"limitd_rls_over_limit_total", "source_cluster_proxy.destination_cluster_bkthomps", 2},
				{"limitd_rls_within_limit_total", "source_cluster_proxy.destination_cluster_bkthomps", 2},
				{"limitd_rls_total_hits_total", "source_cluster_proxy.destination_cluster", 1},
				{"limitd_rls_total_hits_total", "foo.bar_bkthomps", 2},
				{"limitd_rls_total_hits_total", "wild_foo*", 3},
				{"limitd_rls_shadow_mode_total", "shadow", 1},
				{"limitd_rls_over_limit_total", "shadow", 1},
				{"limitd_rls_over_limit_total", "quota", 1},
				{"limitd_rls_shadow_mode_total", "quota", 0},
				{"limitd_rls_total_hits_total", "detailed_v1", 1},
				{"limitd_rls_total_hits_total", "free", 0},
				{"limitd_rls_over_limit_total", "zero", 1},
			} {
				if got := f.counter(s.name, map[string]string{"domain": "rl", "descriptor": s.desc}); got != s.want {
					t.Errorf("%s{descriptor=%q} = %v, want %v", s.name, s.desc, got, s.want)
				}
			}
		})
	}
}

// The extension burst sets a bucket's capacity apart from its rate: 60 a
// minute with a burst of 3 admits 3 at once, then one a second; a limit
// with a burst is a token bucket under a fixed-window service too.
func TestBurstExtension(t *testing.T) {
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		t.Run(algo.String(), func(t *testing.T) { testBurst(t, algo) })
	}
}

func testBurst(t *testing.T, algo rlsconfig.Algorithm) {
	c := newClock(epoch)
	f := start(t, featuresYAML, fixtureOpts{store: memory(c), now: c.Now, algo: algo})
	for i := range 3 {
		if r := f.call(request("rl", desc("burst", "x"))); r.OverallCode != ok {
			t.Fatalf("call %d: %v", i, codesOf(r))
		}
	}
	if r := f.call(request("rl", desc("burst", "x"))); r.OverallCode != over {
		t.Fatalf("4th: %v", codesOf(r))
	}
	c.Add(time.Second)
	r := f.call(request("rl", desc("burst", "x")))
	if r.OverallCode != ok {
		t.Fatalf("a second later: %v", codesOf(r))
	}
	if got := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); got != 60 {
		t.Errorf("current limit %d, want 60 (the rate)", got)
	}
}

// hits_addend: the request's applies to every descriptor without its own; a
// descriptor's own wins, 0 included (it checks without taking).
func TestHitsAddend(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	r := f.call(&pb.RateLimitRequest{Domain: "apis", HitsAddend: 4, Descriptors: []*rlpb.RateLimitDescriptor{desc("generic_key", "slow")}})
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("hits 4: %v", r)
	}
	r = f.call(&pb.RateLimitRequest{Domain: "apis", HitsAddend: 4, Descriptors: []*rlpb.RateLimitDescriptor{withHits(desc("generic_key", "slow"), 0)}})
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("own hits 0: %v, want 6 left untouched", r)
	}
	r = f.call(&pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{withHits(desc("generic_key", "slow"), 7)}})
	if r.OverallCode != over || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("own hits 7 of 6: %v, want refused with 6 left", r)
	}
	r = f.call(&pb.RateLimitRequest{Domain: "apis", Descriptors: []*rlpb.RateLimitDescriptor{withHits(desc("generic_key", "slow"), 6)}})
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("own hits 6 of 6: %v", r)
	}
}

// A descriptor's own limit replaces the configuration's, in a domain the
// configuration has; its statistics are named with the request's values.
func TestLimitOverride(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	d := desc("generic_key", "slow")
	d.Limit = &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	if r := f.call(request("apis", d)); r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("first: %v", r)
	}
	if r := f.call(request("apis", d)); r.OverallCode != over {
		t.Fatalf("second: %v", codesOf(r))
	}
	// The configuration's own limit is another bucket, untouched.
	if r := f.call(request("apis", desc("generic_key", "slow"))); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 9 {
		t.Fatalf("configured: %v", r)
	}
	if got := f.counter("limitd_rls_total_hits_total", map[string]string{"domain": "apis", "descriptor": "generic_key_slow"}); got != 3 {
		t.Errorf("total hits %v, want 3", got)
	}
	// In a domain the configuration lacks, no limit applies.
	if r := f.call(request("other", d)); r.Statuses[0].CurrentLimit != nil {
		t.Errorf("override in an unknown domain: %v", r)
	}
	// An override's unit must be known.
	d.Limit.Unit = 99
	if _, err := f.try(t.Context(), request("apis", d)); err == nil {
		t.Error("an override of unknown unit was accepted")
	}
}

// Requests beyond the bounds, or without a domain or descriptors, are
// InvalidArgument.
func TestInvalidRequests(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	many := make([]*rlpb.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("k", "v")
	}
	for name, req := range map[string]*pb.RateLimitRequest{
		"no domain":      request("", desc("k", "v")),
		"no descriptors": request("apis"),
		"too many":       request("apis", many...),
		"hits too large": request("apis", withHits(desc("k", "v"), 1<<40)),
	} {
		if _, err := f.try(t.Context(), req); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := f.counter("limitd_rls_invalid_requests_total", nil); got != 4 {
		t.Errorf("invalid requests %v, want 4", got)
	}
	// A descriptor without entries has no limit, as in envoyproxy/ratelimit.
	if r := f.call(request("apis", &rlpb.RateLimitDescriptor{})); r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
		t.Errorf("no entries: %v", r)
	}
}

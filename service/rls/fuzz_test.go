package rls

import (
	"math"
	"strings"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// FuzzShouldRateLimit sends requests made from the input (descriptors split
// at "|", entries at ",", key and value at "=", a "#n" suffix a
// descriptor's own hits) and checks what every answer must be: one status
// per descriptor, OVER_LIMIT overall exactly when a status is, a limit that
// is the one the configuration finds, the largest uint32 for an unlimited
// descriptor; a refusal only as InvalidArgument.
func FuzzShouldRateLimit(f *testing.F) {
	for _, s := range []string{"wild=foo1", "source_cluster=proxy,destination_cluster=bkthomps|foo=x,bar=bkthomps", "zero=z#0|free=1", "shadow=a|quota=b|burst=c#5", "=", "|||", "detailed=v"} {
		f.Add(s, uint32(1), false)
	}
	cfg, err := rlsconfig.Parse([]rlsconfig.File{{Name: "c.yaml", Data: []byte(featuresYAML)}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in string, hits uint32, windows bool) {
		algo := rlsconfig.TokenBucket
		if windows {
			algo = rlsconfig.FixedWindow
		}
		m, err := NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		c := newClock(epoch)
		srv, err := NewServer(Options{Store: memory(c), Algorithm: algo, Now: c.Now, Logger: quiet, Metrics: m})
		if err != nil {
			t.Fatal(err)
		}
		srv.SetConfig(cfg)
		req := &pb.RateLimitRequest{Domain: "rl", HitsAddend: hits % 20}
		for _, ds := range strings.Split(in, "|") {
			d := &rlpb.RateLimitDescriptor{}
			if body, n, ok := strings.Cut(ds, "#"); ok {
				ds = body
				d.HitsAddend = wrapperspb.UInt64(uint64(len(n)))
			}
			for _, e := range strings.Split(ds, ",") {
				k, v, _ := strings.Cut(e, "=")
				d.Entries = append(d.Entries, &rlpb.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		for range 3 {
			r, err := srv.ShouldRateLimit(t.Context(), req)
			if err != nil {
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("%q: %v", in, err)
				}
				return
			}
			if len(r.Statuses) != len(req.Descriptors) {
				t.Fatalf("%d statuses for %d descriptors", len(r.Statuses), len(req.Descriptors))
			}
			anyOver := false
			for i, st := range r.Statuses {
				anyOver = anyOver || st.Code == over
				var es []rlsconfig.Entry
				for _, e := range req.Descriptors[i].Entries {
					es = append(es, rlsconfig.Entry{Key: e.Key, Value: e.Value})
				}
				lm, _ := cfg.Lookup("rl", es)
				switch {
				case lm.Limit != nil && lm.Limit.Unlimited:
					if st.Code != ok || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
						t.Fatalf("%q: unlimited descriptor %d answered %v", in, i, st)
					}
				case st.CurrentLimit != nil && (lm.Limit == nil || st.CurrentLimit.RequestsPerUnit != lm.Limit.RequestsPerUnit):
					t.Fatalf("%q: descriptor %d answered %v, the configuration finds %+v", in, i, st, lm.Limit)
				case st.CurrentLimit != nil && st.LimitRemaining > lm.Limit.Capacity():
					t.Fatalf("%q: descriptor %d has %d left of %d", in, i, st.LimitRemaining, lm.Limit.Capacity())
				}
			}
			if (r.OverallCode == over) != anyOver {
				t.Fatalf("%q: overall %v, statuses %v", in, r.OverallCode, codesOf(r))
			}
		}
	})
}

package rls

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// hostileYAML limits each user to 1 a minute, alone and with a path, and
// names its statistics by the value (detailed_metric).
const hostileYAML = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
    detailed_metric: true
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1}
        detailed_metric: true
`

// rawCall sends wire as the ShouldRateLimit request's bytes, as a client
// that does not check UTF-8 would: the bytes travel as the unknown fields
// of an empty message.
func (f *fixture) rawCall(wire []byte) (*pb.RateLimitResponse, error) {
	in := &emptypb.Empty{}
	in.ProtoReflect().SetUnknown(wire)
	out := &pb.RateLimitResponse{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.conn.Invoke(ctx, "/"+ServiceName+"/ShouldRateLimit", in, out)
	return out, err
}

// withBytes is the wire form of req with each "@@" replaced by b's two
// bytes.
func withBytes(t *testing.T, req *pb.RateLimitRequest, b string) []byte {
	t.Helper()
	if len(b) != 2 {
		t.Fatal("withBytes: two bytes")
	}
	wire, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(wire, []byte("@@"), []byte(b))
}

// A descriptor value that is not UTF-8 is decided, never a failed call:
// Envoy's default failure_mode_deny false admits every failed call. Each
// such value is a bucket of its own (two such values do not share one),
// and the request's other descriptors are decided as ever.
func TestInvalidUTF8Decided(t *testing.T) {
	c := newClock(epoch)
	f := start(t, hostileYAML, fixtureOpts{store: memory(c), now: c.Now})
	bad := withBytes(t, request("d", desc("user", "@@"), desc("user", "ok")), "\xff\xfe")
	for i, want := range [][]pb.RateLimitResponse_Code{{ok, ok, ok}, {over, over, over}} {
		r, err := f.rawCall(bad)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got := codesOf(r); !slicesEqual(got, want) {
			t.Fatalf("call %d: %v, want %v", i, got, want)
		}
	}
	other := withBytes(t, request("d", desc("user", "@@")), "\xfe\xff")
	if r, err := f.rawCall(other); err != nil || r.OverallCode != ok {
		t.Fatalf("another invalid value: %v, %v; want OK (a bucket of its own)", codesOf(r), err)
	}
	// The statistics name the value in its stated form, valid UTF-8.
	label := "user_" + rlsconfig.InvalidUTF8("\xff\xfe")
	if got := f.counter("limitd_rls_total_hits_total", map[string]string{"descriptor": label}); got != 2 {
		t.Errorf("total hits of %q: %v, want 2", label, got)
	}
	// An invalid domain or key matches nothing: OK, counted as no limit.
	for _, req := range []*pb.RateLimitRequest{request("@@", desc("user", "x")), request("d", desc("@@", "x"))} {
		if r, err := f.rawCall(withBytes(t, req, "\xc3\x28")); err != nil || r.OverallCode != ok {
			t.Errorf("%v: %v, %v", req, codesOf(r), err)
		}
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A value holding the separator cannot spell another descriptor's bucket:
// user "victim_path_/x" and user "victim" with path "/x" are two buckets.
func TestBucketNamesUnambiguous(t *testing.T) {
	c := newClock(epoch)
	f := start(t, hostileYAML, fixtureOpts{store: memory(c), now: c.Now})
	if r := f.call(request("d", desc("user", "victim_path_/x"))); r.OverallCode != ok {
		t.Fatalf("attacker: %v", codesOf(r))
	}
	if r := f.call(request("d", desc("user", "victim", "path", "/x"))); r.OverallCode != ok {
		t.Fatalf("victim after the attacker: %v, want OK (a bucket of its own)", codesOf(r))
	}
}

// A request value past --max-key-bytes names its bucket and its
// statistics by a hash: a 60,000-byte value is not a 60,000-byte Redis key
// nor a label of that size.
func TestLongValuesHashed(t *testing.T) {
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			mr := miniredis.RunT(t)
			mr.SetTime(epoch)
			client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { client.Close() })
			st, err := service.NewRedisStore(client, service.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := newClock(epoch)
			f := start(t, hostileYAML, fixtureOpts{store: st, now: c.Now, algo: algo, maxKeyBytes: 100})
			long := strings.Repeat("v", 60_000)
			longer := long + "w"
			for i, want := range []pb.RateLimitResponse_Code{ok, over} {
				if r := f.call(request("d", desc("user", long))); r.OverallCode != want {
					t.Fatalf("call %d: %v, want %v", i, codesOf(r), want)
				}
			}
			if r := f.call(request("d", desc("user", longer))); r.OverallCode != ok {
				t.Fatalf("another long value: %v, want OK (a bucket of its own)", codesOf(r))
			}
			keys := mr.Keys()
			if len(keys) != 2 {
				t.Errorf("keys %d, want 2", len(keys))
			}
			for _, k := range keys {
				if len(k) > 200 {
					t.Errorf("a key of %d bytes: %.80q...", len(k), k)
				}
			}
			mfs, err := f.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						if len(lp.GetValue()) > 100 {
							t.Errorf("%s: a label of %d bytes", mf.GetName(), len(lp.GetValue()))
						}
					}
				}
			}
		})
	}
}

package rlqs

import (
	"context"
	"testing"
	"time"
	"unicode/utf8"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends and receives a message's bytes as they are: a client
// speaking the raw protocol, as Envoy's C++ serializer does.
type rawCodec struct{}

type raw struct{ b []byte }

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*raw).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*raw).b = data.Materialize()
	return nil
}

// reportBytes encodes a report of one usage whose bucket_id is {key: value}
// by hand, whatever the value's bytes.
func reportBytes(domain, key, value string, allowed uint64) []byte {
	var entry, id, u, r []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, key)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, value)
	id = protowire.AppendTag(id, 1, protowire.BytesType)
	id = protowire.AppendBytes(id, entry)
	u = protowire.AppendTag(u, 1, protowire.BytesType)
	u = protowire.AppendBytes(u, id)
	u = protowire.AppendTag(u, 3, protowire.VarintType)
	u = protowire.AppendVarint(u, allowed)
	r = protowire.AppendTag(r, 1, protowire.BytesType)
	r = protowire.AppendString(r, domain)
	r = protowire.AppendTag(r, 2, protowire.BytesType)
	return protowire.AppendBytes(r, u)
}

// A request whose key is not UTF-8 does not stop its Envoy's reports from
// being served: Envoy's C++ serializer sends the bytes as they are, Go's
// protobuf refuses to decode them (the stream ended there), the lenient
// codec decodes them, the bucket is left unanswered (Envoy's own parser
// would refuse an answer naming it) and the honest key beside it goes on
// being assigned on the same stream. The client speaks the raw protocol.
func TestUnreadableBucketID(t *testing.T) {
	f := start(t, quotaYAML, fixtureOpts{unmatched: DenyUnmatched})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
		"/"+ServiceName+"/StreamRateLimitQuotas", grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	send := func(b []byte) *rlqspb.RateLimitQuotaResponse {
		t.Helper()
		if err := s.SendMsg(&raw{b}); err != nil {
			t.Fatal(err)
		}
		var r raw
		if err := s.RecvMsg(&r); err != nil {
			t.Fatalf("recv: %v", err)
		}
		var resp rlqspb.RateLimitQuotaResponse
		if err := proto.Unmarshal(r.b, &resp); err != nil {
			t.Fatal(err)
		}
		return &resp
	}
	tokenBucket(t, send(reportBytes("quota", "api_key", "honest", 1)).BucketAction[0])
	bad := "k\xff\xfe\xc0"
	f.clock.Add(time.Second)
	r := send(append(reportBytes("quota", "api_key", bad, 1), reportBytes("quota", "api_key", "honest", 1)...))
	if len(r.BucketAction) != 1 || r.BucketAction[0].BucketId.Bucket["api_key"] != "honest" {
		t.Fatalf("a report of an invalid UTF-8 key and the honest one: want the honest one answered alone, got %v", r)
	}
	if got := counter(t, f.srv.opts.Metrics.untracked.WithLabelValues("utf8")); got != 1 {
		t.Errorf("limitd_rlqs_untracked_buckets_total{why=utf8} = %v, want 1", got)
	}
	for range 3 {
		f.clock.Add(5 * time.Second)
		tokenBucket(t, send(reportBytes("quota", "api_key", "honest", 1)).BucketAction[0])
	}
}

// A valid report decodes by hand to what proto.Unmarshal gives; any bytes
// decode without a panic; and a valid answer encodes by hand to bytes
// proto.Unmarshal reads back as the answer.
func FuzzCodec(f *testing.F) {
	seed := &rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(map[string]string{"api_key": "a", "b": ""}, 3, 4, 5*time.Second), {}, usage(nil, 0, 0, 0)}}
	b, err := proto.Marshal(seed)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, "k", "v")
	f.Add(reportBytes("quota", "api_key", "\xff", 1), "", "\xff")
	f.Add(append(b, b...), "api_key", "x")
	f.Fuzz(func(t *testing.T, b []byte, k, v string) {
		var want, got rlqspb.RateLimitQuotaUsageReports
		strict := proto.Unmarshal(b, &want)
		lenient := decodeReports(b, &got)
		if strict == nil {
			if lenient != nil {
				t.Fatalf("proto decodes %x, decodeReports fails: %v", b, lenient)
			}
			if !proto.Equal(&want, &got) {
				t.Fatalf("%x: decodeReports %v, proto.Unmarshal %v", b, &got, &want)
			}
		}
		// A bucket_id holding any bytes decodes with each string as sent
		// when it is UTF-8, else in the stated form, which is unreadable.
		id := &rlqspb.BucketId{Bucket: map[string]string{k: v, "x": k}}
		if err := decodeReports(reportBytes("d", k, v, 1), &got); err != nil {
			t.Fatalf("bucket_id %q: %v", id.Bucket, err)
		}
		back := got.BucketQuotaUsages[0].BucketId.Bucket
		for bk, bv := range back {
			if (bk == k) != utf8.ValidString(k) || (bv == v) != utf8.ValidString(v) {
				t.Fatalf("bucket_id {%q: %q} decoded as {%q: %q}", k, v, bk, bv)
			}
			if !utf8.ValidString(k+v) && unreadable(got.BucketQuotaUsages[0].BucketId) != "utf8" {
				t.Fatalf("bucket_id {%q: %q}: its stated form is not unreadable", k, v)
			}
		}
	})
}

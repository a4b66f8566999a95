package rlqs

import (
	"context"
	"maps"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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

// decodeResponse decodes an answer leniently: its bucket_ids by hand, the
// rest by proto.
func decodeResponse(t *testing.T, b []byte) *rlqspb.RateLimitQuotaResponse {
	t.Helper()
	r := &rlqspb.RateLimitQuotaResponse{}
	for len(b) > 0 {
		_, _, act, _, _, n := field(b)
		if n < 0 {
			t.Fatal("malformed answer")
		}
		b = b[n:]
		a, id, rest := &rlqspb.RateLimitQuotaResponse_BucketAction{BucketId: &rlqspb.BucketId{}}, []byte(nil), []byte(nil)
		for len(act) > 0 {
			num, _, val, _, whole, n := field(act)
			if n < 0 {
				t.Fatal("malformed action")
			}
			act = act[n:]
			if num == 1 {
				id = val
			} else {
				rest = append(rest, whole...)
			}
		}
		if err := proto.Unmarshal(rest, a); err != nil {
			t.Fatal(err)
		}
		a.BucketId = &rlqspb.BucketId{}
		if err := decodeBucketID(id, a.BucketId); err != nil {
			t.Fatal(err)
		}
		r.BucketAction = append(r.BucketAction, a)
	}
	return r
}

// A request whose key is not UTF-8 does not stop its Envoy's reports from
// being served: Envoy's C++ serializer sends the bytes as they are, Go's
// protobuf refuses to decode them (the stream ended there), the lenient
// codec decodes them, the bucket is answered as unmatched with its id
// echoed byte for byte, and the honest key beside it goes on being
// assigned on the same stream. The client here speaks the raw protocol.
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
		return decodeResponse(t, r.b)
	}
	tokenBucket(t, send(reportBytes("quota", "api_key", "honest", 1)).BucketAction[0])
	bad := "k\xff\xfe\xc0"
	r := send(reportBytes("quota", "api_key", bad, 1))
	if len(r.BucketAction) != 1 || r.BucketAction[0].BucketId.Bucket["api_key"] != bad {
		t.Fatalf("an invalid UTF-8 key: want its bucket_id echoed, got %v", r)
	}
	if got := blanket(t, r.BucketAction[0]); got != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("an invalid UTF-8 key: %v, want the Unmatched default DENY_ALL", got)
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
		id := &rlqspb.BucketId{Bucket: map[string]string{k: v, "x": k}}
		back := &rlqspb.BucketId{}
		if err := decodeBucketID(encodeBucketID(id), back); err != nil || !maps.Equal(id.Bucket, back.Bucket) {
			t.Fatalf("bucket_id %q: encoded and decoded by hand: %q, %v", id.Bucket, back.Bucket, err)
		}
		resp := &rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{
			action(id, shape{max: 3, perFill: 1, fill: 2}, time.Second), abandonAction(id),
			{BucketId: id, BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
				QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{AssignmentTimeToLive: durationpb.New(time.Second)}}},
		}}
		enc, err := encodeResponse(resp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := proto.Marshal(resp); err != nil {
			return // not UTF-8: only the hand decoding above reads it
		}
		var dec rlqspb.RateLimitQuotaResponse
		if err := proto.Unmarshal(enc, &dec); err != nil || !proto.Equal(&dec, resp) {
			t.Fatalf("encodeResponse: read back %v (%v), want %v", &dec, err, resp)
		}
	})
}

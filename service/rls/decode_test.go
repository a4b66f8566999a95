package rls

import (
	"bytes"
	"testing"
	"unicode/utf8"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// rlsconfig's default bound on names is the service's --max-key-bytes
// default.
func TestDefaultMaxKeyBytes(t *testing.T) {
	if rlsconfig.DefaultMaxKeyBytes != wire.MaxKeyBytes {
		t.Errorf("rlsconfig.DefaultMaxKeyBytes %d, wire.MaxKeyBytes %d", rlsconfig.DefaultMaxKeyBytes, wire.MaxKeyBytes)
	}
}

// FuzzDecodeRequest holds decodeRequest to its properties: a message
// proto.Unmarshal accepts decodes to what it gives; bytes it refuses only
// for their strings decode with each invalid string in its stated form, the
// rest as sent; what decodes always has valid strings and marshals again;
// nothing panics.
func FuzzDecodeRequest(f *testing.F) {
	seeds := []*pb.RateLimitRequest{
		{Domain: "d", Descriptors: []*rlpb.RateLimitDescriptor{{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "user", Value: "@@"}}}}},
		{Domain: "@@", HitsAddend: 3, Descriptors: []*rlpb.RateLimitDescriptor{
			{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "@@", Value: "x"}, {Key: "k", Value: "@@"}},
				Limit:      &rlpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE},
				HitsAddend: wrapperspb.UInt64(7)},
			{},
		}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(bytes.ReplaceAll(b, []byte("@@"), []byte("\xff\xfe")))
	}
	f.Add([]byte{0x0a, 0x01, 0xc3})                          // a domain cut inside a rune
	f.Add(protowire.AppendTag(nil, 1, protowire.VarintType)) // a tag without its value
	f.Add(append(protowire.AppendTag(nil, 9, protowire.BytesType), 1, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := &pb.RateLimitRequest{}
		strict := proto.Unmarshal(b, want)
		got, err := decodeRequest(b)
		if strict == nil {
			if err != nil || !proto.Equal(got, want) {
				t.Fatalf("a valid message: %v, %v; want %v", got, err, want)
			}
			return
		}
		if err != nil {
			return
		}
		for _, s := range stringsOf(got) {
			if !utf8.ValidString(s) {
				t.Fatalf("an invalid string decoded: %q", s)
			}
		}
		if _, err := proto.Marshal(got); err != nil {
			t.Fatalf("the decoded request does not marshal: %v", err)
		}
	})
}

func stringsOf(r *pb.RateLimitRequest) []string {
	out := []string{r.GetDomain()}
	for _, d := range r.GetDescriptors() {
		for _, e := range d.GetEntries() {
			out = append(out, e.GetKey(), e.GetValue())
		}
	}
	return out
}

// A string that is not UTF-8 decodes in the stated form, the request's
// other fields as sent.
func TestDecodeRequestInvalidUTF8(t *testing.T) {
	req := &pb.RateLimitRequest{Domain: "d", HitsAddend: 2, Descriptors: []*rlpb.RateLimitDescriptor{
		{Entries: []*rlpb.RateLimitDescriptor_Entry{{Key: "user", Value: "@@"}, {Key: "path", Value: "/x"}}, HitsAddend: wrapperspb.UInt64(4)},
	}}
	got, err := decodeRequest(withBytes(t, req, "\xff\xfe"))
	if err != nil {
		t.Fatal(err)
	}
	req.Descriptors[0].Entries[0].Value = rlsconfig.InvalidUTF8("\xff\xfe")
	if !proto.Equal(got, req) {
		t.Errorf("got %v, want %v", got, req)
	}
	if _, err := decodeRequest([]byte{0x0a, 0x05, 'a'}); err == nil {
		t.Error("a truncated message decoded")
	}
}

package rlqs

import (
	"errors"
	"fmt"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-wasm/tokenbucket/internal/protomend"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// Codec is the gRPC codec of the server that carries the quota service
// (grpcdoor.Options.Codec). It is gRPC's proto codec but for a usage report
// Go's protobuf refuses and Envoy's C++ serializer sends: one with a
// proto3 string that is not UTF-8 (a bucket_id value read from a request
// header). Such a report is decoded once its strings that are not UTF-8 are
// replaced by rlsconfig.InvalidUTF8 of their bytes (package protomend, as
// the rate limit service decodes its requests); a bucket_id holding one is
// left unanswered, since Envoy's parser refuses an answer naming its bytes
// (unreadable, stream.go). Every other message goes to the proto codec.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name implements encoding.CodecV2: the proto codec's name, which gRPC
// sends as the content-subtype.
func (Codec) Name() string { return protoenc.Name }

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(protoenc.Name) }

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec().Marshal(v) }

// Unmarshal implements encoding.CodecV2.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := protoCodec().Unmarshal(data, v)
	if r, ok := v.(*rlqspb.RateLimitQuotaUsageReports); ok && err != nil {
		if lerr := decodeReports(data.Materialize(), r); lerr != nil {
			return fmt.Errorf("rlqs: codec: %w", errors.Join(err, lerr))
		}
		return nil
	}
	return err
}

// The strings of a usage report: its domain (1), and in each usage (2) its
// bucket_id's (1) map entries' (1) keys (1) and values (2).
var reportFields = &protomend.Fields{Strings: []protowire.Number{1}, Messages: map[protowire.Number]*protomend.Fields{
	2: {Messages: map[protowire.Number]*protomend.Fields{
		1: {Messages: map[protowire.Number]*protomend.Fields{1: {Strings: []protowire.Number{1, 2}}}},
	}},
}}

// decodeReports decodes b into m: as proto.Unmarshal does when it can, else
// with its strings that are not UTF-8 in rlsconfig.InvalidUTF8's form.
func decodeReports(b []byte, m *rlqspb.RateLimitQuotaUsageReports) error {
	proto.Reset(m)
	if err := proto.Unmarshal(b, m); err == nil {
		return nil
	}
	mended, _, err := protomend.Mend(nil, b, reportFields, func(v []byte) string { return rlsconfig.InvalidUTF8(string(v)) })
	if err != nil {
		return err
	}
	proto.Reset(m)
	return proto.Unmarshal(mended, m)
}

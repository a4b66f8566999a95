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
	"google.golang.org/protobuf/types/known/durationpb"
)

// Codec is the gRPC codec of the server that carries the quota service
// (grpcdoor.Options.Codec). It is gRPC's proto codec but for a usage report
// Go's protobuf refuses and Envoy's C++ serializer sends: one with a
// proto3 string that is not UTF-8 (a bucket_id value read from a request
// header), decoded by hand (decodeReports) to what proto.Unmarshal would
// give if it accepted such strings. A valid report is decoded by proto;
// every other message goes to gRPC's proto codec. No answer names such a
// bucket: Envoy's parser refuses it (report, stream.go).
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
		proto.Reset(r)
		if lerr := decodeReports(data.Materialize(), r); lerr != nil {
			return fmt.Errorf("rlqs: codec: %w", errors.Join(err, lerr))
		}
		return nil
	}
	return err
}

// errWire is a malformed message: not protobuf at all.
var errWire = errors.New("rlqs: codec: malformed protobuf")

// field reads one field of b: its number, type, value (the bytes of a
// length-delimited field, else nil), its varint value, its encoding (tag
// included) and its length n in b, or n < 0.
func field(b []byte) (num protowire.Number, typ protowire.Type, val []byte, u uint64, raw []byte, n int) {
	num, typ, tn := protowire.ConsumeTag(b)
	if tn < 0 {
		return 0, 0, nil, 0, nil, -1
	}
	vn := protowire.ConsumeFieldValue(num, typ, b[tn:])
	if vn < 0 {
		return 0, 0, nil, 0, nil, -1
	}
	switch typ {
	case protowire.BytesType:
		val, _ = protowire.ConsumeBytes(b[tn:])
	case protowire.VarintType:
		u, _ = protowire.ConsumeVarint(b[tn:])
	}
	// The tag re-encoded at its shortest, as proto keeps unknown fields.
	raw = append(protowire.AppendTag(nil, num, typ), b[tn:tn+vn]...)
	return num, typ, val, u, raw, tn + vn
}

// decodeReports decodes b into m as proto.Unmarshal does (later scalars
// win, repeated messages merge, unknown fields kept), keeping strings'
// bytes as they are.
func decodeReports(b []byte, m *rlqspb.RateLimitQuotaUsageReports) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, val, _, raw, n := field(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			m.Domain = string(val)
		case num == 2 && typ == protowire.BytesType:
			u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{}
			if err := decodeUsage(val, u); err != nil {
				return err
			}
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, u)
		default:
			unknown = append(unknown, raw...)
		}
	}
	if len(unknown) > 0 {
		m.ProtoReflect().SetUnknown(unknown)
	}
	return nil
}

func decodeUsage(b []byte, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, val, x, raw, n := field(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			if u.BucketId == nil {
				u.BucketId = &rlqspb.BucketId{}
			}
			if err := decodeBucketID(val, u.BucketId); err != nil {
				return err
			}
		case num == 2 && typ == protowire.BytesType:
			if u.TimeElapsed == nil {
				u.TimeElapsed = &durationpb.Duration{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(val, u.TimeElapsed); err != nil {
				return err
			}
		case num == 3 && typ == protowire.VarintType:
			u.NumRequestsAllowed = x
		case num == 4 && typ == protowire.VarintType:
			u.NumRequestsDenied = x
		default:
			unknown = append(unknown, raw...)
		}
	}
	if len(unknown) > 0 {
		u.ProtoReflect().SetUnknown(unknown)
	}
	return nil
}

func decodeBucketID(b []byte, id *rlqspb.BucketId) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, val, _, raw, n := field(b)
		if n < 0 {
			return errWire
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			unknown = append(unknown, raw...)
			continue
		}
		var k, v string
		for e := val; len(e) > 0; { // a map entry: key 1, value 2
			num, typ, s, _, _, n := field(e)
			if n < 0 {
				return errWire
			}
			e = e[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				k = string(s)
			case num == 2 && typ == protowire.BytesType:
				v = string(s)
			}
		}
		if id.Bucket == nil {
			id.Bucket = map[string]string{}
		}
		id.Bucket[k] = v
	}
	if len(unknown) > 0 {
		id.ProtoReflect().SetUnknown(unknown)
	}
	return nil
}

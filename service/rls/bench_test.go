package rls

import (
	"bytes"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/rlsconfig"
)

// BenchmarkShouldRateLimit is one call of two nested descriptors on the
// memory store, without gRPC: the front door's own cost (lookup,
// translation, statistics) beside the store's.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, algo := range []rlsconfig.Algorithm{rlsconfig.TokenBucket, rlsconfig.FixedWindow} {
		b.Run(algo.String(), func(b *testing.B) {
			c, err := rlsconfig.Parse([]rlsconfig.File{{Name: "c.yaml", Data: []byte(featuresYAML)}})
			if err != nil {
				b.Fatal(err)
			}
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			now := time.Unix(1_800_000_000, 0)
			st := service.NewMemoryStore(service.MemoryOptions{Now: func() int64 { return now.UnixNano() }})
			srv, err := NewServer(Options{Store: st, Algorithm: algo, Now: func() time.Time { return now }, Logger: quiet, Metrics: m})
			if err != nil {
				b.Fatal(err)
			}
			srv.SetConfig(c)
			req := request("rl", desc("source_cluster", "proxy", "destination_cluster", "other"), desc("wild", "foo1"))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := srv.ShouldRateLimit(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeRequest is the handler's decoding of one request of two
// nested descriptors: valid (strict, as the generated handler decodes, plus
// the copy of its bytes as unknown fields), and with a value not UTF-8
// (strict, mended, strict again).
func BenchmarkDecodeRequest(b *testing.B) {
	req := request("rl", desc("source_cluster", "proxy", "destination_cluster", "@@"), desc("wild", "foo1"))
	valid, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	invalid := bytes.ReplaceAll(valid, []byte("@@"), []byte("\xff\xfe"))
	for _, tc := range []struct {
		name string
		wire []byte
	}{{"valid", valid}, {"invalid-utf8", invalid}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				raw := &emptypb.Empty{}
				if err := proto.Unmarshal(tc.wire, raw); err != nil {
					b.Fatal(err)
				}
				if _, err := decodeRequest(raw.ProtoReflect().GetUnknown()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("generated", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(valid, &pb.RateLimitRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

package rls

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

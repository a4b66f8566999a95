// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// How the quota service divides plain per-second limits (envoyproxy/
// ratelimit's YAML without the burst extension: a burst of one second of
// rate) on Envoy 1.40, which reports every 5 s.

// rlqsPlainLimits: 100 a second and 20 a second per key, no burst, and the
// issue's 40 a minute.
const rlqsPlainLimits = `domain: ` + rlqsDomain + `
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: plain20
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 40}
`

func startPlainLimitd(t *testing.T) *rlqsLimitd {
	t.Helper()
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte(rlqsPlainLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	return startLimitdWith(t, redis.Addr(), cfg)
}

// TestRLQSPlainLimit: a limit of 100 a second from the plain YAML, one
// Envoy asking 20 a second for 20 s: at least 95% admitted once the key's
// first assignment came (before: 228 of 400, the TTLs cut below Envoy's
// cadence).
func TestRLQSPlainLimit(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	svc := startPlainLimitd(t)
	envoys, ok := quotaEnvoys(t, 1, svc.grpcPort, rlqsQuota("plain", "x-plain"))
	if !ok {
		return
	}
	f := newFleet(t, envoys, "x-plain", "k")
	f.untilAdmitted(0)
	from := f.now()
	n0 := len(f.log)
	f.drive(0, 20, 20*time.Second)
	to := f.now()
	asked := len(f.log) - n0
	got := f.admitted(0, from, to+time.Second)
	t.Logf("100/s plain, asked 20/s for 20 s: %d of %d admitted (%.1f%%)", got, asked, 100*float64(got)/float64(asked))
	if float64(got) < 0.95*float64(asked) {
		t.Errorf("admitted %d of %d, want at least 95%%", got, asked)
		t.Log(f.timeline())
	}
	f.checkBound(100, 100)
}

// TestRLQSOverLimit: two Envoys each asking 20 a second of a plain limit of
// 20 a second (burst 20) for 80 s: the fleet never admits more than
// burst + rate × t, and, past the first four reports (the first Envoy's
// first assignment lapsing), at least 90% of the rate.
func TestRLQSOverLimit(t *testing.T) {
	envoytest.Needs(t, false)
	t.Parallel() // wall-clock bound (reports every 5 s): beside the others of its kind
	svc := startPlainLimitd(t)
	envoys, ok := quotaEnvoys(t, 2, svc.grpcPort, rlqsQuota("plain20", "x-plain"))
	if !ok {
		return
	}
	f := newFleet(t, envoys, "x-plain", "k")
	f.untilAdmitted(0)
	f.untilAdmitted(1)
	start := f.now()
	var wg sync.WaitGroup
	for i := range envoys {
		wg.Go(func() { f.drive(i, 20, 80*time.Second) })
	}
	wg.Wait()
	end := f.now()
	settled := start + 4*rlqsInterval
	all := f.admitted(-1, start, end)
	late := f.admitted(-1, settled, end)
	t.Logf("two Envoys asking 20/s each of 20/s plain for %v: %d admitted (%.1f%% of the rate); after %v: %d (%.1f%%); Envoy 0 %d, Envoy 1 %d",
		(end - start).Round(time.Second), all, 100*float64(all)/(20*(end-start).Seconds()), 4*rlqsInterval, late,
		100*float64(late)/(20*(end-settled).Seconds()), f.admitted(0, start, end), f.admitted(1, start, end))
	if float64(late) < 0.9*20*(end-settled).Seconds() {
		t.Errorf("admitted %d over %v once settled, want at least 90%% of the rate", late, end-settled)
		t.Log(f.timeline())
	}
	f.checkBound(20, 20)
}

// TestRLQSChurningGateway: clients speaking RLQS on limitd's port open a
// stream, report a large demand on an honest Envoy's key and close it,
// again and again (clean churn, one at a time, at most 200,000 streams,
// 90 s); the honest
// Envoy asks 2 a second of the key's 40 a minute and still admits at least
// 80% of its fair half (0.33 a second) over the last minute (before: 0.02 a
// second against 300,000 streams).
func TestRLQSChurningGateway(t *testing.T) {
	envoytest.Needs(t, false)
	t.Parallel() // wall-clock bound (reports every 5 s): beside the others of its kind
	svc := startPlainLimitd(t)
	envoys, ok := quotaEnvoys(t, 1, svc.grpcPort, rlqsQuota("api_key", "x-api-key"))
	if !ok {
		return
	}
	f := newFleet(t, envoys, "x-api-key", "honest")
	f.untilAdmitted(0)
	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(svc.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const d = 90 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var streams atomic.Int64
	var wg sync.WaitGroup
	report := &rlqspb.RateLimitQuotaUsageReports{Domain: rlqsDomain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"api_key": "honest"}},
		TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 100, NumRequestsDenied: 10000,
	}}}
	for range 1 { // one stream at a time (the honest Envoy's fair share is then half), 200,000 at most
		wg.Go(func() {
			for streams.Add(1) <= 200000 && ctx.Err() == nil {
				s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
				if err != nil {
					return
				}
				if s.Send(report) != nil {
					return
				}
				if _, err := s.Recv(); err != nil {
					return
				}
				_ = s.CloseSend()
				_, _ = s.Recv() // the stream's end
			}
		})
	}
	start := f.now()
	f.drive(0, 2, d)
	cancel()
	wg.Wait()
	end := f.now()
	from := end - time.Minute
	got := f.admitted(0, from, end)
	fair := 40.0 / 60 / 2 * (end - from).Seconds()
	t.Logf("the honest Envoy asking 2/s against %d churned streams over %v: %d admitted in the last minute (%.2f/s; fair half %.2f/s)",
		min(streams.Load(), 200000), (end - start).Round(time.Second), got, float64(got)/(end-from).Seconds(), 40.0/60/2)
	if float64(got) < 0.8*fair {
		t.Errorf("the honest Envoy admitted %d in the last minute, want at least 80%% of its fair half (%.0f)", got, fair)
		t.Log(f.timeline())
	}
	f.checkBound(40, 40.0/60)
}

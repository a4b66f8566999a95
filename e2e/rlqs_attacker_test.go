// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ratelimit-wasm/tokenbucket/internal/testing/envoytest"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/redistest"
)

// rawCodec sends and receives a gRPC message's bytes as they are.
type rawCodec struct{}

type rawMsg struct{ b []byte }

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

// rawReport encodes a usage report of the domain by hand: one usage a
// value of api_key, each with one request allowed, whatever the values'
// bytes.
func rawReport(domain string, values []string) []byte {
	r := protowire.AppendTag(nil, 1, protowire.BytesType)
	r = protowire.AppendString(r, domain)
	for _, v := range values {
		var entry, id, u []byte
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendString(entry, "api_key")
		entry = protowire.AppendTag(entry, 2, protowire.BytesType)
		entry = protowire.AppendString(entry, v)
		id = protowire.AppendTag(id, 1, protowire.BytesType)
		id = protowire.AppendBytes(id, entry)
		u = protowire.AppendTag(u, 1, protowire.BytesType)
		u = protowire.AppendBytes(u, id)
		u = protowire.AppendTag(u, 3, protowire.VarintType)
		u = protowire.AppendVarint(u, 1)
		r = protowire.AppendTag(r, 2, protowire.BytesType)
		r = protowire.AppendBytes(r, u)
	}
	return r
}

// TestRLQSAttacker: a client speaking the raw protocol to limitd's gRPC
// port opens 8 quota streams and floods each with 300 reports of 64 new
// buckets (19,200 a stream against a bound of 512, far past the report
// budget), every tenth with a bucket_id that is not UTF-8. No stream is
// ended for it, and an Envoy's honest key, asked at 30 a minute against
// its limit of 40, is admitted meanwhile. Once the attacker leaves, its
// streams are gone from limitd_rlqs_streams.
func TestRLQSAttacker(t *testing.T) {
	t.Parallel()
	envoytest.Needs(t, false)
	redis := redistest.Start(t)
	svc := startRLQSLimitd(t, redis.Addr())
	envoys, ok := quotaEnvoys(t, 1, svc.grpcPort, rlqsQuota("api_key", "x-api-key"))
	if !ok {
		return
	}
	f := newFleet(t, envoys, "x-api-key", "honest")
	f.untilAdmitted(0)
	metric := func(name string) float64 { return limitdCounter(t, svc.httpPort, name) }

	conn, err := grpc.NewClient("127.0.0.1:"+strconv.Itoa(svc.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const streams, reports, perReport = 8, 300, 64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ended []error // statuses the attacker's streams ended with before it left
	answers := 0
	for s := range streams {
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
			"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas", grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { // the answers, until the stream ends
			for {
				var m rawMsg
				if err := st.RecvMsg(&m); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						ended = append(ended, fmt.Errorf("stream %d: %w", s, err))
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				answers++
				mu.Unlock()
			}
		})
		wg.Go(func() {
			for r := range reports {
				values := make([]string, perReport)
				for i := range values {
					values[i] = fmt.Sprintf("atk-%d-%d-%d", s, r, i)
				}
				if r%10 == 0 {
					values[0] = fmt.Sprintf("atk-\xff\xfe-%d-%d", s, r)
				}
				if err := st.SendMsg(&rawMsg{rawReport(rlqsDomain, values)}); err != nil {
					return // the stream ended: recorded by the reader
				}
			}
		})
	}
	from := f.now()
	const asked = 20
	for range asked { // the honest key, 2 s apart: 30 a minute against 40
		f.get(0)
		time.Sleep(2 * time.Second) // pacing the honest key, 20 steps
	}
	got := f.admitted(0, from, f.now()+1)
	open := metric("limitd_rlqs_streams")
	mu.Lock()
	gotEnded, gotAnswers := len(ended), answers
	for _, err := range ended {
		t.Errorf("an attacker's stream ended: %v", err)
	}
	mu.Unlock()
	t.Logf("the attacker's %d streams (%d reports of %d new buckets each): %d answers, %d ended; limitd: %v streams open, over budget %v, untracked %v (not UTF-8 %v); the honest key admitted %d of %d",
		streams, reports, perReport, gotAnswers, gotEnded, open, metric("limitd_rlqs_reports_over_budget_total"),
		metric(`limitd_rlqs_untracked_buckets_total{why="max_buckets"}`)+metric(`limitd_rlqs_untracked_buckets_total{why="over_budget"}`),
		metric(`limitd_rlqs_untracked_buckets_total{why="utf8"}`), got, asked)
	if open != streams+1 {
		t.Errorf("limitd_rlqs_streams %v with the attacker's %d and the Envoy's, want %d", open, streams, streams+1)
	}
	if got < asked*3/4 {
		t.Errorf("the honest key admitted %d of %d asked below its limit during the flood, want at least %d", got, asked, asked*3/4)
	}
	cancel()
	wg.Wait()
	deadline := time.Now().Add(rlqsWait)
	for metric("limitd_rlqs_streams") != 1 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // waiting for the handlers to end, bounded by the deadline
	}
	if n := metric("limitd_rlqs_streams"); n != 1 {
		t.Errorf("after the attacker left: limitd_rlqs_streams %v, want 1 (the Envoy's)", n)
	}
	f.checkBound(40, 40.0/60)
}

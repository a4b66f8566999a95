// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package ratelimit

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// hostileADS is an ADS server that speaks the protocol as its test likes.
type hostileADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	streams atomic.Int32
	serve   func(n int32, s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error
}

func (h *hostileADS) StreamAggregatedResources(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return h.serve(h.streams.Add(1), s)
}

const rlcType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

func hostileResponse(t *testing.T, version string, rs ...*rlsconf.RateLimitConfig) *discovery.DiscoveryResponse {
	t.Helper()
	resp := &discovery.DiscoveryResponse{VersionInfo: version, Nonce: version, TypeUrl: rlcType}
	for _, r := range rs {
		a, err := anypb.New(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

func hostileLimit(domain string, n uint32, values int) *rlsconf.RateLimitConfig {
	c := &rlsconf.RateLimitConfig{Name: domain, Domain: domain}
	for i := range values {
		c.Descriptors = append(c.Descriptors, &rlsconf.RateLimitDescriptor{Key: "k", Value: fmt.Sprint("v", i),
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: n}})
	}
	return c
}

// TestXDSHostileServer runs limitd (the process) on an ADS server that,
// after a good configuration, sends the wrong type, a resource that does
// not decode, a response over the 4 MiB bound, and on the next stream a
// flood of responses and then silence: limitd NACKs what it refuses,
// drops the stream the big response came on and connects again, answers
// every response of the flood, and the last good configuration decides
// throughout.
func TestXDSHostileServer(t *testing.T) {
	t.Parallel()
	const flood = 300
	floodDone := make(chan int, 1)
	h := &hostileADS{serve: func(n int32, s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if n > 2 {
			<-s.Context().Done()
			return nil
		}
		send := func(r *discovery.DiscoveryResponse) (*discovery.DiscoveryRequest, error) {
			if err := s.Send(r); err != nil {
				return nil, err
			}
			return s.Recv()
		}
		if _, err := send(hostileResponse(t, fmt.Sprint("good-", n), hostileLimit("d", 3, 1))); err != nil {
			return err
		}
		if n == 1 {
			for _, r := range []*discovery.DiscoveryResponse{
				{VersionInfo: "cluster", Nonce: "cluster", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"},
				{VersionInfo: "garbage", Nonce: "garbage", TypeUrl: rlcType, Resources: []*anypb.Any{{TypeUrl: rlcType, Value: []byte("\xff\xff\xff")}}},
			} {
				if req, err := send(r); err != nil || req.GetErrorDetail() == nil {
					return fmt.Errorf("%s: %v, %v", r.VersionInfo, req, err)
				}
			}
			// 6 MiB of descriptors: over the client's bound.
			if err := s.Send(hostileResponse(t, "huge", hostileLimit("d", 1, 300_000))); err != nil {
				return err
			}
			_, err := s.Recv() // the client hangs up
			return err
		}
		go func() {
			for i := range flood {
				if s.Send(hostileResponse(t, fmt.Sprint("flood-", i), hostileLimit("d", uint32(3+i%2), 1))) != nil {
					return
				}
			}
		}()
		acks := 0
		for acks < flood {
			req, err := s.Recv()
			if err != nil {
				return err
			}
			if req.GetErrorDetail() == nil {
				acks++
			}
		}
		floodDone <- acks
		<-s.Context().Done()
		return nil
	}}
	g := grpc.NewServer(grpc.MaxSendMsgSize(64 << 20))
	discovery.RegisterAggregatedDiscoveryServiceServer(g, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)

	lim := startLimitdWith(t, limitdBinary(t), []string{"--rls-xds-server", ln.Addr().String(), "--rls-algorithm", "fixed_window"}, nil, true)
	select {
	case n := <-floodDone:
		if n != flood {
			t.Errorf("%d ACKs of the flood, want %d", n, flood)
		}
	case <-time.After(2 * waitTimeout):
		t.Fatalf("the flood was not answered:\n%s", lim.log())
	}
	r, err := lim.call("d", 1, entries{"k", "v0"})
	if err != nil || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 4 {
		t.Errorf("after the flood: %v, %v; want the last response's limit, 4", r, err)
	}
	log := lim.log()
	for _, want := range []string{"xds configuration refused (NACK)", "rlsxds: type_url", "rlsxds: resources[0]",
		"ResourceExhausted", "xds stream ended"} {
		if !strings.Contains(log, want) {
			t.Errorf("limitd's log lacks %q", want)
		}
	}
	if h.streams.Load() < 2 {
		t.Errorf("%d streams: limitd did not connect again", h.streams.Load())
	}
}

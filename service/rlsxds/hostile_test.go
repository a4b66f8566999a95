package rlsxds

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// hostile is an ADS server whose stream is the test's own: it speaks the
// protocol as it likes.
type hostile struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	serve func(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error
}

func (h *hostile) StreamAggregatedResources(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return h.serve(s)
}

func startHostile(t *testing.T, serve func(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error) string {
	t.Helper()
	g := grpc.NewServer(grpc.MaxSendMsgSize(64 << 20))
	discovery.RegisterAggregatedDiscoveryServiceServer(g, &hostile{serve: serve})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String()
}

// response is a DiscoveryResponse of version holding rs.
func response(t *testing.T, version string, rs ...*rlsconf.RateLimitConfig) *discovery.DiscoveryResponse {
	t.Helper()
	return &discovery.DiscoveryResponse{VersionInfo: version, Nonce: "n" + version, TypeUrl: TypeURL, Resources: anys(t, rs...)}
}

// good is the configuration every hostile server first serves.
func good(t *testing.T) *discovery.DiscoveryResponse {
	return response(t, "good", domain("a", "gw", limit("k", "v", 2, rlsconf.RateLimitUnit_MINUTE)))
}

// hostileClient runs a plaintext client of addr with a small message bound.
func hostileClient(t *testing.T, addr string, tg *target, w *waits, log *logBuffer) *Client {
	t.Helper()
	c, err := New(Options{Server: addr, NodeID: "envoy-ratelimit", Apply: tg.srv.SetConfig, Loaded: tg.m.ConfigLoaded,
		MaxMessageBytes: 64 << 10, Wait: w.wait, Rand: func() float64 { return 0 }, Logger: slogTo(log)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	return c
}

// serving checks that the good configuration still answers.
func serving(t *testing.T, tg *target) {
	t.Helper()
	r, err := tg.call("gw", "k", "v")
	if err != nil || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Errorf("the good configuration does not serve: %v, %v", r, err)
	}
}

// An ADS server that sends the wrong type, a resource of another type,
// and a resource that does not decode gets a NACK naming each, and the
// good configuration serves on.
func TestHostileWrongTypes(t *testing.T) {
	other, _ := anypb.New(&pb.RateLimitRequest{Domain: "x"})
	nacks := make(chan string, 8)
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		for _, r := range []*discovery.DiscoveryResponse{
			good(t),
			{VersionInfo: "2", Nonce: "n2", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"},
			{VersionInfo: "3", Nonce: "n3", TypeUrl: TypeURL, Resources: []*anypb.Any{other}},
			{VersionInfo: "4", Nonce: "n4", TypeUrl: TypeURL, Resources: []*anypb.Any{{TypeUrl: TypeURL, Value: []byte("garbage")}}},
		} {
			if err := s.Send(r); err != nil {
				return err
			}
			req, err := s.Recv()
			if err != nil {
				return err
			}
			nacks <- fmt.Sprintf("%s %s %s", req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail().GetMessage())
		}
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	log := &logBuffer{}
	w := newWaits()
	waited := w.auto(t)
	hostileClient(t, addr, tg, w, log)
	for i, want := range []string{"ngood good ", "n2 good rlsxds: type_url", "n3 good rlsxds: resources[0].type_url", "n4 good rlsxds: resources[0]: "} {
		select {
		case got := <-nacks:
			if !strings.HasPrefix(got, want) {
				t.Errorf("answer %d: %q, want it to start %q", i, got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("answer %d: none within 30s", i)
		}
	}
	serving(t, tg)
	if len(waited) != 2 {
		t.Errorf("%d back-offs, want 2 (before the second and the third refusal)", len(waited))
	}
	if tg.loads(t, "error") != 3 || !strings.Contains(log.String(), "NACK") {
		t.Errorf("refused loads %v; log %s", tg.loads(t, "error"), log)
	}
}

// A response over the message bound ends the stream (it is never
// decoded): the client backs off and the good configuration serves on.
func TestHostileHugeResponse(t *testing.T) {
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(good(t)); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
		ds := make([]*rlsconf.RateLimitDescriptor, 0, 20000)
		for i := range cap(ds) {
			ds = append(ds, limit("k", fmt.Sprint(i), 1, rlsconf.RateLimitUnit_SECOND))
		}
		if err := s.Send(response(t, "huge", domain("a", "gw", ds...))); err != nil {
			return err
		}
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	w := newWaits()
	log := &logBuffer{}
	c := hostileClient(t, addr, tg, w, log)
	w.next(t)
	awaitConfigured(t, c)
	serving(t, tg)
	if !strings.Contains(log.String(), "ResourceExhausted") || !strings.Contains(log.String(), "xds stream ended") {
		t.Errorf("log: %s", log)
	}
}

// A flood of responses, each a new version, is answered one by one in
// order (a response is handled before the next is read): each ACKed, the
// last one serving.
func TestHostileFlood(t *testing.T) {
	const n = 500
	acks := make(chan int, 1)
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		go func() { // send without waiting for the answers
			for i := range n {
				if err := s.Send(response(t, fmt.Sprint(i), domain("a", "gw", limit("k", "v", uint32(i+1), rlsconf.RateLimitUnit_MINUTE)))); err != nil {
					return
				}
			}
		}()
		got := 0
		for got < n {
			req, err := s.Recv()
			if err != nil {
				return err
			}
			if req.GetErrorDetail() != nil || req.GetVersionInfo() != fmt.Sprint(got) {
				return fmt.Errorf("answer %d: %v", got, req)
			}
			got++
		}
		acks <- got
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	hostileClient(t, addr, tg, newWaits(), &logBuffer{})
	select {
	case got := <-acks:
		if got != n {
			t.Errorf("%d ACKs, want %d", got, n)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the flood was not answered within 60s")
	}
	r, err := tg.call("gw", "k", "v")
	if err != nil || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != n {
		t.Errorf("after the flood: %v, %v", r, err)
	}
	if tg.loads(t, "success") != n {
		t.Errorf("loads %v, want %d", tg.loads(t, "success"), n)
	}
}

// A stream that never answers is not an error: the client waits on it,
// unconfigured, without backing off.
func TestHostileSilent(t *testing.T) {
	opened := make(chan struct{})
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		close(opened)
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	w := newWaits()
	c := hostileClient(t, addr, tg, w, &logBuffer{})
	<-opened
	select {
	case <-c.Configured():
		t.Error("configured by a silent server")
	case d := <-w.asked:
		t.Errorf("backed off %v on a silent stream", d)
	default:
	}
}

// A server that writes garbage instead of HTTP/2 fails the stream: the
// client logs it and backs off, doubling, and connects again.
func TestHostileGarbage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	accepted := make(chan struct{}, 64)
	go func() {
		for ctx.Err() == nil {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			_, _ = conn.Write([]byte(strings.Repeat("\x00garbage\xff", 1000)))
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { cancel(); _ = ln.Close() })
	tg := newTarget(t)
	w := newWaits()
	log := &logBuffer{}
	c, err := New(Options{Server: ln.Addr().String(), Apply: tg.srv.SetConfig, Wait: w.wait, Rand: func() float64 { return 0 },
		Backoff: Backoff{Initial: time.Second, Max: 4 * time.Second}, Logger: slogTo(log)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second} {
		if d := w.next(t); d != want {
			t.Errorf("back-off %d: %v, want %v", i, d, want)
		}
		w.release <- struct{}{}
	}
	if len(accepted) < 2 || !strings.Contains(log.String(), "Unavailable") {
		t.Errorf("%d connections; log %s", len(accepted), log)
	}
	select {
	case <-c.Configured():
		t.Error("configured by garbage")
	default:
	}
}

// A server that sends a refused response again on each NACK (as a
// snapshot cache does while its snapshot's version is not the one ACKed)
// gets each repeat NACKed after a back-off, doubling, and the refusal is
// logged and counted once: the loop is bounded by the back-off, not by how
// fast the server answers.
func TestHostileRepeatsRefused(t *testing.T) {
	const repeats = 4
	nacked := make(chan int, 1)
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(good(t)); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
		bad := response(t, "bad", domain("a", "gw", limit("k", "v", 1, rlsconf.RateLimitUnit_UNKNOWN)))
		n := 0
		for range repeats + 1 {
			if err := s.Send(bad); err != nil {
				return err
			}
			req, err := s.Recv()
			if err != nil {
				return err
			}
			if req.GetErrorDetail() != nil {
				n++
			}
		}
		nacked <- n
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	w := newWaits()
	log := &logBuffer{}
	hostileClient(t, addr, tg, w, log)
	// Backoff{1s, 30s} (the default), Rand 0: half of 1s, 1s, 2s, 4s.
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second} {
		if d := w.next(t); d != want {
			t.Errorf("repeat %d: waited %v, want %v", i+1, d, want)
		}
		w.release <- struct{}{}
	}
	select {
	case n := <-nacked:
		if n != repeats+1 {
			t.Errorf("%d NACKs, want %d", n, repeats+1)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the repeats were not answered within 30s")
	}
	serving(t, tg)
	if got := strings.Count(log.String(), "NACK"); got != 1 || tg.loads(t, "error") != 1 {
		t.Errorf("%d NACKs logged, %v counted; want 1 and 1:\n%s", got, tg.loads(t, "error"), log)
	}
}

// Refused responses in a row that differ (a server alternating two bad
// snapshots) are each read, logged and counted, and each NACK after the
// first waits a back-off: refusals cost at most one conversion per wait.
func TestHostileAlternatingRefused(t *testing.T) {
	nacked := make(chan int, 1)
	addr := startHostile(t, func(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
		if _, err := s.Recv(); err != nil {
			return err
		}
		if err := s.Send(good(t)); err != nil {
			return err
		}
		if _, err := s.Recv(); err != nil {
			return err
		}
		bad := []*discovery.DiscoveryResponse{
			response(t, "bad-1", domain("a", "gw", limit("k", "v", 1, rlsconf.RateLimitUnit_UNKNOWN))),
			response(t, "bad-2", domain("a", "")),
		}
		n := 0
		for i := range 4 {
			if err := s.Send(bad[i%2]); err != nil {
				return err
			}
			req, err := s.Recv()
			if err != nil {
				return err
			}
			if req.GetErrorDetail() != nil {
				n++
			}
		}
		nacked <- n
		<-s.Context().Done()
		return nil
	})
	tg := newTarget(t)
	w := newWaits()
	log := &logBuffer{}
	hostileClient(t, addr, tg, w, log)
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second} {
		if d := w.next(t); d != want {
			t.Errorf("refusal %d: waited %v, want %v", i+2, d, want)
		}
		w.release <- struct{}{}
	}
	select {
	case n := <-nacked:
		if n != 4 {
			t.Errorf("%d NACKs, want 4", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the refusals were not answered within 30s")
	}
	serving(t, tg)
	if got := strings.Count(log.String(), "NACK"); got != 4 || tg.loads(t, "error") != 4 {
		t.Errorf("%d NACKs logged, %v counted; want 4 and 4", got, tg.loads(t, "error"))
	}
}

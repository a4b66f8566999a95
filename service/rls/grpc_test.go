package rls

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-wasm/tokenbucket/service"
	"github.com/ratelimit-wasm/tokenbucket/service/grpcdoor"
)

// With tokens, a call needs "authorization: Bearer <token>" in its
// metadata; the caller's name labels the authorized calls. The health
// service needs none.
func TestAuthMetadata(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now,
		tokens: []service.Token{{Name: "gw-a", Value: "secret-a"}, {Name: "gw-b", Value: "secret-b"}}})
	for name, md := range map[string][]string{
		"none":         nil,
		"wrong token":  {"authorization", "Bearer nope"},
		"no scheme":    {"authorization", "secret-a"},
		"basic":        {"authorization", "Basic secret-a"},
		"two headers":  {"authorization", "Bearer secret-a", "authorization", "Bearer secret-a"},
		"empty bearer": {"authorization", "Bearer "},
	} {
		ctx := t.Context()
		if md != nil {
			ctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		_, err := f.try(ctx, request("apis", desc("generic_key", "slow")))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
	for _, tok := range []string{"Bearer secret-a", "bearer secret-b", "Bearer secret-b"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", tok)
		if _, err := f.try(ctx, request("apis", desc("generic_key", "slow"))); err != nil {
			t.Errorf("%s: %v", tok, err)
		}
	}
	if got := f.counter("limitd_rls_authorized_calls_total", map[string]string{"caller": "gw-b"}); got != 2 {
		t.Errorf("gw-b's calls %v, want 2", got)
	}
	if got := f.counter("limitd_rls_unauthenticated_calls_total", nil); got != 6 {
		t.Errorf("unauthenticated %v, want 6", got)
	}
	h := healthpb.NewHealthClient(f.conn)
	if _, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: ServiceName}); err != nil {
		t.Errorf("health without a token: %v", err)
	}
}

// The health service answers NOT_SERVING until the store is ready, then
// SERVING, for the server ("") and the rate limit service's name; it
// follows the store's Ping.
func TestHealth(t *testing.T) {
	st := &flaky{Store: memory(newClock(epoch)), err: errors.New("service: redis: not yet")}
	f := start(t, basicYAML, fixtureOpts{store: st})
	h := healthpb.NewHealthClient(f.conn)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, name := range []string{"", ServiceName} {
			r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil || r.Status != want {
				t.Fatalf("health %q: %v %v, want %v", name, r, err, want)
			}
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	if err := f.grpc.CheckStore(t.Context(), st, time.Second); err == nil {
		t.Fatal("the failing ping answered nil")
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	st.err = nil
	if err := f.grpc.CheckStore(t.Context(), st, time.Second); err != nil {
		t.Fatal(err)
	}
	check(healthpb.HealthCheckResponse_SERVING)
	st.err = errors.New("service: redis: gone")
	_ = f.grpc.CheckStore(t.Context(), st, time.Second)
	check(healthpb.HealthCheckResponse_NOT_SERVING)
}

// flaky is a store whose Ping answers err.
type flaky struct {
	service.Store
	err error
}

func (f *flaky) Ping(context.Context) error { return f.err }

// Messages over the size bound are refused before they are parsed.
func TestMessageBound(t *testing.T) {
	c := newClock(epoch)
	f := start(t, basicYAML, fixtureOpts{store: memory(c), now: c.Now})
	_, err := f.try(t.Context(), request("apis", desc("generic_key", strings.Repeat("x", grpcdoor.DefaultMaxRecvBytes))))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a %d-byte message: %v, want ResourceExhausted", grpcdoor.DefaultMaxRecvBytes, err)
	}
}

package service

import (
	"context"
	"strings"
	"testing"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// TestShadowBucketsDecidedAlone: a shadow bucket is decided on its own,
// beside the request's atomic decision: it never refuses the request, is
// consumed when it alone admits, and an enforced refusal does not stop it
// (nor it an enforced admission).
func TestShadowBucketsDecidedAlone(t *testing.T) {
	now := int64(1_800_000_000_000_000_000)
	t.Run("memory", func(t *testing.T) {
		testShadowBuckets(t, NewMemoryStore(MemoryOptions{Now: func() int64 { return now }}))
	})
	t.Run("redis", func(t *testing.T) {
		_, _, st := newMini(t, RedisOptions{})
		testShadowBuckets(t, st)
	})
}

func testShadowBuckets(t *testing.T, st Store) {
	req := &wire.Request{Buckets: []wire.Bucket{
		{Key: "enforced", Rate: 0.001, Burst: 2, Cost: 1},
		{Key: "trial", Rate: 0.001, Burst: 1, Cost: 1, Shadow: true},
	}}
	steps := []struct {
		allowed, enforced, shadow bool
	}{
		{true, true, true},    // both have tokens
		{true, true, false},   // the shadow bucket is empty: the request is still admitted
		{false, false, false}, // the enforced bucket is empty: refused
	}
	for i, want := range steps {
		a, _, err := Decide(context.Background(), st, req)
		if err != nil {
			t.Fatal(err)
		}
		if a.Allowed != want.allowed || a.Buckets[0].Allowed != want.enforced || a.Buckets[1].Allowed != want.shadow {
			t.Fatalf("step %d: %+v, want allowed %v, enforced %v, shadow %v", i, a, want.allowed, want.enforced, want.shadow)
		}
	}
	only := &wire.Request{Buckets: []wire.Bucket{{Key: "trial2", Rate: 0.001, Burst: 1, Cost: 1, Shadow: true}}}
	for i, wantShadow := range []bool{true, false} {
		a, _, err := Decide(context.Background(), st, only)
		if err != nil || !a.Allowed || a.Buckets[0].Allowed != wantShadow {
			t.Fatalf("shadow only, step %d: %+v %v; want admitted, shadow bucket %v", i, a, err, wantShadow)
		}
	}
}

// TestShadowErrorNeverFailsTheDecision: a shadow bucket whose own script
// fails in Redis (a malformed stored value) leaves the enforced decision as
// it was taken (admitted, consumed) and is counted as a shadow error; the
// server answers 200, not 503.
func TestShadowErrorNeverFailsTheDecision(t *testing.T) {
	m, _, rs := newMini(t, RedisOptions{})
	if err := m.Set(storageKey(DefaultKeyPrefix, "trial", 1, 1), "garbage"); err != nil {
		t.Fatal(err)
	}
	s, reg := newTestServer(t, rs, "")
	body := `{"buckets":[{"key":"enforced","tokens_per_second":1,"burst":2},{"key":"trial","tokens_per_second":1,"burst":1,"shadow":true}]}`
	w := do(s, "POST", "/v1/decide", body)
	if w.Code != 200 || !strings.HasPrefix(w.Body.String(), `{"allowed":true`) {
		t.Fatalf("decide with a failing shadow bucket: %d %s, want 200 admitted", w.Code, w.Body)
	}
	if d, err := rs.Decide(context.Background(), one("enforced", 1, 2, 1)); err != nil || d.Buckets[0].Remaining != 0 {
		t.Fatalf("enforced bucket after = %+v, %v: want its token consumed once", d, err)
	}
	if got := gatherCounter(t, reg, "limitd_shadow_errors_total"); got != 1 {
		t.Errorf("limitd_shadow_errors_total = %v, want 1", got)
	}
	if got := gatherCounter(t, reg, "limitd_store_errors_total"); got != 0 {
		t.Errorf("limitd_store_errors_total = %v, want 0", got)
	}
}

func TestDecodeShadow(t *testing.T) {
	req, err := wire.DecodeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1},{"key":"b","tokens_per_second":1,"burst":1,"shadow":true}]}`), wire.Limits{})
	if err != nil || req.Buckets[0].Shadow || !req.Buckets[1].Shadow {
		t.Fatalf("%+v, %v", req, err)
	}
	if _, err := wire.DecodeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"shadow":1}]}`), wire.Limits{}); err == nil {
		t.Fatal("shadow: 1 accepted")
	}
}

package service

import (
	"context"
	"testing"
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
	req := &Request{Buckets: []Bucket{
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
		a, err := decide(context.Background(), st, req)
		if err != nil {
			t.Fatal(err)
		}
		if a.Allowed != want.allowed || a.Buckets[0].Allowed != want.enforced || a.Buckets[1].Allowed != want.shadow {
			t.Fatalf("step %d: %+v, want allowed %v, enforced %v, shadow %v", i, a, want.allowed, want.enforced, want.shadow)
		}
	}
	only := &Request{Buckets: []Bucket{{Key: "trial2", Rate: 0.001, Burst: 1, Cost: 1, Shadow: true}}}
	for i, wantShadow := range []bool{true, false} {
		a, err := decide(context.Background(), st, only)
		if err != nil || !a.Allowed || a.Buckets[0].Allowed != wantShadow {
			t.Fatalf("shadow only, step %d: %+v %v; want admitted, shadow bucket %v", i, a, err, wantShadow)
		}
	}
}

func TestDecodeShadow(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1},{"key":"b","tokens_per_second":1,"burst":1,"shadow":true}]}`), Limits{})
	if err != nil || req.Buckets[0].Shadow || !req.Buckets[1].Shadow {
		t.Fatalf("%+v, %v", req, err)
	}
	if _, err := DecodeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"shadow":1}]}`), Limits{}); err == nil {
		t.Fatal("shadow: 1 accepted")
	}
}

package wire

import (
	"testing"
)

func TestDecodeChargeRequest(t *testing.T) {
	tests := []decoderCase{
		{"debit", `{"hash_tag":"t","buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":29}]}`, ""},
		{"refund", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":-40}]}`, ""},
		{"debit beyond the burst", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":1000}]}`, ""},
		{"amount missing", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40}]}`, "buckets[0].amount: required"},
		{"refund beyond the burst", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":-41}]}`, ""},
		{"amount huge", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":1e10}]}`, ""},
		{"amount infinite", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":1e999}]}`, "buckets[0].amount: must be a finite number, got 1e999"},
		{"amount string", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":"1"}]}`, "buckets[0].amount: must be a number, got string"},
		{"cost is not a charge field", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"cost":1}]}`, "buckets[0].cost: unknown field"},
		{"no key", `{"buckets":[{"tokens_per_second":10,"burst":40,"amount":1}]}`, "buckets[0].key: required"},
		// A bucket that holds requests may have a burst below its rate;
		// a held request's refund charges it.
		{"burst below the rate", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"amount":-1}]}`, ""},
		{"burst zero", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":0,"amount":-1}]}`, "buckets[0].burst: must be > 0, got 0"},
	}
	checkDecoder(t, tests, DecodeChargeRequest, AppendChargeRequest)
}

// TestDecodeChargeClamps: an amount beyond what can change a bucket is
// clamped, not refused: at most 2 × burst (a full bucket to its deepest
// debt), at least -burst.
func TestDecodeChargeClamps(t *testing.T) {
	for _, tt := range []struct {
		amount string
		want   float64
	}{{"2e9", 200}, {"1e300", 200}, {"200", 200}, {"199.5", 199.5}, {"-100", -100}, {"-1e9", -100}} {
		req, err := DecodeChargeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":10,"burst":100,"amount":`+tt.amount+`}]}`), Limits{})
		if err != nil || req.Buckets[0].Amount != tt.want {
			t.Errorf("amount %s: %+v, %v; want %v", tt.amount, req, err, tt.want)
		}
	}
}

func TestDecodeChargeAnswer(t *testing.T) {
	req := &ChargeRequest{Buckets: []ChargeBucket{{Key: "a", Rate: 1, Burst: 40, Amount: 3}, {Key: "b", Rate: 1, Burst: 40, Amount: -2}}}
	a := &ChargeAnswer{Buckets: []BucketAnswer{{Allowed: true, Remaining: 0, ResetMs: 50000}, {Allowed: true, Remaining: 39, ResetMs: 1000}}}
	got, err := DecodeChargeAnswer(AppendChargeAnswer(nil, a), req)
	if err != nil || got.Buckets[0] != a.Buckets[0] || got.Buckets[1] != a.Buckets[1] {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	if _, err := DecodeChargeAnswer([]byte(`{"buckets":[{}]}`), req); err == nil {
		t.Fatal("an answer with one bucket for two was accepted")
	}
}

func FuzzDecodeChargeRequest(f *testing.F) {
	f.Add([]byte(`{"hash_tag":"t","buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":-3.5}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeChargeRequest(body, Limits{})
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error %v is not a *FieldError", err)
			}
			return
		}
		for _, b := range req.Buckets {
			if !(b.Amount >= -b.Burst && b.Amount <= MaxAmount) || b.Key == "" {
				t.Fatalf("accepted %+v", b)
			}
		}
		again, err := DecodeChargeRequest(AppendChargeRequest(nil, req), Limits{})
		if err != nil || len(again.Buckets) != len(req.Buckets) {
			t.Fatalf("round trip of %+v: %+v, %v", req, again, err)
		}
	})
}

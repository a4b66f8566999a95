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
		{"refund beyond the burst", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":-41}]}`, "buckets[0].amount: must be >= -40 and <= 1e+09, got -41"},
		{"amount huge", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":1e10}]}`, "buckets[0].amount: must be >= -40 and <= 1e+09, got 1e+10"},
		{"amount string", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"amount":"1"}]}`, "buckets[0].amount: must be a number, got string"},
		{"cost is not a charge field", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"cost":1}]}`, "buckets[0].cost: unknown field"},
		{"no key", `{"buckets":[{"tokens_per_second":10,"burst":40,"amount":1}]}`, "buckets[0].key: required"},
	}
	checkDecoder(t, tests, DecodeChargeRequest, AppendChargeRequest)
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

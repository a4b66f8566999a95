package wire

import (
	"strings"
	"testing"
)

// decoderCase is one body for a call's decoder: accepted when wantErr is
// "", else refused with that detail.
type decoderCase struct{ name, body, wantErr string }

// checkDecoder runs decode over the cases: an accepted body round-trips
// through encode (decoding the encoding encodes the same), a refused one
// names its field.
func checkDecoder[R any](t *testing.T, cases []decoderCase, decode func([]byte, Limits) (R, error), encode func([]byte, R) []byte) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			req, err := decode([]byte(tt.body), Limits{})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				body := encode(nil, req)
				again, err := decode(body, Limits{})
				if err != nil || string(encode(nil, again)) != string(body) {
					t.Fatalf("round trip of %s: %+v, %v", body, again, err)
				}
				return
			}
			fe, ok := err.(*FieldError)
			if !ok || fe.Detail() != tt.wantErr {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestDecodeLeaseRequest(t *testing.T) {
	tests := []decoderCase{
		{"ok", `{"hash_tag":"t","buckets":[{"key":"a","tokens_per_second":10,"burst":40,"want":8,"min":1,"return":2.5}]}`, ""},
		{"defaults", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40}]}`, ""},
		// A leased rule that holds requests may smooth to one at a time.
		{"burst below rate", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"want":1,"min":1}]}`, ""},
		{"burst zero", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":0}]}`, "buckets[0].burst: must be > 0, got 0"},
		{"want above burst", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"want":41}]}`, "buckets[0].want: must be >= 0 and <= 40, got 41"},
		{"min above want", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"want":4,"min":5}]}`, "buckets[0].min: must be >= 0 and <= 4, got 5"},
		{"return negative", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"return":-1}]}`, "buckets[0].return: must be >= 0 and <= 40, got -1"},
		{"cost is not a lease field", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"cost":1}]}`, "buckets[0].cost: unknown field"},
		{"duplicate field", `{"buckets":[{"key":"a","key":"b","tokens_per_second":10,"burst":40}]}`, "buckets[0].key: duplicate field"},
		{"want string", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":40,"want":"1"}]}`, "buckets[0].want: must be a number, got string"},
	}
	checkDecoder(t, tests, DecodeLeaseRequest, AppendLeaseRequest)
}

var leaseReq = &LeaseRequest{Buckets: []LeaseBucket{
	{Key: "a", Rate: 1, Burst: 40, Want: 8, Min: 1},
	{Key: "b", Rate: 1, Burst: 40, Want: 4, Min: 4},
}}

func TestDecodeLeaseAnswer(t *testing.T) {
	ok := &LeaseAnswer{Granted: true, Buckets: []Grant{{Tokens: 8, Remaining: 31, ResetMs: 9000}, {Tokens: 4, Remaining: 2, ResetMs: 38000}}}
	got, err := DecodeLeaseAnswer(AppendLeaseAnswer(nil, ok), leaseReq)
	if err != nil || got.Buckets[0] != ok.Buckets[0] || got.Buckets[1] != ok.Buckets[1] || !got.Granted {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	for _, tt := range []struct{ body, wantErr string }{
		{`{"granted":true,"buckets":[{"granted":9},{"granted":4}]}`, "buckets[0].granted: must be >= 1 and <= 8, got 9"},
		{`{"granted":true,"buckets":[{"granted":8},{"granted":3}]}`, "buckets[1].granted: must be >= 4 and <= 4, got 3"},
		{`{"granted":false,"buckets":[{"granted":1},{"granted":0}]}`, "buckets[0].granted: must be >= 0 and <= 0, got 1"},
		{`{"granted":true,"buckets":[{"granted":8}]}`, "buckets: must hold 2 grants, got 1"},
		{`{"granted":"yes","buckets":[]}`, "granted: must be a boolean, got string"},
		{`{"granted":true,"buckets":[{"granted":8},{}]}`, "buckets[1].granted: must be a number, got null"},
		{strings.Repeat("[", 9) + strings.Repeat("]", 9), "[0][0][0][0][0][0][0][0]: nested deeper than 8 levels"},
	} {
		_, err := DecodeLeaseAnswer([]byte(tt.body), leaseReq)
		if fe, ok := err.(*FieldError); !ok || fe.Detail() != tt.wantErr {
			t.Errorf("DecodeLeaseAnswer(%s) = %v, want %q", tt.body, err, tt.wantErr)
		}
	}
}

// FuzzDecodeLeaseAnswer: whatever the service answers, an accepted answer
// never grants more than was asked, nor anything in a refused call.
func FuzzDecodeLeaseAnswer(f *testing.F) {
	f.Add([]byte(`{"granted":true,"buckets":[{"granted":8,"remaining":31},{"granted":4}]}`))
	f.Add([]byte(`{"granted":false,"buckets":[{"granted":0,"retry_after_ms":5},{"granted":0}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := DecodeLeaseAnswer(body, leaseReq)
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error %v is %T", err, err)
			}
			return
		}
		for i, g := range a.Buckets {
			b := leaseReq.Buckets[i]
			if a.Granted && !(g.Tokens >= b.Min && g.Tokens <= b.Want) || !a.Granted && g.Tokens != 0 {
				t.Fatalf("accepted grant %+v for %+v (granted %v)", g, b, a.Granted)
			}
			if g.Remaining < 0 || g.RetryAfterMs < 0 || g.ResetMs < 0 {
				t.Fatalf("negative figure in %+v", g)
			}
		}
	})
}

// FuzzDecodeAnswer: an accepted decide answer agrees with its buckets.
func FuzzDecodeAnswer(f *testing.F) {
	req := &Request{Buckets: []Bucket{{Key: "a", MaxDelayMs: 1000}, {Key: "b", Shadow: true}}}
	f.Add([]byte(`{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true,"remaining":3},{"allowed":false}]}`))
	f.Add([]byte(`{"allowed":true,"retry_after_ms":0,"wait_ms":300,"buckets":[{"allowed":true,"wait_ms":300},{"allowed":true,"wait_ms":5}]}`))
	f.Add([]byte(`{"allowed":false,"retry_after_ms":9,"buckets":[{"allowed":false,"retry_after_ms":9},{"allowed":true}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := DecodeAnswer(body, req)
		if err != nil {
			return
		}
		if a.Allowed != a.Buckets[0].Allowed || !a.Allowed && a.Buckets[0].RetryAfterMs < 1 {
			t.Fatalf("accepted an answer whose verdict disagrees with its enforced bucket: %+v", a)
		}
		if a.WaitMs < 0 || a.WaitMs > 1000 || (!a.Allowed && a.WaitMs != 0) || (a.Allowed && a.WaitMs != a.Buckets[0].WaitMs) {
			t.Fatalf("accepted a wait past its bound or apart from its enforced bucket: %+v", a)
		}
	})
}

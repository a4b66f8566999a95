package wire

import (
	"strings"
	"testing"
)

// A month in New York: 2026-08-01T00:00-04:00 to 2026-09-01T00:00-04:00.
const (
	augStart = 1785556800000
	augEnd   = 1788235200000
)

// TestDecodePeriod: a quota bucket carries both period bounds, a rate of 0
// and a burst (its limit); anything else is refused with the field's path,
// in each of the three calls.
func TestDecodePeriod(t *testing.T) {
	q := `"key":"a","tokens_per_second":0,"burst":100`
	tests := []struct{ name, bucket, wantErr string }{
		{"quota", q + `,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, ""},
		{"fraction", q + `,"period_start_ms":0.5,"period_end_ms":1`, "buckets[0].period_start_ms: must be a whole number of milliseconds, got 0.5"},
		{"start only", q + `,"period_start_ms":1785556800000`, "buckets[0].period_end_ms: required with period_start_ms"},
		{"end only", q + `,"period_end_ms":1788235200000`, "buckets[0].period_start_ms: required with period_end_ms"},
		{"end before start", q + `,"period_start_ms":1788235200000,"period_end_ms":1785556800000`, "buckets[0].period_end_ms: must be > period_start_ms (1788235200000), got 1785556800000"},
		{"empty period", q + `,"period_start_ms":1785556800000,"period_end_ms":1785556800000`, "buckets[0].period_end_ms: must be > period_start_ms (1785556800000), got 1785556800000"},
		{"too long", q + `,"period_start_ms":1000,"period_end_ms":31708801001`, "buckets[0].period_end_ms: must be at most 8808h0m0s after period_start_ms, got 31708800001ms"},
		{"longest", q + `,"period_start_ms":1000,"period_end_ms":31708801000`, ""},
		{"zero start", q + `,"period_start_ms":0,"period_end_ms":1000`, "buckets[0].period_start_ms: must be > 0 and <= 9.007199254739e+12, got 0"},
		{"negative", q + `,"period_start_ms":-5,"period_end_ms":1000`, "buckets[0].period_start_ms: must be > 0 and <= 9.007199254739e+12, got -5"},
		{"latest", q + `,"period_start_ms":9007199254738,"period_end_ms":9007199254739`, ""},
		{"past the latest", q + `,"period_start_ms":9007199254738,"period_end_ms":9007199254740`, "buckets[0].period_end_ms: must be > 0 and <= 9.007199254739e+12, got 9.00719925474e+12"},
		{"far future", q + `,"period_start_ms":1000,"period_end_ms":1e300`, "buckets[0].period_end_ms: must be > 0 and <= 9.007199254739e+12, got 1e+300"},
		{"string", q + `,"period_start_ms":"1000","period_end_ms":2000`, "buckets[0].period_start_ms: must be a number, got string"},
		{"rate with period", `"key":"a","tokens_per_second":1,"burst":100,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, "buckets[0].tokens_per_second: must be 0 with a period (a quota never refills), got 1"},
		{"zero burst", `"key":"a","tokens_per_second":0,"burst":0,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, "buckets[0].burst: must be > 0 and <= 1e+09, got 0"},
		{"huge burst", `"key":"a","tokens_per_second":0,"burst":2e9,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, "buckets[0].burst: must be > 0 and <= 1e+09, got 2e+09"},
		{"no burst", `"key":"a","tokens_per_second":0,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, "buckets[0].burst: required"},
		{"no rate", `"key":"a","burst":5,"period_start_ms":1785556800000,"period_end_ms":1788235200000`, "buckets[0].tokens_per_second: required"},
		{"rate 0 without a period", `"key":"a","tokens_per_second":0,"burst":100`, "buckets[0].tokens_per_second: must be > 0 and <= 1e+09, got 0"},
	}
	extra := map[string]string{"decide": "", "lease": `,"want":5`, "charge": `,"amount":3`}
	decode := map[string]func([]byte) error{
		"decide": func(b []byte) error { _, err := DecodeRequest(b, Limits{}); return err },
		"lease":  func(b []byte) error { _, err := DecodeLeaseRequest(b, Limits{}); return err },
		"charge": func(b []byte) error { _, err := DecodeChargeRequest(b, Limits{}); return err },
	}
	for _, tt := range tests {
		for call, dec := range decode {
			t.Run(call+"/"+tt.name, func(t *testing.T) {
				err := dec([]byte(`{"buckets":[{` + tt.bucket + extra[call] + `}]}`))
				if tt.wantErr == "" {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					return
				}
				verr, ok := err.(*FieldError)
				if !ok || verr.Detail() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
			})
		}
	}
}

// TestPeriodRoundTrip: each call writes a quota's period, and only a
// quota's, and reads it back as sent.
func TestPeriodRoundTrip(t *testing.T) {
	p := Period{PeriodStartMs: augStart, PeriodEndMs: augEnd}
	const field = `"period_start_ms":1785556800000,"period_end_ms":1788235200000`

	req := &Request{Buckets: []Bucket{{Key: "q", Burst: 100, Cost: 1, Period: p}, {Key: "b", Rate: 1, Burst: 2, Cost: 1}}}
	body := AppendRequest(nil, req)
	if want := `{"buckets":[{"key":"q","tokens_per_second":0,"burst":100,` + field + `,"cost":1},{"key":"b","tokens_per_second":1,"burst":2,"cost":1}]}`; string(body) != want {
		t.Fatalf("AppendRequest = %s\nwant %s", body, want)
	}
	again, err := DecodeRequest(body, Limits{})
	if err != nil || again.Buckets[0] != req.Buckets[0] || again.Buckets[1] != req.Buckets[1] {
		t.Fatalf("DecodeRequest = %+v, %v; want %+v", again, err, req)
	}

	lreq := &LeaseRequest{Buckets: []LeaseBucket{{Key: "q", Burst: 100, Want: 10, Min: 1, Period: p}}}
	body = AppendLeaseRequest(nil, lreq)
	if !strings.Contains(string(body), field) {
		t.Fatalf("AppendLeaseRequest = %s, want the period", body)
	}
	lagain, err := DecodeLeaseRequest(body, Limits{})
	if err != nil || lagain.Buckets[0] != lreq.Buckets[0] {
		t.Fatalf("DecodeLeaseRequest = %+v, %v; want %+v", lagain, err, lreq)
	}

	creq := &ChargeRequest{Buckets: []ChargeBucket{{Key: "q", Burst: 100, Amount: -3, Period: p}}}
	body = AppendChargeRequest(nil, creq)
	if !strings.Contains(string(body), field) {
		t.Fatalf("AppendChargeRequest = %s, want the period", body)
	}
	cagain, err := DecodeChargeRequest(body, Limits{})
	if err != nil || cagain.Buckets[0] != creq.Buckets[0] {
		t.Fatalf("DecodeChargeRequest = %+v, %v; want %+v", cagain, err, creq)
	}
}

// TestAnswerQuotaWaits: a quota's waits run to its period's end, beyond
// MaxFill (a month's quota refused on the 2nd waits 30 days), and no
// further; a token bucket's stay clamped to MaxFill.
func TestAnswerQuotaWaits(t *testing.T) {
	p := Period{PeriodStartMs: augStart, PeriodEndMs: augEnd}
	month := int64(augEnd - augStart)
	req := &Request{Buckets: []Bucket{{Key: "q", Burst: 100, Cost: 1, Period: p}}}
	body := `{"allowed":false,"retry_after_ms":2592000000,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":2592000000,"reset_ms":2592000000}]}`
	a, err := DecodeAnswer([]byte(body), req)
	if err != nil || a.RetryAfterMs != 2592000000 || a.Buckets[0].ResetMs != 2592000000 {
		t.Fatalf("DecodeAnswer = %+v, %v; want 30 days", a, err)
	}
	body = `{"allowed":false,"retry_after_ms":1e15,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":1e15,"reset_ms":1e15}]}`
	if a, err = DecodeAnswer([]byte(body), req); err != nil || a.Buckets[0].RetryAfterMs != month || a.Buckets[0].ResetMs != month {
		t.Fatalf("DecodeAnswer = %+v, %v; want clamped to the period (%d ms)", a, err, month)
	}
	lreq := &LeaseRequest{Buckets: []LeaseBucket{{Key: "q", Burst: 100, Want: 10, Min: 1, Period: p}}}
	lbody := `{"granted":false,"buckets":[{"granted":0,"remaining":0,"retry_after_ms":2592000000,"reset_ms":2592000000}]}`
	if la, err := DecodeLeaseAnswer([]byte(lbody), lreq); err != nil || la.Buckets[0].RetryAfterMs != 2592000000 {
		t.Fatalf("DecodeLeaseAnswer = %+v, %v; want 30 days", la, err)
	}
	creq := &ChargeRequest{Buckets: []ChargeBucket{{Key: "q", Burst: 100, Amount: 1, Period: p}}}
	cbody := `{"buckets":[{"charged":true,"remaining":0,"retry_after_ms":0,"reset_ms":2592000000}]}`
	if ca, err := DecodeChargeAnswer([]byte(cbody), creq); err != nil || ca.Buckets[0].ResetMs != 2592000000 {
		t.Fatalf("DecodeChargeAnswer = %+v, %v; want 30 days", ca, err)
	}
	// A token bucket's waits stay within MaxFill.
	treq := &Request{Buckets: []Bucket{{Key: "b", Rate: 1, Burst: 1, Cost: 1}}}
	if a, err = DecodeAnswer([]byte(body), treq); err != nil || a.Buckets[0].RetryAfterMs != MaxFill.Milliseconds() {
		t.Fatalf("DecodeAnswer token bucket = %+v, %v; want MaxFill", a, err)
	}
}

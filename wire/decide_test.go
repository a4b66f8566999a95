package wire

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDecodeRequest(t *testing.T) {
	long := strings.Repeat("k", MaxKeyBytes+1)
	tests := []struct {
		name, body, wantErr string
	}{
		{"ok", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":20}]}`, ""},
		{"ok with tag and cost", `{"hash_tag":"t","buckets":[{"key":"a","tokens_per_second":1,"burst":1,"cost":0.5},{"key":"b","tokens_per_second":2,"burst":3,"cost":0}]}`, ""},
		{"refundable", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":20,"refundable":true}]}`, ""},
		{"max delay", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"max_delay_ms":1000}]}`, ""},
		{"max delay zero", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":10,"max_delay_ms":0}]}`, ""},
		{"max delay zero, burst below rate", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"max_delay_ms":0}]}`, ""},
		{"no max delay, burst below rate", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1}]}`, "buckets[0].burst: must be >= tokens_per_second (10), got 1"},
		{"max delay negative", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":10,"max_delay_ms":-1}]}`, "buckets[0].max_delay_ms: must be >= 0 and <= 60000, got -1"},
		{"max delay long", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"max_delay_ms":60001}]}`, "buckets[0].max_delay_ms: must be >= 0 and <= 60000, got 60001"},
		{"max delay fraction", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":10,"max_delay_ms":2.5}]}`, "buckets[0].max_delay_ms: must be a whole number of milliseconds, got 2.5"},
		{"max delay string", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":10,"max_delay_ms":"1s"}]}`, "buckets[0].max_delay_ms: must be a number, got string"},
		{"refundable not a bool", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":20,"refundable":"yes"}]}`, "buckets[0].refundable: must be a boolean, got string"},
		{"empty body", ``, "body: invalid JSON: unexpected end of JSON input (at byte 0)"},
		{"not an object", `[1]`, "body: must be an object, got array"},
		{"syntax", `{"buckets":[}`, "body: invalid JSON: invalid character '}' looking for beginning of value (at byte 13)"},
		{"truncated", `{"buckets":[`, "body: invalid JSON: unexpected end of JSON input (at byte 12)"},
		{"trailing", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1}]} {}`, "body: invalid JSON: invalid character '{' after top-level value (at byte 59)"},
		{"unknown top", `{"bucket":[]}`, "bucket: unknown field"},
		{"unknown in bucket", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"rate":3}]}`, "buckets[0].rate: unknown field"},
		// A member's path is written as config writes it, so a name that is
		// not a plain identifier cannot read as another path (or as none).
		{"unknown empty name", `{"":[]}`, `[""]: unknown field`},
		{"unknown spaced name", `{"a b":1}`, `["a b"]: unknown field`},
		{"unknown dotted name in bucket", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"a.b":3}]}`, `buckets[0]["a.b"]: unknown field`},
		{"no buckets", `{}`, "buckets: required"},
		{"zero buckets", `{"buckets":[]}`, "buckets: must hold 1 to 16 buckets, got 0"},
		{"too many buckets", `{"buckets":[` + strings.Repeat(`{},`, 16) + `{}]}`, "buckets: must hold 1 to 16 buckets, got 17"},
		{"bucket not object", `{"buckets":[3]}`, "buckets[0]: must be an object, got number"},
		{"key missing", `{"buckets":[{"tokens_per_second":1,"burst":1}]}`, "buckets[0].key: required"},
		{"key empty", `{"buckets":[{"key":"","tokens_per_second":1,"burst":1}]}`, "buckets[0].key: must not be empty"},
		{"key long", `{"buckets":[{"key":"` + long + `","tokens_per_second":1,"burst":1}]}`, "buckets[0].key: longer than 512 bytes"},
		{"key number", `{"buckets":[{"key":5,"tokens_per_second":1,"burst":1}]}`, "buckets[0].key: must be a string, got number"},
		{"duplicate key", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1},{"key":"a","tokens_per_second":1,"burst":1}]}`, "buckets[1].key: duplicate of buckets[0].key"},
		{"rate missing", `{"buckets":[{"key":"a","burst":1}]}`, "buckets[0].tokens_per_second: required"},
		{"rate zero", `{"buckets":[{"key":"a","tokens_per_second":0,"burst":1}]}`, "buckets[0].tokens_per_second: must be > 0 and <= 1e+09, got 0"},
		{"rate huge", `{"buckets":[{"key":"a","tokens_per_second":2e9,"burst":3e9}]}`, "buckets[0].tokens_per_second: must be > 0 and <= 1e+09, got 2e+09"},
		{"rate string", `{"buckets":[{"key":"a","tokens_per_second":"1","burst":1}]}`, "buckets[0].tokens_per_second: must be a number, got string"},
		{"rate overflow", `{"buckets":[{"key":"a","tokens_per_second":1e999,"burst":1}]}`, "buckets[0].tokens_per_second: must be a finite number, got 1e999"},
		{"burst missing", `{"buckets":[{"key":"a","tokens_per_second":1}]}`, "buckets[0].burst: required"},
		{"burst below rate", `{"buckets":[{"key":"a","tokens_per_second":10,"burst":5}]}`, "buckets[0].burst: must be >= tokens_per_second (10), got 5"},
		{"burst huge", `{"buckets":[{"key":"a","tokens_per_second":1e9,"burst":1e10}]}`, "buckets[0].burst: must be <= 1e+09, got 1e+10"},
		{"burst slow", `{"buckets":[{"key":"a","tokens_per_second":0.001,"burst":1000}]}`, "buckets[0].burst: must refill within 168h0m0s: burst / tokens_per_second is 1e+06s"},
		{"cost negative", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"cost":-1}]}`, "buckets[0].cost: must be >= 0 and <= 1e+09, got -1"},
		{"null cost", `{"buckets":[{"key":"a","tokens_per_second":1,"burst":1,"cost":null}]}`, ""},
		{"tag empty", `{"hash_tag":"","buckets":[{"key":"a","tokens_per_second":1,"burst":1}]}`, "hash_tag: must not be empty (leave it out instead)"},
		{"tag brace", `{"hash_tag":"a}b","buckets":[{"key":"a","tokens_per_second":1,"burst":1}]}`, "hash_tag: must not contain { or }"},
		{"tag number", `{"hash_tag":1,"buckets":[]}`, "hash_tag: must be a string, got number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := DecodeRequest([]byte(tt.body), Limits{})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("DecodeRequest: %v", err)
				}
				if msg := checkRequest(req, Limits{}.WithDefaults()); msg != "" {
					t.Fatalf("accepted an invalid request: %s", msg)
				}
				return
			}
			verr, ok := err.(*FieldError)
			if !ok {
				t.Fatalf("DecodeRequest error = %v (%T), want *FieldError %q", err, err, tt.wantErr)
			}
			if verr.Detail() != tt.wantErr {
				t.Errorf("DecodeRequest error = %q\nwant %q", verr.Detail(), tt.wantErr)
			}
			if !strings.HasPrefix(verr.Error(), "wire: ") {
				t.Errorf("Error() = %q, want the package prefix", verr.Error())
			}
		})
	}
}

func TestDecodeRequestDefaults(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"buckets":[{"key":"a","tokens_per_second":2,"burst":4}]}`), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := Bucket{Key: "a", Rate: 2, Burst: 4, Cost: 1}
	if req.HashTag != "" || len(req.Buckets) != 1 || req.Buckets[0] != want {
		t.Fatalf("DecodeRequest = %+v, want one bucket %+v and no hash tag", req, want)
	}
}

// TestRequestRefundable: refundable goes out only when set and reads back
// as sent.
func TestRequestRefundable(t *testing.T) {
	req := &Request{Buckets: []Bucket{{Key: "a", Rate: 1, Burst: 2, Cost: 1}, {Key: "b", Rate: 1, Burst: 2, Cost: 1, Refundable: true}}}
	body := AppendRequest(nil, req)
	if want := `{"buckets":[{"key":"a","tokens_per_second":1,"burst":2,"cost":1},{"key":"b","tokens_per_second":1,"burst":2,"cost":1,"refundable":true}]}`; string(body) != want {
		t.Fatalf("AppendRequest = %s, want %s", body, want)
	}
	again, err := DecodeRequest(body, Limits{})
	if err != nil || again.Buckets[0] != req.Buckets[0] || again.Buckets[1] != req.Buckets[1] {
		t.Fatalf("DecodeRequest = %+v, %v; want %+v", again, err, req)
	}
}

func TestDecodeRequestLimits(t *testing.T) {
	lim := Limits{MaxBodyBytes: 100, MaxKeyBytes: 3, MaxBuckets: 1, MaxFill: time.Second}
	tests := []struct{ body, wantErr string }{
		{`{"buckets":[{"key":"abcd","tokens_per_second":1,"burst":1}]}`, "buckets[0].key: longer than 3 bytes"},
		{`{"buckets":[{"key":"a","tokens_per_second":1,"burst":2}]}`, "buckets[0].burst: must refill within 1s: burst / tokens_per_second is 2s"},
		{`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1},{"key":"b","tokens_per_second":1,"burst":1}]}`, "body: larger than 100 bytes"},
		{`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1},{"key":"b"}]}`, "buckets: must hold 1 to 1 buckets, got 2"},
	}
	for _, tt := range tests {
		_, err := DecodeRequest([]byte(tt.body), lim)
		verr, ok := err.(*FieldError)
		if !ok || verr.Detail() != tt.wantErr {
			t.Errorf("DecodeRequest(%s) = %v, want %q", tt.body, err, tt.wantErr)
		}
	}
}

// checkRequest returns what is wrong with an accepted request, or "".
func checkRequest(req *Request, lim Limits) string {
	if n := len(req.Buckets); n < 1 || n > lim.MaxBuckets {
		return "bucket count"
	}
	if req.HashTag != "" && (len(req.HashTag) > lim.MaxKeyBytes || strings.ContainsAny(req.HashTag, "{}")) {
		return "hash tag"
	}
	seen := map[string]bool{}
	for _, b := range req.Buckets {
		switch {
		case b.Key == "" || len(b.Key) > lim.MaxKeyBytes || seen[b.Key]:
			return "key " + b.Key
		case b.IsQuota():
			if b.Rate != 0 || !(b.Burst > 0 && b.Burst <= MaxAmount) || b.PeriodStartMs <= 0 ||
				b.PeriodEndMs <= b.PeriodStartMs || b.PeriodEndMs-b.PeriodStartMs > MaxPeriod.Milliseconds() {
				return "quota"
			}
		case b.PeriodStartMs != 0:
			return "period start without an end"
		case !(b.Rate > 0 && b.Rate <= MaxAmount):
			return "rate"
		// Below the rate only for a bucket that named a max_delay_ms (0
		// included), which AppendRequest names for such a bucket.
		case !(b.Burst > 0 && b.Burst <= MaxAmount) || b.Burst/b.Rate > lim.MaxFill.Seconds():
			return "burst"
		case !(b.Cost >= 0 && b.Cost <= MaxAmount):
			return "cost"
		case b.MaxDelayMs < 0 || b.MaxDelayMs > MaxDelayMs:
			return "max_delay_ms"
		}
		seen[b.Key] = true
	}
	return ""
}

// encodeRequest writes req back as a JSON body.
func encodeRequest(req *Request) []byte {
	type wb struct {
		Key        string  `json:"key"`
		Rate       float64 `json:"tokens_per_second"`
		Burst      float64 `json:"burst"`
		Cost       float64 `json:"cost"`
		Shadow     bool    `json:"shadow,omitempty"`
		Refundable bool    `json:"refundable,omitempty"`
		MaxDelayMs int64   `json:"max_delay_ms,omitempty"`
		Start      int64   `json:"period_start_ms,omitempty"`
		End        int64   `json:"period_end_ms,omitempty"`
	}
	w := struct {
		HashTag string `json:"hash_tag,omitempty"`
		Buckets []wb   `json:"buckets"`
	}{HashTag: req.HashTag}
	for _, b := range req.Buckets {
		w.Buckets = append(w.Buckets, wb{b.Key, b.Rate, b.Burst, b.Cost, b.Shadow, b.Refundable, b.MaxDelayMs, b.PeriodStartMs, b.PeriodEndMs})
	}
	out, _ := json.Marshal(w)
	return out
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"buckets":[{"key":"a","tokens_per_second":10,"burst":20}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":10,"burst":20,"cost":3,"refundable":true,"shadow":false}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":10,"burst":20,"refundable":1}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"max_delay_ms":1000}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":10,"burst":1,"max_delay_ms":1.5}]}`,
		`{"hash_tag":"t","buckets":[{"key":"a","tokens_per_second":1,"burst":1,"cost":0.5},{"key":"b","tokens_per_second":2,"burst":3,"cost":0}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":1e9,"burst":1e9,"cost":1e9}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":0,"burst":100,"period_start_ms":1785297600000,"period_end_ms":1787976000000}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":0,"burst":100,"period_start_ms":1785297600000.5,"period_end_ms":1}]}`,
		`{"buckets":[{"key":"\u0000\ud800","tokens_per_second":1,"burst":1}]}`,
		`{"buckets":[{"key":"a","tokens_per_second":1,"burst":1}]} x`,
		`{"buckets":null}`, `[]`, `{`, ``, `{"buckets":[{"KEY":"a","Burst":1,"TOKENS_PER_SECOND":1}]}`,
	} {
		f.Add([]byte(s))
	}
	lim := Limits{}.WithDefaults()
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeRequest(body, Limits{})
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error %v is %T, want *FieldError", err, err)
			}
			return
		}
		if msg := checkRequest(req, lim); msg != "" {
			t.Fatalf("accepted an invalid request (%s): %+v", msg, req)
		}
		again, err := DecodeRequest(encodeRequest(req), Limits{})
		if err != nil {
			t.Fatalf("re-encoded request refused: %v", err)
		}
		if again.HashTag != req.HashTag || len(again.Buckets) != len(req.Buckets) {
			t.Fatalf("round trip changed the request: %+v != %+v", again, req)
		}
		for i := range req.Buckets {
			if again.Buckets[i] != req.Buckets[i] {
				t.Fatalf("round trip changed bucket %d: %+v != %+v", i, again.Buckets[i], req.Buckets[i])
			}
		}
	})
}

// TestRequestMaxDelay: max_delay_ms goes out only when set and reads back as
// sent.
func TestRequestMaxDelay(t *testing.T) {
	req := &Request{Buckets: []Bucket{{Key: "a", Rate: 10, Burst: 10, Cost: 1}, {Key: "b", Rate: 10, Burst: 1, Cost: 1, MaxDelayMs: 1000}}}
	body := AppendRequest(nil, req)
	if want := `{"buckets":[{"key":"a","tokens_per_second":10,"burst":10,"cost":1},{"key":"b","tokens_per_second":10,"burst":1,"cost":1,"max_delay_ms":1000}]}`; string(body) != want {
		t.Fatalf("AppendRequest = %s, want %s", body, want)
	}
	again, err := DecodeRequest(body, Limits{})
	if err != nil || again.Buckets[0] != req.Buckets[0] || again.Buckets[1] != req.Buckets[1] {
		t.Fatalf("DecodeRequest = %+v, %v; want %+v", again, err, req)
	}
}

// TestAnswerWait: wait_ms goes out only when not 0, the answer's is the
// longest of its enforced buckets', and a decoded answer holds no wait
// longer than was asked, nor one that disagrees with its buckets.
func TestAnswerWait(t *testing.T) {
	req := &Request{Buckets: []Bucket{
		{Key: "a", Rate: 10, Burst: 1, Cost: 1, MaxDelayMs: 1000},
		{Key: "b", Rate: 5, Burst: 1, Cost: 1, MaxDelayMs: 1000},
		{Key: "s", Rate: 1, Burst: 1, Cost: 1, MaxDelayMs: 5000, Shadow: true},
		{Key: "n", Rate: 1, Burst: 1, Cost: 1},
	}}
	a := &Answer{Buckets: []BucketAnswer{
		{Allowed: true, ResetMs: 300, WaitMs: 200},
		{Allowed: true, ResetMs: 800, WaitMs: 600},
		{Allowed: true, ResetMs: 2000, WaitMs: 2000},
		{Allowed: true, Remaining: 0, ResetMs: 1000},
	}}
	a.Settle(req)
	if !a.Allowed || a.WaitMs != 600 {
		t.Fatalf("Settle = %+v, want allowed, wait 600 (the shadow bucket's wait holds nothing)", a)
	}
	body := AppendAnswer(nil, a)
	want := `{"allowed":true,"retry_after_ms":0,"wait_ms":600,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":300,"wait_ms":200},` +
		`{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":800,"wait_ms":600},{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":2000,"wait_ms":2000},` +
		`{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":1000}]}` + "\n"
	if string(body) != want {
		t.Fatalf("AppendAnswer = %s\nwant %s", body, want)
	}
	got, err := DecodeAnswer(body, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.WaitMs != 600 || got.Buckets[0].WaitMs != 200 || got.Buckets[2].WaitMs != 2000 || got.Buckets[3].WaitMs != 0 {
		t.Fatalf("DecodeAnswer = %+v", got)
	}
	// A refused answer waits for nothing.
	a.Buckets[3] = BucketAnswer{RetryAfterMs: 1000}
	a.Settle(req)
	if a.Allowed || a.WaitMs != 0 || a.RetryAfterMs != 1000 {
		t.Fatalf("Settle refused = %+v", a)
	}
	for _, tt := range []struct{ body, wantErr string }{
		{`{"allowed":true,"retry_after_ms":0,"wait_ms":1500,"buckets":[{"allowed":true,"wait_ms":1500},{"allowed":true},{"allowed":true},{"allowed":true}]}`, "buckets[0].wait_ms: must be <= max_delay_ms (1000), got 1500"},
		{`{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true},{"allowed":true},{"allowed":true},{"allowed":true,"wait_ms":1}]}`, "buckets[3].wait_ms: must be <= max_delay_ms (0), got 1"},
		{`{"allowed":true,"retry_after_ms":0,"wait_ms":100,"buckets":[{"allowed":true,"wait_ms":200},{"allowed":true},{"allowed":true},{"allowed":true}]}`, "wait_ms: disagrees with its buckets"},
	} {
		_, err := DecodeAnswer([]byte(tt.body), req)
		if verr, ok := err.(*FieldError); !ok || verr.Detail() != tt.wantErr {
			t.Errorf("DecodeAnswer(%s) = %v, want %q", tt.body, err, tt.wantErr)
		}
	}
	// An answer without wait_ms (an older service) waits for nothing.
	old := `{"allowed":true,"retry_after_ms":0,"buckets":[{"allowed":true},{"allowed":true},{"allowed":true},{"allowed":true}]}`
	if got, err := DecodeAnswer([]byte(old), req); err != nil || got.WaitMs != 0 {
		t.Fatalf("DecodeAnswer(old) = %+v, %v", got, err)
	}
}

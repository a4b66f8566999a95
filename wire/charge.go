package wire

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// ChargeBucket is one bucket of a charge call: the bucket stored under Key
// with its limit is charged Amount tokens, a cost known only after the
// request was admitted (from its response). A positive amount takes more
// tokens, into debt down to −Burst at most; a negative one gives tokens back
// (never above Burst).
type ChargeBucket struct {
	Key    string
	Rate   float64
	Burst  float64
	Amount float64
	Period // a quota's period (Bucket)
}

// ChargeRequest is one charge call (POST /v1/charge). A charge cannot be
// refused: each bucket is charged on its own (package bucket's
// Limit.Charge), all in one atomic step of the store.
type ChargeRequest struct {
	HashTag string
	Buckets []ChargeBucket
}

// ChargeAnswer is the answer to a ChargeRequest: what each bucket holds
// after its charge (RetryAfterMs is 0; Allowed is true).
type ChargeAnswer struct {
	Buckets []BucketAnswer
}

// AppendChargeRequest appends the JSON body of r:
//
//	{"hash_tag":"t","buckets":[{"key":"k","tokens_per_second":10,"burst":40,"amount":-3.5}]}
func AppendChargeRequest(b []byte, r *ChargeRequest) []byte {
	b = appendTag(b, r.HashTag)
	for i := range r.Buckets {
		cb := &r.Buckets[i]
		b = appendBucket(b, i, cb.Key, cb.Rate, cb.Burst, cb.Period)
		b = append(b, `,"amount":`...)
		b = appendFloat(b, cb.Amount)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// DecodeChargeRequest parses and validates the body of POST /v1/charge.
// amount is required and finite; it is clamped, never refused, to what can
// change a bucket: at most 2 × burst (what takes a full bucket to its
// deepest debt, −burst) and at least −burst (a refund of more gives back
// nothing more), so an upstream reporting an absurd cost still takes the
// whole debt. Errors are *FieldError naming the field.
func DecodeChargeRequest(body []byte, lim Limits) (*ChargeRequest, error) {
	req := &ChargeRequest{}
	err := decodeCall(body, lim, &req.HashTag, []string{"amount"}, func(n int) { req.Buckets = make([]ChargeBucket, n) },
		func(i int, at string, h head, x []gjson.Result) (err *jsonfield.Error) {
			b := &req.Buckets[i]
			b.Key, b.Rate, b.Burst, b.Period = h.Key, h.Rate, h.Burst, h.Period
			if !x[0].Exists() {
				return refuse(at+".amount", "required")
			}
			if b.Amount, err = jsonfield.Number(at+".amount", x[0]); err != nil {
				return err
			}
			b.Amount = max(-b.Burst, min(b.Amount, 2*b.Burst))
			return nil
		})
	if err != nil {
		return nil, refusal(err)
	}
	return req, nil
}

// AppendChargeAnswer appends the JSON of a:
//
//	{"buckets":[{"charged":true,"remaining":0,"retry_after_ms":0,"reset_ms":25920000}]}
func AppendChargeAnswer(b []byte, a *ChargeAnswer) []byte {
	b = append(b, `{"buckets":[`...)
	for i := range a.Buckets {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"charged":true`...)
		b = appendWaits(b, a.Buckets[i].Remaining, 0, a.Buckets[i].ResetMs)
	}
	return append(b, "]}\n"...)
}

// DecodeChargeAnswer reads the service's answer to req: one bucket per
// charged bucket. It is untrusted: its size and nesting are bounded, counts
// and waits are clamped as in DecodeAnswer.
func DecodeChargeAnswer(body []byte, req *ChargeRequest) (*ChargeAnswer, error) {
	v, ferr := parse(body, MaxAnswerBytes)
	if ferr != nil {
		return nil, refusal(ferr)
	}
	buckets := v.Get("buckets").Array()
	if len(buckets) != len(req.Buckets) {
		return nil, refusal(refuse("buckets", "must hold "+strconv.Itoa(len(req.Buckets))+" answers, got "+strconv.Itoa(len(buckets))))
	}
	a := &ChargeAnswer{Buckets: make([]BucketAnswer, len(buckets))}
	for i, m := range buckets {
		ba := &a.Buckets[i]
		ba.Allowed = true
		ba.Remaining, _, ba.ResetMs = readWaits(m, req.Buckets[i].Period)
	}
	return a, nil
}

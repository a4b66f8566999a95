package wire

import (
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// LeaseBucket is one bucket of a lease call: the global bucket stored under
// Key with its limit, from which the caller wants up to Want tokens, and at
// least Min; Return tokens (left over from an expired lease) go back into it
// first.
type LeaseBucket struct {
	Key    string
	Rate   float64
	Burst  float64
	Want   float64
	Min    float64
	Return float64
	Period // a quota's period (Bucket): leases come from its remainder
}

// LeaseRequest is one lease call (POST /v1/lease), atomic over its buckets:
// every bucket first takes back its Return (never above its burst); then,
// if every bucket holds its Min, each grants min(Want, tokens) and is
// debited that much; otherwise none grants anything (the returns stand).
type LeaseRequest struct {
	HashTag string
	Buckets []LeaseBucket
}

// LeaseAnswer is the answer to a LeaseRequest.
type LeaseAnswer struct {
	// Granted reports whether every bucket granted at least its Min.
	Granted bool
	// Buckets holds one entry per requested bucket, in request order.
	Buckets []Grant
}

// Grant is what one bucket of a lease call gave, and the global bucket's
// state after it.
type Grant struct {
	// Tokens is what the bucket granted: 0 when the call was refused,
	// else between Min and Want.
	Tokens float64
	// Remaining is floor(tokens the global bucket holds after the call).
	Remaining int64
	// RetryAfterMs is, when this bucket lacked its Min, the milliseconds
	// until it holds it (at least 1); else 0.
	RetryAfterMs int64
	// ResetMs is the milliseconds until the global bucket is full again.
	ResetMs int64
	// Returned is what the bucket took back of the call's Return, after the
	// service's clamps (to what was leased and not yet returned, and to the
	// burst). It is not encoded: the service counts it in its metrics.
	Returned float64
}

// AppendLeaseRequest appends the JSON body of r:
//
//	{"hash_tag":"t","buckets":[{"key":"k","tokens_per_second":10,"burst":40,"want":8,"min":1,"return":0}]}
func AppendLeaseRequest(b []byte, r *LeaseRequest) []byte {
	b = appendTag(b, r.HashTag)
	for i := range r.Buckets {
		lb := &r.Buckets[i]
		b = appendBucket(b, i, lb.Key, lb.Rate, lb.Burst, lb.Period)
		b = append(b, `,"want":`...)
		b = appendFloat(b, lb.Want)
		b = append(b, `,"min":`...)
		b = appendFloat(b, lb.Min)
		b = append(b, `,"return":`...)
		b = appendFloat(b, lb.Return)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// DecodeLeaseRequest parses and validates the body of POST /v1/lease. want,
// min and return default to 0; want and return are at most the burst, min
// at most want. Errors are *FieldError naming the field.
func DecodeLeaseRequest(body []byte, lim Limits) (*LeaseRequest, error) {
	req := &LeaseRequest{}
	err := decodeCall(body, lim, &req.HashTag, []string{"want", "min", "return"}, func(n int) { req.Buckets = make([]LeaseBucket, n) },
		func(i int, at string, h head, x []gjson.Result) (err *jsonfield.Error) {
			b := &req.Buckets[i]
			b.Key, b.Rate, b.Burst, b.Period = h.Key, h.Rate, h.Burst, h.Period
			if b.Want, err = amount(at+".want", x[0], 0, 0, b.Burst); err != nil {
				return err
			}
			if b.Min, err = amount(at+".min", x[1], 0, 0, b.Want); err != nil {
				return err
			}
			b.Return, err = amount(at+".return", x[2], 0, 0, b.Burst)
			return err
		})
	if err != nil {
		return nil, refusal(err)
	}
	return req, nil
}

// AppendLeaseAnswer appends the JSON of a:
//
//	{"granted":true,"buckets":[{"granted":8,"remaining":31,"retry_after_ms":0,"reset_ms":900}]}
func AppendLeaseAnswer(b []byte, a *LeaseAnswer) []byte {
	b = append(b, `{"granted":`...)
	b = strconv.AppendBool(b, a.Granted)
	b = append(b, `,"buckets":[`...)
	for i := range a.Buckets {
		g := &a.Buckets[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"granted":`...)
		b = appendFloat(b, g.Tokens)
		b = appendWaits(b, g.Remaining, g.RetryAfterMs, g.ResetMs)
	}
	return append(b, "]}\n"...)
}

// DecodeLeaseAnswer reads the service's answer to req. It is untrusted: the
// size and nesting are bounded, it must carry one grant per bucket, a
// granted call must grant each bucket between its min and its want, and a
// refused one nothing; anything else is refused, so a caller never spends a
// token the service did not grant.
func DecodeLeaseAnswer(body []byte, req *LeaseRequest) (*LeaseAnswer, error) {
	v, ferr := parse(body, MaxAnswerBytes)
	if ferr != nil {
		return nil, refusal(ferr)
	}
	granted, ferr := jsonfield.Bool("granted", v.Get("granted"))
	if ferr != nil {
		return nil, refusal(ferr)
	}
	buckets := v.Get("buckets").Array()
	if len(buckets) != len(req.Buckets) {
		return nil, refusal(refuse("buckets", "must hold "+strconv.Itoa(len(req.Buckets))+" grants, got "+strconv.Itoa(len(buckets))))
	}
	a := &LeaseAnswer{Granted: granted, Buckets: make([]Grant, len(buckets))}
	for i, m := range buckets {
		g := &a.Buckets[i]
		at := jsonfield.Elem("buckets", i)
		tokens, err := jsonfield.Number(at+".granted", m.Get("granted"))
		if err != nil {
			return nil, refusal(err)
		}
		lo, hi := req.Buckets[i].Min, req.Buckets[i].Want
		if !granted {
			lo, hi = 0, 0
		}
		if err := between(at+".granted", tokens, lo, hi, false); err != nil {
			return nil, refusal(err)
		}
		g.Tokens = tokens
		g.Remaining, g.RetryAfterMs, g.ResetMs = readWaits(m, req.Buckets[i].Period)
	}
	return a, nil
}

package wire

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/internal/jsonfield"
)

// Limits bound what a call may ask. The zero value of a field means its
// default (the Max* constants, and DefaultMaxBodyBytes).
type Limits struct {
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes int64
	// MaxKeyBytes is the longest key (and hash tag) accepted, in bytes.
	MaxKeyBytes int
	// MaxBuckets is the most buckets one call may carry.
	MaxBuckets int
	// MaxFill is the longest time an empty bucket may need to refill
	// (burst / tokens_per_second): it bounds how long a stored key lives.
	MaxFill time.Duration
}

// DefaultMaxBodyBytes is the default bound of a call's body.
const DefaultMaxBodyBytes = 64 << 10

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = MaxKeyBytes
	}
	if l.MaxBuckets <= 0 {
		l.MaxBuckets = MaxBuckets
	}
	if l.MaxFill <= 0 {
		l.MaxFill = MaxFill
	}
	return l
}

// Bucket is one token bucket of a decision: the bucket stored under Key,
// with the limit Rate (tokens per second) and Burst, asked for Cost tokens.
// A Shadow bucket is decided on its own, outside the decision's atomic
// take, and never refuses it: it measures what a rule in shadow mode would
// do. A Refundable bucket's rule may give back part of its cost after the
// response (a cost known from the response, or charge_on): the service
// records the cost as the caller's reservation, which a later charge call
// of the same caller may refund. Any other decision records nothing, so
// nothing of it can ever be refunded. MaxDelayMs (0 to MaxDelayMs) is how
// long the caller may hold the request for this bucket's tokens: 0 refuses
// a request short of tokens, as before; more reserves them (bucket.Reserve)
// when they would be there within that many milliseconds, and the answer's
// WaitMs says how long to hold.
//
// A bucket with a period (PeriodEndMs > 0) is a quota: Rate is 0, it never
// refills, and it is full again (Burst) from the period's start
// (PeriodStartMs, Unix milliseconds) on, when it was last written before
// it; its waits run to the period's end (PeriodEndMs). The period is not
// part of its identity: the next period's call names the same bucket.
type Bucket struct {
	Key        string
	Rate       float64
	Burst      float64
	Cost       float64
	Shadow     bool
	Refundable bool
	MaxDelayMs int64
	Period
}

// Period is a quota bucket's current calendar period, [StartMs, EndMs) in
// Unix milliseconds; the zero Period is none (a token bucket).
type Period struct {
	PeriodStartMs int64
	PeriodEndMs   int64
}

// IsQuota reports whether p is a period (a quota bucket's).
func (p Period) IsQuota() bool { return p.PeriodEndMs > 0 }

// Request is one decision (POST /v1/decide) over one or more buckets, taken
// atomically: either every enforced bucket admits its cost and all are
// consumed, or none is touched. HashTag is what older plugins sent to place
// all buckets in one Redis Cluster slot; the service accepts and ignores it
// (a bucket's identity is its key and limit), and the plugin sends none.
type Request struct {
	HashTag string
	Buckets []Bucket
}

// Answer is the answer to a Request.
type Answer struct {
	// Allowed reports whether the request was admitted: every enforced
	// bucket had enough tokens, and all of them were consumed. Shadow buckets
	// do not count (it is true for a request of shadow buckets only).
	Allowed bool
	// RetryAfterMs is 0 when allowed, else the largest RetryAfterMs of the
	// enforced buckets that refused.
	RetryAfterMs int64
	// WaitMs is, when allowed, the longest WaitMs of the enforced buckets:
	// how long the caller holds the request before it goes on (0: at once).
	// It is 0 when refused.
	WaitMs int64
	// Buckets holds one entry per requested bucket, in request order.
	Buckets []BucketAnswer
}

// BucketAnswer is the outcome for one bucket: whole tokens and waits in
// whole milliseconds (rounded up), the units of the wire.
type BucketAnswer struct {
	// Allowed reports whether this bucket alone had enough tokens. An
	// enforced bucket can be allowed in a refused request, when another
	// bucket refused; nothing was consumed then. A shadow bucket is decided
	// on its own: allowed means it was consumed.
	Allowed bool
	// Remaining is floor(tokens after the decision): after consumption when
	// the bucket was consumed, the untouched tokens otherwise.
	Remaining int64
	// RetryAfterMs is 0 when this bucket allowed; otherwise the milliseconds
	// until it would, at least 1.
	RetryAfterMs int64
	// ResetMs is the milliseconds until this bucket is full again.
	ResetMs int64
	// WaitMs is, when this bucket allowed with a wait (its MaxDelayMs > 0),
	// the milliseconds (rounded up, at most MaxDelayMs) until its tokens
	// are there; 0 otherwise. A shadow bucket's wait is what the rule would
	// have held; it holds nothing.
	WaitMs int64
	// Tokens is the exact (fractional) tokens behind Remaining. It is not
	// encoded: tests of the service compare it with package bucket.
	Tokens float64
	// Applied is, in the answer to a charge, the amount the bucket took
	// after the service's clamps (a refund is negative). It is not encoded:
	// the service counts it in its metrics.
	Applied float64
}

// Settle sets a's Allowed, RetryAfterMs and WaitMs from its enforced
// buckets.
func (a *Answer) Settle(req *Request) {
	a.Allowed, a.RetryAfterMs, a.WaitMs = true, 0, 0
	for i := range a.Buckets {
		if req.Buckets[i].Shadow {
			continue
		}
		if !a.Buckets[i].Allowed {
			a.Allowed = false
			a.RetryAfterMs = max(a.RetryAfterMs, a.Buckets[i].RetryAfterMs)
		}
		a.WaitMs = max(a.WaitMs, a.Buckets[i].WaitMs)
	}
	if !a.Allowed {
		a.WaitMs = 0
	}
}

// AppendRequest appends the JSON body of r:
//
//	{"hash_tag":"t","buckets":[{"key":"k","tokens_per_second":10,"burst":20,"cost":1,"shadow":true,"refundable":true,"max_delay_ms":500}]}
//	{"buckets":[{"key":"k","tokens_per_second":0,"burst":1000,"period_start_ms":1785297600000,"period_end_ms":1787976000000,"cost":1}]}
//
// (hash_tag, shadow, refundable and max_delay_ms only when set, or for
// max_delay_ms, when the burst is below the rate; the period only for a
// quota).
func AppendRequest(b []byte, r *Request) []byte {
	b = appendTag(b, r.HashTag)
	for i := range r.Buckets {
		bk := &r.Buckets[i]
		b = appendBucket(b, i, bk.Key, bk.Rate, bk.Burst, bk.Period)
		b = append(b, `,"cost":`...)
		b = appendFloat(b, bk.Cost)
		if bk.Shadow {
			b = append(b, `,"shadow":true`...)
		}
		if bk.Refundable {
			b = append(b, `,"refundable":true`...)
		}
		if bk.MaxDelayMs > 0 || bk.Burst < bk.Rate { // below the rate: a bucket that holds (0: not this request)
			b = append(b, `,"max_delay_ms":`...)
			b = strconv.AppendInt(b, bk.MaxDelayMs, 10)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendTag opens a body: the hash tag when set, and the buckets array.
func appendTag(b []byte, tag string) []byte {
	b = append(b, '{')
	if tag != "" {
		b = append(b, `"hash_tag":`...)
		b = appendString(b, tag)
		b = append(b, ',')
	}
	return append(b, `"buckets":[`...)
}

// appendBucket opens the i-th bucket object with its key and limit (and
// its period, for a quota).
func appendBucket(b []byte, i int, key string, rate, burst float64, p Period) []byte {
	if i > 0 {
		b = append(b, ',')
	}
	b = append(b, `{"key":`...)
	b = appendString(b, key)
	b = append(b, `,"tokens_per_second":`...)
	b = appendFloat(b, rate)
	b = append(b, `,"burst":`...)
	b = appendFloat(b, burst)
	if p.IsQuota() {
		b = append(b, `,"period_start_ms":`...)
		b = strconv.AppendInt(b, p.PeriodStartMs, 10)
		b = append(b, `,"period_end_ms":`...)
		b = strconv.AppendInt(b, p.PeriodEndMs, 10)
	}
	return b
}

var requestFields = []string{"hash_tag", "buckets"}

// head is what every bucket of every call has: its key and its limit
// (and, for a quota, its period).
type head struct {
	Key         string
	Rate, Burst float64
	Period
}

// DecodeRequest parses and validates the body of POST /v1/decide. cost
// defaults to 1, shadow and refundable to false, max_delay_ms to 0 (a whole
// number of milliseconds up to MaxDelayMs); hash_tag is optional. Unknown or
// duplicate fields, trailing data and anything out of bounds are refused
// with a *FieldError naming the field. A returned Request satisfies lim.
func DecodeRequest(body []byte, lim Limits) (*Request, error) {
	req := &Request{}
	err := decodeCall(body, lim, &req.HashTag, []string{"cost", "shadow", "refundable", "max_delay_ms"}, func(n int) { req.Buckets = make([]Bucket, n) },
		func(i int, at string, h head, x []gjson.Result) (err *jsonfield.Error) {
			b := &req.Buckets[i]
			b.Key, b.Rate, b.Burst, b.Period = h.Key, h.Rate, h.Burst, h.Period
			if b.Cost, err = amount(at+".cost", x[0], 1, 0, MaxAmount); err != nil {
				return err
			}
			if x[1].Exists() {
				if b.Shadow, err = jsonfield.Bool(at+".shadow", x[1]); err != nil {
					return err
				}
			}
			if x[2].Exists() {
				if b.Refundable, err = jsonfield.Bool(at+".refundable", x[2]); err != nil {
					return err
				}
			}
			b.MaxDelayMs, err = delayMs(at+".max_delay_ms", x[3])
			return err
		})
	if err != nil {
		return nil, refusal(err)
	}
	return req, nil
}

// delayMs reads an optional max_delay_ms: a whole number in [0, MaxDelayMs],
// 0 when absent.
func delayMs(at string, v gjson.Result) (int64, *jsonfield.Error) {
	x, err := amount(at, v, 0, 0, MaxDelayMs)
	if err == nil && x != float64(int64(x)) {
		err = refuse(at, "must be a whole number of milliseconds, got "+fmtFloat(x))
	}
	return int64(x), err
}

// amount reads an optional number (def when absent) within [lo, hi].
func amount(at string, v gjson.Result, def, lo, hi float64) (float64, *jsonfield.Error) {
	if !v.Exists() {
		return def, nil
	}
	x, err := jsonfield.Number(at, v)
	if err == nil {
		err = between(at, x, lo, hi, false)
	}
	return x, err
}

// decodeCall decodes the shape every call shares: an optional hash_tag and
// a buckets array of objects, each with a key, tokens_per_second and burst,
// and for a quota period_start_ms and period_end_ms (checked here), and the call's own fields, named by extra and handed to
// bucket in that order (absent ones as the zero gjson.Result), after the
// bucket's limit is checked. Keys must be distinct within a call.
func decodeCall(body []byte, lim Limits, tag *string, extra []string, alloc func(int),
	bucket func(i int, at string, h head, x []gjson.Result) *jsonfield.Error) *jsonfield.Error {
	lim = lim.WithDefaults()
	v, ferr := parse(body, lim.MaxBodyBytes)
	if ferr != nil {
		return ferr
	}
	var buckets []gjson.Result
	hasBuckets := false
	ferr = fields("", v, requestFields, func(f int, p string, m gjson.Result) (err *jsonfield.Error) {
		if f == 0 {
			*tag, err = jsonfield.String(p, m)
			if err == nil {
				err = checkTag(*tag, lim)
			}
			return err
		}
		hasBuckets = true
		buckets, err = array(p, m, lim.MaxBuckets)
		return err
	})
	if ferr == nil && !hasBuckets {
		ferr = refuse("buckets", "required")
	}
	if ferr != nil {
		return ferr
	}
	alloc(len(buckets))
	names := append([]string{"key", "tokens_per_second", "burst", "period_start_ms", "period_end_ms"}, extra...)
	keys := make([]string, len(buckets))
	for i, m := range buckets {
		at := jsonfield.Elem("buckets", i)
		var h head
		var have [5]bool
		x := make([]gjson.Result, len(extra))
		err := fields(at, m, names, func(f int, p string, m gjson.Result) (err *jsonfield.Error) {
			switch f {
			case 0:
				h.Key, err = key(p, m, lim)
			case 1:
				h.Rate, err = jsonfield.Number(p, m)
			case 2:
				h.Burst, err = jsonfield.Number(p, m)
			case 3:
				h.PeriodStartMs, err = unixMs(p, m)
			case 4:
				h.PeriodEndMs, err = unixMs(p, m)
			default:
				x[f-len(have)] = m
			}
			if f < len(have) {
				have[f] = true
			}
			return err
		})
		if err == nil {
			err = checkPeriod(at, have[3], have[4], h.Period, h.Rate)
		}
		if err == nil && h.IsQuota() {
			err = checkQuota(at, have[0], have[1], have[2], h.Burst)
		} else if err == nil {
			// A bucket that may hold requests smooths them to the rate, so
			// its burst may be below the rate (one request at a time): a
			// decide call's bucket that names a max_delay_ms (0 included:
			// its rule holds max_waiting requests already, so this one may
			// not wait, but the bucket is the one the others wait on), any charge (a
			// refund of a held request, a cost from the response), and any
			// lease (a leased rule with a max_delay_ms holds its requests
			// in the gateway: the lease call carries no delay).
			smooth := len(extra) == 4 && extra[3] == "max_delay_ms" && x[3].Exists() ||
				len(extra) == 1 && extra[0] == "amount" ||
				len(extra) == 3 && extra[0] == "want"
			err = checkLimit(at, have[0], have[1], have[2], smooth, h.Rate, h.Burst, lim)
		}
		if err == nil {
			err = bucket(i, at, h, x)
		}
		if err != nil {
			return err
		}
		keys[i] = h.Key
		for j := range i {
			if keys[j] == h.Key {
				return refuse(at+".key", "duplicate of buckets["+strconv.Itoa(j)+"].key")
			}
		}
	}
	return nil
}

// unixMs reads a period bound: a whole number of Unix milliseconds, above
// 0 and at most maxUnixMs.
func unixMs(at string, v gjson.Result) (int64, *jsonfield.Error) {
	x, err := jsonfield.Number(at, v)
	if err == nil {
		err = between(at, x, 0, maxUnixMs, true)
	}
	if err == nil && x != float64(int64(x)) {
		err = refuse(at, "must be a whole number of milliseconds, got "+fmtFloat(x))
	}
	return int64(x), err
}

// maxUnixMs is the latest period bound accepted (in 2255): the service
// counts in Unix microseconds, which float64 (Lua's numbers) holds exactly
// up to 2^53.
const maxUnixMs = 1<<53/1000 - 1

// checkPeriod checks a bucket's period: both bounds or neither, the end
// after the start by at most MaxPeriod, and a rate of 0 with a period.
func checkPeriod(at string, hasStart, hasEnd bool, p Period, rate float64) *jsonfield.Error {
	switch {
	case hasStart && !hasEnd:
		return refuse(at+".period_end_ms", "required with period_start_ms")
	case hasEnd && !hasStart:
		return refuse(at+".period_start_ms", "required with period_end_ms")
	case !hasEnd:
		return nil
	case p.PeriodEndMs <= p.PeriodStartMs:
		return refuse(at+".period_end_ms", "must be > period_start_ms ("+strconv.FormatInt(p.PeriodStartMs, 10)+"), got "+strconv.FormatInt(p.PeriodEndMs, 10))
	case p.PeriodEndMs-p.PeriodStartMs > MaxPeriod.Milliseconds():
		return refuse(at+".period_end_ms", "must be at most "+MaxPeriod.String()+" after period_start_ms, got "+strconv.FormatInt(p.PeriodEndMs-p.PeriodStartMs, 10)+"ms")
	case rate != 0:
		return refuse(at+".tokens_per_second", "must be 0 with a period (a quota never refills), got "+fmtFloat(rate))
	}
	return nil
}

// checkQuota checks a quota bucket's key and burst (its limit for the
// period); its rate is 0 (checkPeriod).
func checkQuota(at string, hasKey, hasRate, hasBurst bool, burst float64) *jsonfield.Error {
	switch {
	case !hasKey:
		return refuse(at+".key", "required")
	case !hasRate:
		return refuse(at+".tokens_per_second", "required")
	case !hasBurst:
		return refuse(at+".burst", "required")
	}
	return between(at+".burst", burst, 0, MaxAmount, true)
}

func checkTag(tag string, lim Limits) *jsonfield.Error {
	switch {
	case tag == "":
		return refuse("hash_tag", "must not be empty (leave it out instead)")
	case len(tag) > lim.MaxKeyBytes:
		return refuse("hash_tag", "longer than "+strconv.Itoa(lim.MaxKeyBytes)+" bytes")
	case strings.ContainsAny(tag, "{}"):
		return refuse("hash_tag", "must not contain { or }")
	}
	return nil
}

func key(at string, v gjson.Result, lim Limits) (string, *jsonfield.Error) {
	k, err := jsonfield.String(at, v)
	switch {
	case err != nil:
		return "", err
	case k == "":
		return "", refuse(at, "must not be empty")
	case len(k) > lim.MaxKeyBytes:
		return "", refuse(at, "longer than "+strconv.Itoa(lim.MaxKeyBytes)+" bytes")
	}
	return k, nil
}

// checkLimit checks a bucket's key, rate and burst: present, and within the
// contract's bounds. burst >= rate, unless smooth (a bucket with a
// max_delay_ms), where burst need only be > 0.
func checkLimit(at string, hasKey, hasRate, hasBurst, smooth bool, rate, burst float64, lim Limits) *jsonfield.Error {
	switch {
	case !hasKey:
		return refuse(at+".key", "required")
	case !hasRate:
		return refuse(at+".tokens_per_second", "required")
	case !hasBurst:
		return refuse(at+".burst", "required")
	}
	if err := between(at+".tokens_per_second", rate, 0, MaxAmount, true); err != nil {
		return err
	}
	switch {
	case smooth && !(burst > 0):
		return refuse(at+".burst", "must be > 0, got "+fmtFloat(burst))
	case !smooth && !(burst >= rate):
		return refuse(at+".burst", "must be >= tokens_per_second ("+fmtFloat(rate)+"), got "+fmtFloat(burst))
	case burst > MaxAmount:
		return refuse(at+".burst", "must be <= "+fmtFloat(MaxAmount)+", got "+fmtFloat(burst))
	case burst/rate > lim.MaxFill.Seconds():
		return refuse(at+".burst", "must refill within "+lim.MaxFill.String()+": burst / tokens_per_second is "+fmtFloat(burst/rate)+"s")
	}
	return nil
}

// AppendAnswer appends the JSON of a:
//
//	{"allowed":false,"retry_after_ms":250,"buckets":[{"allowed":false,"remaining":0,"retry_after_ms":250,"reset_ms":4000}]}
//	{"allowed":true,"retry_after_ms":0,"wait_ms":300,"buckets":[{"allowed":true,"remaining":0,"retry_after_ms":0,"reset_ms":400,"wait_ms":300}]}
//
// (wait_ms only when not 0: an absent wait_ms reads as 0).
func AppendAnswer(b []byte, a *Answer) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, a.Allowed)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, a.RetryAfterMs, 10)
	b = appendWait(b, a.WaitMs)
	b = append(b, `,"buckets":[`...)
	for i := range a.Buckets {
		ba := &a.Buckets[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"allowed":`...)
		b = strconv.AppendBool(b, ba.Allowed)
		b = appendWaits(b, ba.Remaining, ba.RetryAfterMs, ba.ResetMs)
		if ba.WaitMs > 0 {
			b = appendWait(b[:len(b)-1], ba.WaitMs)
			b = append(b, '}')
		}
	}
	return append(b, "]}\n"...)
}

// appendWait appends `,"wait_ms":n` when n is not 0.
func appendWait(b []byte, n int64) []byte {
	if n == 0 {
		return b
	}
	b = append(b, `,"wait_ms":`...)
	return strconv.AppendInt(b, n, 10)
}

// appendWaits closes a bucket's answer: remaining, retry_after_ms, reset_ms.
func appendWaits(b []byte, remaining, retryMs, resetMs int64) []byte {
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, remaining, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, retryMs, 10)
	b = append(b, `,"reset_ms":`...)
	b = strconv.AppendInt(b, resetMs, 10)
	return append(b, '}')
}

// DecodeAnswer reads the service's answer to req. The answer is untrusted:
// its size and nesting are bounded before it is parsed, it must carry one
// bucket per requested bucket, and its verdict must agree with its enforced
// buckets (a refusal with no refusing enforced bucket, or the reverse, is
// refused). Negative counts and waits read as 0; an enforced bucket that
// refused waits at least 1 ms. A bucket's wait_ms counts only when it
// allowed; one longer than the bucket's MaxDelayMs is refused (holding it
// would break the rate), and the answer's wait_ms, when present, must be
// the longest of its enforced buckets' when allowed.
func DecodeAnswer(body []byte, req *Request) (*Answer, error) {
	v, ferr := parse(body, MaxAnswerBytes)
	if ferr != nil {
		return nil, refusal(ferr)
	}
	allowed, ferr := jsonfield.Bool("allowed", v.Get("allowed"))
	if ferr != nil {
		return nil, refusal(ferr)
	}
	buckets := v.Get("buckets").Array()
	if len(buckets) != len(req.Buckets) {
		return nil, refusal(refuse("buckets", "must hold "+strconv.Itoa(len(req.Buckets))+" answers, got "+strconv.Itoa(len(buckets))))
	}
	a := &Answer{Buckets: make([]BucketAnswer, len(buckets))}
	for i, m := range buckets {
		ba := &a.Buckets[i]
		ba.Allowed = m.Get("allowed").Type == gjson.True
		ba.Remaining, ba.RetryAfterMs, ba.ResetMs = readWaits(m, req.Buckets[i].Period)
		if !ba.Allowed && !req.Buckets[i].Shadow {
			ba.RetryAfterMs = max(ba.RetryAfterMs, 1)
		}
		if w := m.Get("wait_ms").Num; ba.Allowed && w > 0 {
			if w > float64(req.Buckets[i].MaxDelayMs) {
				return nil, refusal(refuse(jsonfield.Elem("buckets", i)+".wait_ms", "must be <= max_delay_ms ("+strconv.FormatInt(req.Buckets[i].MaxDelayMs, 10)+"), got "+fmtFloat(w)))
			}
			ba.WaitMs = int64(math.Ceil(w))
		}
	}
	a.Settle(req)
	if a.Allowed != allowed {
		return nil, refusal(refuse("allowed", "disagrees with its buckets"))
	}
	if w := v.Get("wait_ms"); w.Exists() && a.Allowed && w.Num != float64(a.WaitMs) {
		return nil, refusal(refuse("wait_ms", "disagrees with its buckets"))
	}
	return a, nil
}

// readWaits reads remaining, retry_after_ms and reset_ms, clamped to
// [0, MaxFill], or for a quota to [0, its period's length] (its waits run
// to the period's end).
func readWaits(m gjson.Result, p Period) (remaining, retryMs, resetMs int64) {
	maxMs := float64(max(MaxFill.Milliseconds(), p.PeriodEndMs-p.PeriodStartMs))
	clamp := func(x float64, hi float64) int64 {
		if !(x > 0) {
			return 0
		}
		return int64(min(x, hi))
	}
	return clamp(m.Get("remaining").Num, MaxAmount), clamp(m.Get("retry_after_ms").Num, maxMs), clamp(m.Get("reset_ms").Num, maxMs)
}

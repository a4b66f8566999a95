package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// Bucket is one token bucket of a request: the bucket stored under Key, with
// the limit Rate (tokens per second) and Burst, asked for Cost tokens. A
// Shadow bucket is decided on its own, outside the request's atomic
// decision, and never refuses the request: it measures what a rule in
// shadow mode would do.
type Bucket struct {
	Key    string
	Rate   float64
	Burst  float64
	Cost   float64
	Shadow bool
}

// Request is one decision over one or more buckets, taken atomically: either
// every bucket admits its cost and all are consumed, or none is touched.
// HashTag, when set, places all buckets in one Redis Cluster slot; see the
// package documentation for how it names the stored keys.
type Request struct {
	HashTag string
	Buckets []Bucket
}

// Limits bound what a request may ask. The zero value of a field means its
// default (the Default* constants).
type Limits struct {
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes int64
	// MaxKeyBytes is the longest key (and hash tag) accepted, in bytes.
	MaxKeyBytes int
	// MaxBuckets is the most buckets one request may carry.
	MaxBuckets int
	// MaxFill is the longest time an empty bucket may need to refill
	// (burst / tokens_per_second): it bounds how long a stored key lives.
	MaxFill time.Duration
}

// Defaults of Limits, and the bound on rates, bursts and costs: the wire
// contract's, which the plugin's configuration parser checks cluster rules
// against.
const (
	DefaultMaxBodyBytes = 64 << 10
	DefaultMaxKeyBytes  = wire.MaxKeyBytes
	DefaultMaxBuckets   = wire.MaxBuckets
	DefaultMaxFill      = wire.MaxFill
	MaxAmount           = wire.MaxAmount
)

// withDefaults returns l with every zero field set to its default.
func (l Limits) withDefaults() Limits {
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxKeyBytes <= 0 {
		l.MaxKeyBytes = DefaultMaxKeyBytes
	}
	if l.MaxBuckets <= 0 {
		l.MaxBuckets = DefaultMaxBuckets
	}
	if l.MaxFill <= 0 {
		l.MaxFill = DefaultMaxFill
	}
	return l
}

// ValidationError is a request the service refuses. Field names the offending
// part of the JSON body ("buckets[0].burst", "body").
type ValidationError struct {
	Field string
	Msg   string
}

// Error implements error.
func (e *ValidationError) Error() string { return "service: request: " + e.Detail() }

// Detail is the message for the client: "<field>: <what is wrong>".
func (e *ValidationError) Detail() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// wireRequest and wireBucket are the JSON body; pointers tell a missing field
// from a zero one. Buckets are decoded one by one so errors can name the index.
type wireRequest struct {
	HashTag *string           `json:"hash_tag"`
	Buckets []json.RawMessage `json:"buckets"`
}

type wireBucket struct {
	Key    *string  `json:"key"`
	Rate   *float64 `json:"tokens_per_second"`
	Burst  *float64 `json:"burst"`
	Cost   *float64 `json:"cost"`
	Shadow bool     `json:"shadow"`
}

// DecodeRequest parses and validates a JSON body of POST /v1/decide:
//
//	{"hash_tag": "...", "buckets": [{"key": "...", "tokens_per_second": 10, "burst": 20, "cost": 1, "shadow": false}]}
//
// hash_tag, cost and shadow are optional (cost defaults to 1, shadow to
// false). Unknown fields,
// trailing data and anything out of bounds are refused with a
// *ValidationError naming the field. A returned Request always satisfies
// lim.
func DecodeRequest(body []byte, lim Limits) (*Request, error) {
	lim = lim.withDefaults()
	if int64(len(body)) > lim.MaxBodyBytes {
		return nil, invalid("body", "larger than %d bytes", lim.MaxBodyBytes)
	}
	hashTag, wire, err := decodeWire(body)
	if err != nil {
		return nil, err
	}
	return validate(hashTag, wire, lim)
}

// decodeWire decodes the JSON of a request body without validating values.
func decodeWire(body []byte) (*string, []wireBucket, error) {
	// Fast path: one pass into the final shape. Only when it fails is the
	// body decoded again bucket by bucket, for a message naming the index.
	var fast struct {
		HashTag *string      `json:"hash_tag"`
		Buckets []wireBucket `json:"buckets"`
	}
	if decodeStrict(body, &fast) == nil {
		return fast.HashTag, fast.Buckets, nil
	}
	var w wireRequest
	if err := decodeStrict(body, &w); err != nil {
		return nil, nil, jsonError("", err)
	}
	buckets := make([]wireBucket, len(w.Buckets))
	for i, raw := range w.Buckets {
		if err := decodeStrict(raw, &buckets[i]); err != nil {
			return nil, nil, jsonError("buckets["+strconv.Itoa(i)+"]", err)
		}
	}
	if w.Buckets == nil {
		buckets = nil
	}
	return w.HashTag, buckets, nil
}

// validate checks a decoded body against lim and builds the Request.
func validate(hashTag *string, wire []wireBucket, lim Limits) (*Request, error) {
	req := &Request{}
	if hashTag != nil {
		tag := *hashTag
		switch {
		case tag == "":
			return nil, invalid("hash_tag", "must not be empty (leave it out instead)")
		case len(tag) > lim.MaxKeyBytes:
			return nil, invalid("hash_tag", "longer than %d bytes", lim.MaxKeyBytes)
		case strings.ContainsAny(tag, "{}"):
			return nil, invalid("hash_tag", "must not contain { or }")
		}
		req.HashTag = tag
	}
	if wire == nil {
		return nil, invalid("buckets", "required")
	}
	if n := len(wire); n == 0 || n > lim.MaxBuckets {
		return nil, invalid("buckets", "must hold 1 to %d buckets, got %d", lim.MaxBuckets, n)
	}
	req.Buckets = make([]Bucket, len(wire))
	for i := range wire {
		field := "buckets[" + strconv.Itoa(i) + "]"
		b, err := wire[i].bucket(field, lim)
		if err != nil {
			return nil, err
		}
		for j := range i {
			if req.Buckets[j].Key == b.Key {
				return nil, invalid(field+".key", "duplicate of buckets[%d].key", j)
			}
		}
		req.Buckets[i] = b
	}
	return req, nil
}

// bucket validates one decoded bucket.
func (wb *wireBucket) bucket(field string, lim Limits) (Bucket, error) {
	var b Bucket
	switch {
	case wb.Key == nil:
		return b, invalid(field+".key", "required")
	case *wb.Key == "":
		return b, invalid(field+".key", "must not be empty")
	case len(*wb.Key) > lim.MaxKeyBytes:
		return b, invalid(field+".key", "longer than %d bytes", lim.MaxKeyBytes)
	}
	b.Key = *wb.Key
	if wb.Rate == nil {
		return b, invalid(field+".tokens_per_second", "required")
	}
	b.Rate = *wb.Rate
	if !(b.Rate > 0 && b.Rate <= MaxAmount) {
		return b, invalid(field+".tokens_per_second", "must be > 0 and <= %g, got %g", float64(MaxAmount), b.Rate)
	}
	if wb.Burst == nil {
		return b, invalid(field+".burst", "required")
	}
	b.Burst = *wb.Burst
	switch {
	case !(b.Burst >= b.Rate):
		return b, invalid(field+".burst", "must be >= tokens_per_second (%g), got %g", b.Rate, b.Burst)
	case b.Burst > MaxAmount:
		return b, invalid(field+".burst", "must be <= %g, got %g", float64(MaxAmount), b.Burst)
	case b.Burst/b.Rate > lim.MaxFill.Seconds():
		return b, invalid(field+".burst", "must refill within %v: burst / tokens_per_second is %gs", lim.MaxFill, b.Burst/b.Rate)
	}
	b.Shadow = wb.Shadow
	b.Cost = 1
	if wb.Cost != nil {
		b.Cost = *wb.Cost
		if !(b.Cost >= 0 && b.Cost <= MaxAmount) {
			return b, invalid(field+".cost", "must be >= 0 and <= %g, got %g", float64(MaxAmount), b.Cost)
		}
	}
	return b, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) != 0 {
		return errTrailing
	}
	return nil
}

var errTrailing = errors.New("unexpected data after the JSON value")

// jsonError turns an encoding/json error met while decoding the object at
// field ("" for the body) into a *ValidationError.
func jsonError(field string, err error) *ValidationError {
	join := func(name string) string {
		switch {
		case field == "":
			return name
		case name == "":
			return field
		}
		return field + "." + name
	}
	whole := field
	if whole == "" {
		whole = "body"
	}
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		want := typeErr.Type.Kind().String()
		switch want {
		case "float64":
			want = "a number"
		case "string":
			want = "a string"
		case "slice":
			want = "an array"
		case "struct":
			want = "an object"
		}
		name := typeErr.Field
		if name == "" {
			return invalid(whole, "must be %s, got %s", want, typeErr.Value)
		}
		return invalid(join(name), "must be %s, got %s", want, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return invalid(whole, "invalid JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return invalid(whole, "truncated or empty JSON")
	case errors.Is(err, errTrailing):
		return invalid(whole, "%v", err)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		unq, qerr := strconv.Unquote(name)
		if qerr != nil {
			unq = name
		}
		return invalid(join(unq), "unknown field")
	}
	return invalid(whole, "%s", strings.TrimPrefix(err.Error(), "json: "))
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// RateLimitQuota is Envoy's own rate limit quota filter
// (envoy.filters.http.rate_limit_quota) on a listener: it reports the
// requests of each quota bucket over one gRPC stream to the rate limit quota
// service (RLQS) on the cluster "rlqs" (Options.RLQSPort) and enforces
// locally the assignments that service sends back.
//
// A request carrying every header of Headers falls in the bucket whose id
// maps each Key to that header's value ({api_key: <x-api-key>}); a request
// lacking one matches no bucket, and the filter lets it through.
type RateLimitQuota struct {
	// Domain is the filter's domain: the RLQS server's name for the
	// configuration its buckets are read against.
	Domain string
	// Headers build the bucket id, in this order; at least one.
	Headers []BucketHeader
	// ReportingInterval is the buckets' reporting_interval (required by
	// Envoy); 0 means 1 s. Envoy 1.40 reports every 5 s whatever it says
	// (a fixed timer: envoyproxy/envoy#46033).
	ReportingInterval time.Duration
	// NoAssignment is what a bucket does before its first assignment:
	// "DENY_ALL" (the default: no request passes uncounted) or
	// "ALLOW_ALL".
	NoAssignment string
	// Expired is what a bucket does once its assignment's time to live
	// ran out: "DENY_ALL" (the default), "ALLOW_ALL" or
	// "REUSE_LAST_ASSIGNMENT".
	Expired string
	// DenyStatus is the status of a denied request; 0 means 429.
	DenyStatus int
}

// BucketHeader is one entry of a bucket id: Key, read from the request
// header Header.
type BucketHeader struct {
	Key, Header string
}

// keyRE is what a bucket id key or header name may be in the template: the
// key becomes a YAML mapping key, the header a header name.
var keyRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// withDefaults checks q and fills its zero fields.
func (q RateLimitQuota) withDefaults() (RateLimitQuota, error) {
	if q.Domain == "" {
		return q, errors.New("RateLimitQuota.Domain: empty")
	}
	if len(q.Headers) == 0 {
		return q, errors.New("RateLimitQuota.Headers: none (a bucket id needs an entry)")
	}
	seen := map[string]bool{}
	for i, h := range q.Headers {
		if !keyRE.MatchString(h.Key) || !keyRE.MatchString(h.Header) || seen[h.Key] {
			return q, fmt.Errorf("RateLimitQuota.Headers[%d]: key %q, header %q: want distinct keys and names of %s", i, h.Key, h.Header, keyRE)
		}
		seen[h.Key] = true
	}
	q.ReportingInterval = cmp.Or(q.ReportingInterval, time.Second)
	if q.ReportingInterval < time.Millisecond || q.ReportingInterval%time.Millisecond != 0 {
		return q, fmt.Errorf("RateLimitQuota.ReportingInterval: %v, want whole milliseconds", q.ReportingInterval)
	}
	q.NoAssignment = cmp.Or(q.NoAssignment, "DENY_ALL")
	q.Expired = cmp.Or(q.Expired, "DENY_ALL")
	q.DenyStatus = cmp.Or(q.DenyStatus, 429)
	if q.NoAssignment != "DENY_ALL" && q.NoAssignment != "ALLOW_ALL" {
		return q, fmt.Errorf("RateLimitQuota.NoAssignment: %q, want DENY_ALL or ALLOW_ALL", q.NoAssignment)
	}
	switch q.Expired {
	case "DENY_ALL", "ALLOW_ALL", "REUSE_LAST_ASSIGNMENT":
	default:
		return q, fmt.Errorf("RateLimitQuota.Expired: %q, want DENY_ALL, ALLOW_ALL or REUSE_LAST_ASSIGNMENT", q.Expired)
	}
	if q.DenyStatus < 200 || q.DenyStatus > 599 {
		return q, fmt.Errorf("RateLimitQuota.DenyStatus: %d, want an HTTP status", q.DenyStatus)
	}
	return q, nil
}

// Interval is ReportingInterval as a protobuf JSON duration ("1.500s").
func (q RateLimitQuota) Interval() string {
	return fmt.Sprintf("%d.%03ds", q.ReportingInterval/time.Second, q.ReportingInterval%time.Second/time.Millisecond)
}

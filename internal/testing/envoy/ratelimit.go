// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package envoy

import (
	"fmt"
	"strconv"
	"strings"
)

// RateLimit puts Envoy's own rate limit filter (envoy.filters.http.ratelimit,
// the client of the rate limit service API) on a listener, before the
// plugin, calling the cluster "rls" (Options.RLSPort, HTTP/2) over gRPC.
// No plugin is needed for it.
//
// The filter sends one descriptor per entry of the route's rate_limits
// (RouteRateLimits, the classic place) or of its own (FilterRateLimits:
// there Envoy also takes hits_addend, which it ignores on a route). Envoy
// ignores the route's when the filter has its own, so one of the two is
// set. The route routes to the cluster "upstream" (Options.UpstreamPort):
// Envoy applies rate limits only on a route to a cluster.
type RateLimit struct {
	// Domain is the filter's domain (the configuration's `domain:`).
	Domain string
	// FailureModeDeny answers 500 when the service fails or times out;
	// false lets the request through.
	FailureModeDeny bool
	// Timeout bounds each call ("" = 5s: generous for a loaded machine;
	// Envoy's own default is 20ms).
	Timeout string
	// RouteRateLimits and FilterRateLimits are YAML lists of
	// envoy.config.route.v3.RateLimit (see RateLimitsYAML): the route's
	// rate_limits or the filter's (not both).
	RouteRateLimits, FilterRateLimits string
	// XRateLimitHeaders is enable_x_ratelimit_headers ("" = DRAFT_VERSION_03,
	// the x-ratelimit-limit, -remaining and -reset headers; "OFF" for none).
	XRateLimitHeaders string
	// Token, when set, is sent as "authorization: Bearer <Token>" in every
	// call's metadata (the service's initial_metadata): limitd's token.
	Token string
	// Extra are more fields of the filter's configuration (YAML), e.g.
	// "enable_retry_after_header: true".
	Extra string
}

// Descriptor is one entry of rate_limits: its actions, in order, make the
// entries of one descriptor (nested keys in the service's configuration);
// when an action finds nothing (a missing header), no descriptor is sent.
type Descriptor struct {
	Actions []Action
	// HitsAddend, when not empty, is hits_addend.format: a substitution
	// format with one field, e.g. "%REQ(x-hits)%" (a header's value).
	// Envoy applies it in FilterRateLimits only.
	HitsAddend string
	// HitsAddendNumber, when not 0, is hits_addend.number.
	HitsAddendNumber uint64
}

// Action is one rate limit action of envoy.config.route.v3.RateLimit.Action,
// as YAML flow text.
type Action string

// RequestHeaders is the request_headers action: descriptor key key, the
// value of header (no descriptor when the header is missing).
func RequestHeaders(header, key string) Action {
	return Action(fmt.Sprintf("{request_headers: {header_name: %s, descriptor_key: %s}}", quote(header), quote(key)))
}

// GenericKey is the generic_key action: the entry key=value ("" key means
// Envoy's default key, generic_key).
func GenericKey(key, value string) Action {
	if key == "" {
		return Action(fmt.Sprintf("{generic_key: {descriptor_value: %s}}", quote(value)))
	}
	return Action(fmt.Sprintf("{generic_key: {descriptor_key: %s, descriptor_value: %s}}", quote(key), quote(value)))
}

// RemoteAddress is the remote_address action: the entry
// remote_address=<client address>.
func RemoteAddress() Action { return "{remote_address: {}}" }

// RateLimitsYAML renders ds as a YAML list of envoy.config.route.v3.RateLimit,
// for RateLimit.RouteRateLimits or FilterRateLimits.
func RateLimitsYAML(ds ...Descriptor) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString("- actions:\n")
		for _, a := range d.Actions {
			b.WriteString("  - " + string(a) + "\n")
		}
		switch {
		case d.HitsAddend != "":
			b.WriteString("  hits_addend: {format: " + quote(d.HitsAddend) + "}\n")
		case d.HitsAddendNumber != 0:
			b.WriteString("  hits_addend: {number: " + strconv.FormatUint(d.HitsAddendNumber, 10) + "}\n")
		}
	}
	return b.String()
}

// quote is s as a YAML double-quoted scalar (JSON string syntax).
func quote(s string) string {
	q, err := jsonText(s)
	if err != nil { // a string always encodes
		return strconv.Quote(s)
	}
	return q
}

package rls

import (
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// ResponseHeaders are the names of the headers that report, in every
// answer with a limit, the limit closest to refusing, as
// envoyproxy/ratelimit reports it with LIMIT_RESPONSE_HEADERS_ENABLED (in
// response_headers_to_add, which Envoy's ratelimit filter adds to the
// client's response):
//
//   - the descriptor reported is the last one refused (over its limit and
//     neither shadow_mode nor quota_mode); when none is, the first of the
//     fewest remaining hits among those with a limit (unlimited ones have
//     none);
//   - Limit is its requests_per_unit (not a token bucket's burst);
//   - Remaining is its remaining hits: a fixed window's limit minus its
//     count, a token bucket's whole tokens left; 0 over the limit;
//   - Reset is whole seconds: a fixed window's seconds to its end (the
//     unit minus the clock's Unix seconds modulo the unit, as there), a
//     token bucket's seconds until it is full again, rounded up.
type ResponseHeaders struct {
	Limit, Remaining, Reset string
}

// DefaultResponseHeaders are envoyproxy/ratelimit's names
// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
var DefaultResponseHeaders = ResponseHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

// of is the headers of descriptor d, which has a limit.
func (h *ResponseHeaders) of(d *descriptor) []*core.HeaderValue {
	reset := int64((d.reset + time.Second - 1) / time.Second)
	return []*core.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(d.limit.RequestsPerUnit), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(min(d.remaining, 1<<32-1), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(reset, 10)},
	}
}

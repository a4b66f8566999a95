package engine

import (
	"math"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
)

// resume continues the paused request.
func (c *Request) resume() {
	if err := c.stream.Resume(); err != nil {
		p := c.plugin
		p.warn(&p.replyLog, "resuming the request: "+err.Error())
	}
}

// sendReply sends the local reply for rej and reports whether it was sent.
//
// A missing limit key answers 400 whatever the rule's status: the request
// is malformed for the rule, not over a limit, and a client must be able to
// tell the two apart. Every other reason answers the rule's status (429 by
// default). Only token_bucket_exceeded carries RateLimit headers and a
// jittered Retry-After (the wait, in whole seconds), and
// concurrency_limit_exceeded (1 or 2 seconds: concurrency.go); limit_service_unavailable
// carries "Retry-After: 1" (the outage is the service's, its end unknown);
// cost_exceeds_burst and missing_limit_key never pass by waiting and carry
// neither.
func (c *Request) sendReply(rej rejection) bool {
	ru := rej.rule
	status, errName := ru.Status, "rate_limited"
	if rej.reason == reasonMissingKey {
		status, errName = 400, "bad_request"
	}
	hs := make([][2]string, 0, 8+len(ru.ResponseHeaders))
	retry := int64(0)
	switch rej.reason {
	case reasonExceeded:
		retry = jitter(wholeSeconds(rej.d.RetryAfter), c.jitterKey(ru))
		hs = append(hs, [2]string{"retry-after", strconv.FormatInt(retry, 10)})
		c.rateLimitHeaders(ru, rej.d, func(name, value string) {
			hs = append(hs, [2]string{name, strings.Clone(value)}) // value aliases a scratch buffer
		})
	case reasonConcurrency:
		retry = slotRetryAfter(c.jitterKey(ru))
		hs = append(hs, [2]string{"retry-after", strconv.FormatInt(retry, 10)})
		c.rateLimitHeaders(ru, rej.d, func(name, value string) {
			hs = append(hs, [2]string{name, strings.Clone(value)})
		})
	case reasonServiceDown:
		retry = 1
		hs = append(hs, [2]string{"retry-after", "1"})
	}
	hs = append(hs, [2]string{"x-ratelimit-reason", rej.reason})
	for _, h := range ru.ResponseHeaders {
		hs = append(hs, [2]string{h.Name, h.Value})
	}
	body := ru.Body
	if body == "" {
		hs = append(hs, [2]string{"content-type", "application/json"})
		body = defaultBody(errName, ru.Name, rej.reason, retry)
	}
	if err := c.stream.SendReply(status, hs, []byte(body)); err != nil {
		ru.failedOpen.Increment(1)
		p := c.plugin
		p.warn(&p.replyLog, "sending the "+strconv.Itoa(status)+" reply failed, the request goes on (counted in rule."+ru.Name+".failed_open): "+err.Error())
		return false
	}
	ru.rejected.Increment(1)
	c.localReply = true
	return true
}

// wholeSeconds rounds a wait up to the whole seconds headers carry.
func wholeSeconds(d time.Duration) int64 {
	if d >= bucket.Never-time.Second {
		return int64(d / time.Second)
	}
	return int64((d + time.Second - 1) / time.Second)
}

// rateLimitHeaders passes add the headers the configuration's style asks
// for. On a rejection, t is the wait before a retry can succeed; otherwise the
// time until the bucket is full again. The values it formats alias the
// plugin's scratch buffer and are valid only during the call to add (see
// hostString), so the allowed path allocates nothing here.
func (c *Request) rateLimitHeaders(ru *rule, d bucket.Decision, add func(name, value string)) {
	style := c.plugin.cfg.Headers
	if style == config.HeadersNone {
		return
	}
	wait := d.ResetAfter
	if !d.Allowed {
		wait = d.RetryAfter
	}
	t := wholeSeconds(wait)
	remaining := max(d.Remaining, 0)
	b := &c.scratch.text
	if style == config.HeadersBoth || style == config.HeadersDraft {
		add("ratelimit-policy", ru.policy)
		*b = append((*b)[:0], ru.quotedName...)
		*b = append(*b, ";r="...)
		*b = strconv.AppendInt(*b, remaining, 10)
		*b = append(*b, ";t="...)
		*b = strconv.AppendInt(*b, t, 10)
		add("ratelimit", aliasString(*b))
	}
	if style == config.HeadersBoth || style == config.HeadersLegacy {
		add("ratelimit-limit", ru.burst)
		*b = strconv.AppendInt((*b)[:0], remaining, 10)
		add("ratelimit-remaining", aliasString(*b))
		*b = strconv.AppendInt((*b)[:0], t, 10)
		add("ratelimit-reset", aliasString(*b))
	}
}

// jitter spreads Retry-After per client: the base wait plus up to 50% more,
// the same for the same client (id: jitterKey), never below the base, so
// that clients rejected together do not all come back at the same second.
// The key is not the bucket's identity, which is keyed by a secret of the
// Envoy process (hash.go): with it a client's Retry-After would change with
// every restart and differ between the Envoys of a fleet.
func jitter(base int64, id uint64) int64 {
	if base < 1 {
		base = 1
	}
	f := float64(mix(id^0x5851f42d4c957f2d)>>11) / (1 << 53) // [0, 1)
	return base + int64(math.Floor(float64(base)*0.5*f))
}

// jitterKey keys the jitter of ru's Retry-After for this request's client:
// the unkeyed hash of the rule and its key values, the same in every Envoy
// (a missing value hashes as the rule's one shared bucket). It reads the
// values again from the host, once per rejection: nothing per allowed
// request.
func (c *Request) jitterKey(ru *rule) uint64 {
	r := requestValues{s: c.stream, cfg: c.plugin.cfg}
	h := ru.clusterName
	for _, k := range ru.LimitKeys {
		v, has := r.value(k)
		if !has {
			return h.byte(0xff).sum()
		}
		h = h.field(v)
	}
	return h.sum()
}

func defaultBody(errName, rule, reason string, retry int64) string {
	b := make([]byte, 0, 96)
	b = append(b, `{"error":"`...)
	b = append(b, errName...)
	b = append(b, `","rule":"`...)
	b = append(b, rule...) // rule names are [A-Za-z0-9_.-]: nothing to escape
	b = append(b, `","reason":"`...)
	b = append(b, reason...)
	b = append(b, '"')
	if retry > 0 {
		b = append(b, `,"retry_after":`...)
		b = strconv.AppendInt(b, retry, 10)
	}
	return string(append(b, '}'))
}

// aliasString lends b to a host call as a string without copying. The
// string is valid only during the call: Stream.AddResponseHeader's contract
// (a host that keeps a value copies it).
func aliasString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

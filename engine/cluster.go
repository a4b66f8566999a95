package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/wire"
)

// clusterKey names a bucket in the limit service: the rule name and a
// 128-bit hash of its length-prefixed key values (two independent 64-bit
// hashes, computed by identity), so key length is bounded (a 1 MB header
// becomes 32 hex digits) and no client value reaches Redis as it is.
func clusterKey(rule string, lo, hi uint64) string {
	b := make([]byte, 0, len(rule)+33)
	b = append(append(b, rule...), ':')
	b = appendHex(b, lo)
	b = appendHex(b, mix(hi^0x9e3779b97f4a7c15))
	return string(b)
}

// keyMAC starts the keyed hash of a cluster bucket of ru (its service has
// a key_secret): HMAC-SHA256 under the secret of the rule's name and its
// limit-key sources, each length-prefixed; the request's values follow
// (macField), and keyedClusterKey names the bucket. Without the secret, a
// bucket's key cannot be computed from a header value, so a caller of the
// limit service cannot address a tenant's bucket it has not seen.
func keyMAC(ru *rule) hash.Hash {
	mac := hmac.New(sha256.New, []byte(ru.Service.KeySecret))
	macField(mac, ru.Name)
	for _, k := range ru.LimitKeys {
		macField(mac, strconv.Itoa(int(k.Kind)))
		macField(mac, k.Name)
	}
	return mac
}

// macField adds one length-prefixed field to mac.
func macField(mac hash.Hash, v string) {
	var n [binary.MaxVarintLen64]byte
	mac.Write(n[:binary.PutUvarint(n[:], uint64(len(v)))])
	mac.Write([]byte(v))
}

// keyedClusterKey names a bucket by the rule name and the first 128 bits of
// its keyed hash, in the shape of clusterKey.
func keyedClusterKey(rule string, mac hash.Hash) string {
	var sum [sha256.Size]byte
	h := mac.Sum(sum[:0])
	b := make([]byte, 0, len(rule)+33)
	b = append(append(b, rule...), ':')
	b = appendHex(b, binary.BigEndian.Uint64(h[0:8]))
	b = appendHex(b, binary.BigEndian.Uint64(h[8:16]))
	return string(b)
}

func appendHex(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

// dispatch sends the request's enforced cluster buckets, with its shadow
// cluster buckets riding along, to the limit service in one callout; the
// request waits for the answer (or Envoy's timeout).
func (c *Request) dispatch() (rej *rejection, wait bool) {
	takes := append(append([]take(nil), c.plan.cluster...), c.plan.shadowC...)
	c.shadowsSent = true
	err := call(c.stream, takes, c.plugin.now(), func(a *Answer) { c.onAnswer(takes, a) })
	if err != nil {
		return c.serviceFailed(takes, "dispatching the call: "+err.Error()), false
	}
	return nil, true
}

// dispatchShadow sends the request's shadow cluster buckets on their own,
// without pausing the request. The plugin owns the call (Host.Callout), so the
// answer is counted even when it arrives after the request has ended.
func (c *Request) dispatchShadow() {
	p := c.plugin
	takes := c.plan.shadowC
	c.shadowsSent = true
	err := call(p.host, takes, p.now(), func(a *Answer) { p.onShadowAnswer(takes, a) })
	if err != nil {
		p.serviceFailed(takes, "dispatching the shadow call: "+err.Error())
	}
}

// caller is who owns a call: the plugin (Host) or one request (Stream).
type caller interface {
	Callout(call *Call, answer func(*Answer)) error
}

// call sends one decision over takes to the limit service, owned by by. A
// take whose rule settles with the response (a cost known from it, or
// charge_on) is sent refundable, so the service records its cost for the
// refund that may follow; the others hold nothing to refund. A quota's
// bucket carries the period that holds now (Unix ns).
func call(by caller, takes []take, now int64, answer func(*Answer)) error {
	req := &wire.Request{Buckets: make([]wire.Bucket, len(takes))}
	for i, t := range takes {
		req.Buckets[i] = wire.Bucket{Key: t.key, Rate: t.rule.limit.Rate, Burst: t.rule.limit.Burst,
			Cost: t.cost, Shadow: t.rule.Mode == config.ModeShadow, Refundable: t.rule.charges,
			MaxDelayMs: t.maxWait / 1e6, Period: periodOf(t.rule, now)}
	}
	return post(by, takes[0].rule.Service, "", wire.AppendRequest(make([]byte, 0, 64+112*len(takes)), req), answer)
}

// periodOf is the wire's period of ru's bucket at now (Unix ns): none for
// a token bucket, the calendar period that holds now for a quota (limitAt).
func periodOf(ru *rule, now int64) wire.Period {
	l := ru.limitAt(now)
	if !l.Quota() {
		return wire.Period{}
	}
	return wire.Period{PeriodStartMs: l.PeriodStart / 1e6, PeriodEndMs: l.PeriodEnd / 1e6}
}

// post sends body to the limit service's path (the configured decide path
// when path is ""), with the service's bearer token and timeout_ms.
func post(by caller, s *config.Service, path string, body []byte, answer func(*Answer)) error {
	return postWithin(by, s, path, body, s.TimeoutMS, answer)
}

// postWithin is post with a timeout of its own (lease calls).
func postWithin(by caller, s *config.Service, path string, body []byte, timeoutMS int, answer func(*Answer)) error {
	if path == "" {
		path = s.Path
	}
	hs := [][2]string{
		{":method", "POST"}, {":path", path}, {":authority", s.Authority},
		{"content-type", "application/json"},
	}
	if s.Token != "" {
		hs = append(hs, [2]string{"authorization", "Bearer " + s.Token})
	}
	return by.Callout(&Call{Cluster: s.Cluster, Headers: hs, Body: body, TimeoutMS: uint32(timeoutMS), MaxBody: wire.MaxAnswerBytes}, answer)
}

// onAnswer applies the limit service's answer to the paused request and
// goes on with its decision. The shadow buckets riding in the call are
// counted whatever became of the request; an answer that comes after Envoy
// answered the request itself changes nothing of it.
func (c *Request) onAnswer(takes []take, a *Answer) {
	n := len(c.plan.cluster)
	ds, why := readAnswer(takes, a)
	if why == "" {
		countShadows(c.plugin, takes, ds)
		for i := range c.plan.shadowC {
			c.plan.shadowC[i].held, c.plan.shadowC[i].d = ds[n+i].Allowed, ds[n+i]
		}
	}
	if !c.waiting() {
		if why != "" {
			c.plugin.serviceFailed(takes, why)
		}
		return
	}
	if why != "" {
		c.next(c.serviceFailed(takes, why))
		return
	}
	if rej := rejecting(takes[:n], ds[:n]); rej != nil {
		c.next(rej)
		return
	}
	now := c.plugin.now()
	for i, t := range takes[:n] {
		t.rule.allowed.Increment(1)
		c.plan.cluster[i].held, c.plan.cluster[i].d = true, ds[i]
		c.show(t.rule, ds[i])
		if w := ds[i].Wait; w > 0 {
			c.goesAt = max(c.goesAt, now+int64(w))
		}
	}
	c.next(nil)
}

// onShadowAnswer counts what a shadow-only call's buckets decided.
func (p *Plugin) onShadowAnswer(takes []take, a *Answer) {
	ds, why := readAnswer(takes, a)
	if why != "" {
		p.serviceFailed(takes, why)
		return
	}
	countShadows(p, takes, ds)
	// The request's plan shares takes (dispatchShadow): an answer that
	// comes before the response lets the response charge what the service
	// took. One that comes later is not charged.
	for i := range takes {
		takes[i].held, takes[i].d = ds[i].Allowed, ds[i]
	}
}

// countShadows counts the shadow buckets' decisions of an answer.
func countShadows(p *Plugin, takes []take, ds []bucket.Decision) {
	for i, t := range takes {
		if t.rule.Mode != config.ModeShadow {
			continue
		}
		if ds[i].Allowed {
			t.rule.allowed.Increment(1)
			if ds[i].Wait > 0 {
				t.rule.shadowDelayed.Increment(1)
			}
			continue
		}
		p.shadowRejected(t.rule)
	}
}

// readAnswer reads the limit service's answer to a call over takes: one
// decision per take, or why the answer is unusable (wire.DecodeAnswer
// bounds and checks it: it is untrusted input).
func readAnswer(takes []take, ans *Answer) ([]bucket.Decision, string) {
	raw, why := answerBody(ans)
	if why != "" {
		return nil, why
	}
	req := &wire.Request{Buckets: make([]wire.Bucket, len(takes))}
	for i, t := range takes {
		req.Buckets[i].Shadow = t.rule.Mode == config.ModeShadow
		req.Buckets[i].MaxDelayMs = t.maxWait / 1e6
	}
	a, err := wire.DecodeAnswer(raw, req)
	if err != nil {
		return nil, "malformed response body: " + err.Error()
	}
	ds := make([]bucket.Decision, len(takes))
	for i, b := range a.Buckets {
		ds[i] = bucket.Decision{Allowed: b.Allowed, Remaining: b.Remaining,
			RetryAfter: millis(b.RetryAfterMs), ResetAfter: millis(b.ResetMs), Wait: millis(b.WaitMs)}
	}
	return ds, ""
}

// answerBody is the body of a 200 answer from the limit service, or why
// there is none to read.
func answerBody(a *Answer) ([]byte, string) {
	switch {
	case a.Failed:
		return nil, "no answer (the call was reset, or Envoy would not send it)"
	case a.Status != "200":
		return nil, "status " + a.Status + excerpt(a)
	case a.TooLarge:
		return nil, "malformed response body: larger than " + strconv.Itoa(wire.MaxAnswerBytes) + " bytes"
	case a.Err != nil:
		return nil, "reading the response body: " + a.Err.Error()
	}
	return a.Body, ""
}

// maxExcerpt bounds how much of a failed answer's body a log line quotes.
const maxExcerpt = 200

// excerpt is the start of a non-200 answer's body, which names the cause
// (Envoy's own answer when it reached no service: "upstream connect error
// ... remote connection failure" with a 503, "upstream request timeout" with
// a 504; limitd's {"error": ...}), for the log line: at most maxExcerpt bytes,
// valid UTF-8, control characters as spaces. Empty when there is no body.
func excerpt(a *Answer) string {
	b := a.Body
	if a.TooLarge || a.Err != nil || len(b) == 0 {
		return ""
	}
	cut := len(b) > maxExcerpt
	if cut {
		b = b[:maxExcerpt]
	}
	s := strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(string(b), "")))
	if cut {
		s += "…"
	}
	return ": " + s
}

// serviceFailed counts and logs a failed call and applies failure_mode to
// the request's cluster rules: "allow" lets them through unchecked, each
// counting a fail-open. Shadow buckets never reject: they count nothing
// more.
func (c *Request) serviceFailed(takes []take, why string) *rejection {
	c.plugin.serviceFailed(takes, why)
	first := takes[0].rule
	if first.Mode == config.ModeShadow {
		return nil
	}
	return failureMode(first, func() {
		for _, t := range c.plan.cluster {
			t.rule.failedOpen.Increment(1)
		}
	})
}

// failureMode applies ru's failure_mode when the limit service cannot
// decide a request: "deny" returns the rejection (end gives back what the
// request took); "allow" runs allow, which lets through what the service
// would have decided, and returns nil.
func failureMode(ru *rule, allow func()) *rejection {
	if ru.Service.FailureMode == config.FailDeny {
		return &rejection{rule: ru, reason: reasonServiceDown}
	}
	allow()
	return nil
}

// serviceFailed counts and logs (rate-limited) a failed limit-service call.
func (p *Plugin) serviceFailed(takes []take, why string) {
	p.metrics.serviceErrors.Increment(1)
	s := takes[0].rule.Service
	p.warn(&p.serviceLog, "limit service "+s.Cluster+": "+why+" (failure_mode "+s.FailureMode.String()+")")
}

// millis turns the wire's milliseconds (clamped by package wire) into a
// wait.
func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

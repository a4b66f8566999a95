package plugin

import (
	"math"
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/store"
)

// Reasons named in the X-RateLimit-Reason header and the JSON body.
const (
	reasonExceeded    = "token_bucket_exceeded"
	reasonCostTooHigh = "cost_exceeds_burst"
	reasonMissingKey  = "missing_limit_key"
)

// httpContext decides one request.
type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext

	// What the response headers report: the enforced rule closest to its
	// limit, or none.
	shown      *rule
	shownLeft  float64
	decision   bucket.Decision
	localReply bool
}

// hostHeaders reads request values from the host.
type hostHeaders struct{}

func (hostHeaders) header(name string) (string, bool) {
	v, err := proxywasm.GetHttpRequestHeader(name)
	return v, err == nil
}

func (hostHeaders) property(path ...string) ([]byte, bool) {
	v, err := proxywasm.GetProperty(path)
	return v, err == nil
}

// OnHttpRequestHeaders implements types.HttpContext.
func (c *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	p := c.plugin
	r := request{h: hostHeaders{}, cfg: p.cfg}
	now := p.now()
	p.reqs, p.applied = p.reqs[:0], p.applied[:0]
	var groups []string
	var call *clusterCall
	for _, ru := range p.rules {
		if ru.Group != "" && contains(groups, ru.Group) {
			continue
		}
		if !r.matches(ru.Match) {
			continue
		}
		if ru.Group != "" {
			groups = append(groups, ru.Group)
		}
		if ru.Action == config.ActionAllow {
			break // exempt from every later rule
		}
		id, key, ok := identity(ru, &r)
		if !ok {
			switch ru.MissingKey {
			case config.MissingSkip:
				continue
			case config.MissingDeny:
				if ru.Mode == config.ModeShadow {
					c.shadowReject(ru, now)
					continue
				}
				ru.rejected.Increment(1)
				return c.reject(ru, 400, reasonMissingKey, bucket.Decision{}, 0)
			}
		}
		cost := requestCost(ru, &r)
		if cost > ru.limit.Burst {
			if ru.Mode == config.ModeShadow {
				c.shadowReject(ru, now)
				continue
			}
			ru.rejected.Increment(1)
			return c.reject(ru, ru.Status, reasonCostTooHigh, bucket.Decision{}, 0)
		}
		req := store.Request{ID: id, Limit: ru.limit, Cost: cost}
		switch {
		case ru.Mode == config.ModeShadow:
			c.shadow(ru, req, now)
		case ru.Scope == config.ScopeCluster:
			if call == nil {
				call = &clusterCall{now: now, service: ru.Service}
			}
			call.rules = append(call.rules, ru)
			call.keys = append(call.keys, key)
			call.costs = append(call.costs, cost)
		default:
			p.reqs = append(p.reqs, req)
			p.applied = append(p.applied, ru)
		}
	}
	if len(p.reqs) > 0 {
		if action := c.enforce(now); action != types.ActionContinue || c.localReply {
			return action
		}
	}
	if call == nil {
		return types.ActionContinue
	}
	call.local = append([]store.Request(nil), p.reqs...) // p.reqs is reused by the next request
	return c.dispatch(call)
}

// enforce decides the enforced local rules as one atomic stack.
func (c *httpContext) enforce(now int64) types.Action {
	p := c.plugin
	if cap(p.out) < len(p.reqs) {
		p.out = make([]bucket.Decision, len(p.reqs))
	}
	out := p.out[:len(p.reqs)]
	ok, o, err := p.table.Decide(now, p.reqs, out)
	p.count(o)
	if err != nil {
		for _, ru := range p.applied {
			ru.failedOpen.Increment(1)
		}
		if now-p.lastFailLog >= 1e9 { // at most once a second: an outage must not flood the log
			p.lastFailLog = now
			proxywasm.LogWarnf("%s: failing open (counted in rule.<name>.failed_open): %v", Name, err)
		}
		return types.ActionContinue
	}
	if !ok {
		for i, ru := range p.applied {
			if !out[i].Allowed {
				ru.rejected.Increment(1)
				return c.reject(ru, ru.Status, reasonExceeded, out[i], p.reqs[i].ID)
			}
		}
	}
	for i, ru := range p.applied {
		ru.allowed.Increment(1)
		c.show(ru, out[i])
	}
	return types.ActionContinue
}

// show makes ru's decision the one the response headers report if ru is the
// closest to its limit so far (the smallest fraction of its burst left).
func (c *httpContext) show(ru *rule, d bucket.Decision) {
	f := float64(d.Remaining) / ru.limit.Burst
	if c.shown == nil || f < c.shownLeft {
		c.shown, c.decision, c.shownLeft = ru, d, f
	}
}

// shadow runs a shadow rule's bucket on its own: it consumes like an
// enforced rule would, counts what it would reject, and never rejects.
func (c *httpContext) shadow(ru *rule, req store.Request, now int64) {
	p := c.plugin
	var out [1]bucket.Decision
	ok, o, err := p.table.Decide(now, []store.Request{req}, out[:])
	p.count(o)
	switch {
	case err != nil:
		ru.failedOpen.Increment(1)
	case ok:
		ru.allowed.Increment(1)
	default:
		c.shadowReject(ru, now)
	}
}

// shadowReject counts a shadow rule's would-be rejection and logs it at most
// once a second per rule.
func (c *httpContext) shadowReject(ru *rule, now int64) {
	ru.shadowRej.Increment(1)
	if now-ru.lastLog >= 1e9 {
		ru.lastLog = now
		proxywasm.LogInfof("%s: shadow rule %q would have rejected a request", Name, ru.Name)
	}
}

func (p *pluginContext) count(o store.Outcome) {
	if o.Evictions > 0 {
		p.metrics.evictions.Increment(uint64(o.Evictions))
	}
	if o.Retries > 0 {
		p.metrics.retries.Increment(uint64(o.Retries))
	}
	if o.Refunds > 0 {
		p.metrics.refunds.Increment(uint64(o.Refunds))
	}
}

// identity is the bucket of ru for this request: the hash of the rule and
// its key values, and for an enforced cluster rule also the bucket's name in
// the limit service (see clusterKey), both from one read of each value. ok
// is false when a key has no value; a rule with missing_key "shared" then
// gets one bucket for all such requests.
func identity(ru *rule, r *request) (id uint64, key string, ok bool) {
	cluster := ru.Scope == config.ScopeCluster && ru.Mode == config.ModeEnforce
	lo, hi := ru.identity, ru.identity.byte(0x5c)
	ok = true
	for _, k := range ru.LimitKeys {
		v, has := r.value(k)
		if !has {
			if ru.MissingKey != config.MissingShared {
				return 0, "", false
			}
			lo, hi, ok = ru.identity.byte(0xff), ru.identity.byte(0x5c).byte(0xff), false
			break
		}
		lo = lo.field(v)
		if cluster {
			hi = hi.field(v)
		}
	}
	if cluster {
		key = clusterKey(ru.Name, lo.sum(), hi.sum())
	}
	return lo.sum(), key, ok
}

// requestCost is the tokens a request takes: the fixed cost, or the header
// or query value, falling back to default_cost when that is absent, empty,
// not a number, NaN, infinite, zero or negative.
func requestCost(ru *rule, r *request) float64 {
	if ru.Cost.Source.Kind == config.SourceFixed {
		return ru.Cost.Fixed
	}
	v, ok := r.value(ru.Cost.Source)
	if !ok {
		return ru.Cost.Default
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		return ru.Cost.Default
	}
	return f
}

// OnHttpResponseHeaders implements types.HttpContext. It adds the RateLimit
// headers to allowed responses; a local reply of ours already has them.
func (c *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	if c.localReply || c.shown == nil {
		return types.ActionContinue
	}
	c.rateLimitHeaders(c.shown, c.decision, func(name, value string) {
		if err := proxywasm.AddHttpResponseHeader(name, value); err != nil {
			proxywasm.LogWarnf("%s: adding response header %s: %v", Name, name, err)
		}
	})
	return types.ActionContinue
}

// reject sends the local reply for a rejection by ru.
func (c *httpContext) reject(ru *rule, status int, reason string, d bucket.Decision, id uint64) types.Action {
	c.localReply = true
	hs := make([][2]string, 0, 8+len(ru.ResponseHeaders))
	retry := int64(0)
	if reason == reasonExceeded { // the others never succeed by waiting
		retry = jitter(d.RetryAfter, id)
		hs = append(hs, [2]string{"retry-after", strconv.FormatInt(retry, 10)})
		c.rateLimitHeaders(ru, d, func(name, value string) {
			hs = append(hs, [2]string{name, strings.Clone(value)}) // value aliases a scratch buffer
		})
	}
	hs = append(hs, [2]string{"x-ratelimit-reason", reason})
	for _, h := range ru.ResponseHeaders {
		hs = append(hs, [2]string{h.Name, h.Value})
	}
	body := ru.Body
	if body == "" {
		hs = append(hs, [2]string{"content-type", "application/json"})
		body = defaultBody(ru.Name, reason, retry)
	}
	if err := proxywasm.SendHttpResponse(uint32(status), hs, []byte(body), -1); err != nil {
		proxywasm.LogErrorf("%s: sending the %d reply: %v", Name, status, err)
		return types.ActionContinue
	}
	return types.ActionPause
}

// rateLimitHeaders passes add the headers the configuration's style asks
// for. On a rejection, t is the wait before a retry can succeed; otherwise the
// time until the bucket is full again. The values it formats alias the
// plugin's scratch buffer and are valid only during the call to add (see
// hostString), so the allowed path allocates nothing here.
func (c *httpContext) rateLimitHeaders(ru *rule, d bucket.Decision, add func(name, value string)) {
	style := c.plugin.cfg.Headers
	if style == config.HeadersNone {
		return
	}
	t := d.ResetAfter
	if !d.Allowed {
		t = d.RetryAfter
	}
	remaining := max(d.Remaining, 0)
	b := &c.plugin.scratch
	if style == config.HeadersBoth || style == config.HeadersDraft {
		add("ratelimit-policy", ru.policy)
		*b = append((*b)[:0], ru.quotedName...)
		*b = append(*b, ";r="...)
		*b = strconv.AppendInt(*b, remaining, 10)
		*b = append(*b, ";t="...)
		*b = strconv.AppendInt(*b, t, 10)
		add("ratelimit", hostString(*b))
	}
	if style == config.HeadersBoth || style == config.HeadersLegacy {
		add("ratelimit-limit", ru.burst)
		*b = strconv.AppendInt((*b)[:0], remaining, 10)
		add("ratelimit-remaining", hostString(*b))
		*b = strconv.AppendInt((*b)[:0], t, 10)
		add("ratelimit-reset", hostString(*b))
	}
}

// jitter spreads Retry-After per client: the base wait plus up to 50% more,
// the same for the same rule and key, never below the base, so that clients
// rejected together do not all come back at the same second.
func jitter(base int64, id uint64) int64 {
	if base < 1 {
		base = 1
	}
	f := float64(mix(id^0x5851f42d4c957f2d)>>11) / (1 << 53) // [0, 1)
	return base + int64(math.Floor(float64(base)*0.5*f))
}

func defaultBody(rule, reason string, retry int64) string {
	b := make([]byte, 0, 96)
	b = append(b, `{"error":"rate_limited","rule":"`...)
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

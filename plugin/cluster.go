package plugin

import (
	"math"
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"

	"github.com/ratelimit-wasm/tokenbucket/bucket"
	"github.com/ratelimit-wasm/tokenbucket/config"
	"github.com/ratelimit-wasm/tokenbucket/store"
)

// reasonServiceDown names a rejection by failure_mode "deny".
const reasonServiceDown = "limit_service_unavailable"

// clusterCall is the cluster-scope part of one request: its rules and
// buckets, sent to the limit service in one callout.
type clusterCall struct {
	rules []*rule
	keys  []string
	costs []float64
	// The local stack already consumed; refunded if the service rejects.
	local   []store.Request
	now     int64
	service *config.Service
}

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

func appendHex(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>uint(shift)&0xf])
	}
	return b
}

// dispatch sends the cluster buckets of this request to the limit service
// and pauses the request until the answer (or Envoy's timeout) arrives.
func (c *httpContext) dispatch(call *clusterCall) types.Action {
	s := call.service
	body := make([]byte, 0, 64+96*len(call.keys))
	body = append(body, '{')
	if tag := c.plugin.hashTag; tag != "" {
		body = append(body, `"hash_tag":"`...)
		body = append(body, tag...) // a constant: nothing to escape
		body = append(body, `",`...)
	}
	body = append(body, `"buckets":[`...)
	for i, ru := range call.rules {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"key":`...)
		body = strconv.AppendQuote(body, call.keys[i]) // rule names and hex need no JSON escaping
		body = append(body, `,"tokens_per_second":`...)
		body = strconv.AppendFloat(body, ru.limit.Rate, 'g', -1, 64)
		body = append(body, `,"burst":`...)
		body = strconv.AppendFloat(body, ru.limit.Burst, 'g', -1, 64)
		body = append(body, `,"cost":`...)
		body = strconv.AppendFloat(body, call.costs[i], 'g', -1, 64)
		body = append(body, '}')
	}
	body = append(body, "]}"...)
	hs := [][2]string{
		{":method", "POST"}, {":path", s.Path}, {":authority", s.Authority},
		{"content-type", "application/json"},
	}
	if s.Token != "" {
		hs = append(hs, [2]string{"authorization", "Bearer " + s.Token})
	}
	_, err := proxywasm.DispatchHttpCall(s.Cluster, hs, body, nil, uint32(s.TimeoutMS),
		func(numHeaders, bodySize, _ int) { c.onServiceAnswer(call, numHeaders, bodySize) })
	if err != nil {
		return c.serviceFailed(call, "dispatching the call: "+err.Error(), false)
	}
	return types.ActionPause
}

// onServiceAnswer applies the limit service's decision to the paused request.
func (c *httpContext) onServiceAnswer(call *clusterCall, numHeaders, bodySize int) {
	if numHeaders == 0 { // Envoy's sign of a failed call: reset, timeout, no cluster
		c.serviceFailed(call, "no response (timeout or connection failure)", true)
		return
	}
	status := ""
	if hs, err := proxywasm.GetHttpCallResponseHeaders(); err == nil {
		for _, h := range hs {
			if h[0] == ":status" {
				status = h[1]
			}
		}
	}
	if status != "200" {
		c.serviceFailed(call, "status "+status, true)
		return
	}
	raw, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
	if err != nil || !gjson.ValidBytes(raw) {
		c.serviceFailed(call, "malformed response body", true)
		return
	}
	answer := gjson.ParseBytes(raw)
	buckets := answer.Get("buckets").Array()
	allowed := answer.Get("allowed")
	if len(buckets) != len(call.rules) || (allowed.Type != gjson.True && allowed.Type != gjson.False) {
		c.serviceFailed(call, "malformed response body", true)
		return
	}
	decisions := make([]bucket.Decision, len(buckets))
	for i, b := range buckets {
		decisions[i] = bucket.Decision{
			Allowed:    b.Get("allowed").Bool(),
			Remaining:  b.Get("remaining").Int(),
			RetryAfter: seconds(b.Get("retry_after_ms").Float()),
			ResetAfter: seconds(b.Get("reset_ms").Float()),
		}
	}
	if !allowed.Bool() {
		c.refundLocal(call)
		for i, ru := range call.rules {
			if !decisions[i].Allowed {
				if decisions[i].RetryAfter < 1 {
					decisions[i].RetryAfter = 1
				}
				ru.rejected.Increment(1)
				c.reject(ru, ru.Status, reasonExceeded, decisions[i], hashString(call.keys[i]))
				return
			}
		}
	}
	for i, ru := range call.rules {
		ru.allowed.Increment(1)
		c.show(ru, decisions[i])
	}
	proxywasm.ResumeHttpRequest()
}

// serviceFailed applies failure_mode after a failed call; resume says
// whether the request is paused (a callback) or still in its headers
// callback.
func (c *httpContext) serviceFailed(call *clusterCall, why string, resume bool) types.Action {
	p := c.plugin
	p.metrics.serviceErrors.Increment(1)
	deny := call.service.FailureMode == config.FailDeny
	proxywasm.LogWarnf("%s: limit service %s: %s (failure_mode deny: %v)", Name, call.service.Cluster, why, deny)
	if deny {
		c.refundLocal(call)
		ru := call.rules[0]
		ru.rejected.Increment(1)
		return c.reject(ru, ru.Status, reasonServiceDown, bucket.Decision{}, 0)
	}
	for _, ru := range call.rules {
		ru.failedOpen.Increment(1)
	}
	if resume {
		proxywasm.ResumeHttpRequest()
	}
	return types.ActionContinue
}

// refundLocal gives back what the request's local rules consumed before the
// cluster rules rejected it.
func (c *httpContext) refundLocal(call *clusterCall) {
	if len(call.local) > 0 {
		c.plugin.metrics.refunds.Increment(uint64(c.plugin.table.Refund(call.now, call.local)))
	}
}

// seconds turns milliseconds into whole seconds, rounded up.
func seconds(ms float64) int64 {
	if ms <= 0 || math.IsNaN(ms) {
		return 0
	}
	return int64(math.Ceil(ms / 1000))
}

func hashString(s string) uint64 { return newHasher().field(s).sum() }

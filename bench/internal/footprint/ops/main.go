// Command ops is the attribution module of `make bench-attrib`: the Go floor
// (the SDK) making n of one host operation per request, so that
// (ops with n) − (ops with "none"), divided by n, is what one such operation
// costs Envoy. Its plugin configuration is "<op> <n>", op one of:
//
//	none                 nothing (the Go floor with this module's code)
//	get_shared_data      proxy_get_shared_data of a 32-byte value (the host
//	                     calls back into proxy_on_memory_allocate for it)
//	set_shared_data      proxy_set_shared_data of a 32-byte value
//	increment_metric     proxy_increment_metric of one counter
//	get_header           proxy_get_header_map_value of a present request header
//	add_header           proxy_add_header_map_value on the response
//	time_now             time.Now: two WASI clock_time_get calls
//	host_time            proxy_get_current_time_nanoseconds
//	path                 the host operations of the plugin's allowed request,
//	                     n times each: the x-api-key header, a shared-data
//	                     read and CAS write of a 128-byte value per key, a
//	                     counter, the host clock, and five response headers
//	                     named as the plugin's RateLimit headers
//	reject               every n-th request answered 429 by the module
//	                     (proxy_send_local_response), the others passed on:
//	                     the Go floor of a limiter rejecting 1/n
//
// Built by mk/bench.mk with the plugin's recipe.
package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct {
	types.DefaultPluginContext
	op      string
	n       int
	seen    int // requests so far (reject)
	counter proxywasm.MetricCounter
}

const sharedKey = "bench-ops"

var value = []byte("0123456789abcdef0123456789abcdef")

// group is a value the size of the plugin's shared-data values (four
// bucket records).
var group = make([]byte, 128)

// pathHeaders are the plugin's five RateLimit headers with typical values.
var pathHeaders = [5][2]string{
	{"ratelimit-policy", `"per-key";q=1000000000;w=1`},
	{"ratelimit", `"per-key";r=999999999;t=0`},
	{"ratelimit-limit", "1000000000"},
	{"ratelimit-remaining", "999999999"},
	{"ratelimit-reset", "0"},
}

// OnPluginStart implements types.PluginContext.
func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		proxywasm.LogCritical("ops: no configuration")
		return types.OnPluginStartStatusFailed
	}
	op, n, _ := strings.Cut(strings.TrimSpace(string(cfg)), " ")
	p.op = op
	if p.n, err = strconv.Atoi(strings.TrimSpace(n)); err != nil && op != "none" {
		proxywasm.LogCritical("ops: configuration is \"<op> <n>\", got " + string(cfg))
		return types.OnPluginStartStatusFailed
	}
	switch op {
	case "none", "get_shared_data", "set_shared_data", "get_header", "add_header", "time_now", "host_time":
	case "reject":
		if p.n < 1 {
			proxywasm.LogCritical("ops: reject needs n ≥ 1")
			return types.OnPluginStartStatusFailed
		}
	case "increment_metric", "path":
		p.counter = proxywasm.DefineCounterMetric("bench_ops")
	default:
		proxywasm.LogCritical("ops: unknown op " + op)
		return types.OnPluginStartStatusFailed
	}
	if err := proxywasm.SetSharedData(sharedKey, value, 0); err != nil {
		proxywasm.LogCritical("ops: shared data: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

// NewHttpContext implements types.PluginContext.
func (p *pluginContext) NewHttpContext(uint32) types.HttpContext { return &httpContext{p: p} }

type httpContext struct {
	types.DefaultHttpContext
	p *pluginContext
}

var sink int64

// OnHttpRequestHeaders implements types.HttpContext.
func (c *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	p := c.p
	if p.op == "reject" {
		if p.seen++; p.seen%p.n != 0 {
			return types.ActionContinue
		}
		_ = proxywasm.SendHttpResponse(429, nil, nil, -1)
		return types.ActionPause
	}
	for i := 0; i < p.n; i++ {
		switch p.op {
		case "get_shared_data":
			v, _, _ := proxywasm.GetSharedData(sharedKey)
			sink += int64(len(v))
		case "set_shared_data":
			_ = proxywasm.SetSharedData(sharedKey+"-set", value, 0)
		case "increment_metric":
			p.counter.Increment(1)
		case "get_header":
			v, _ := proxywasm.GetHttpRequestHeader("x-api-key")
			sink += int64(len(v))
		case "time_now":
			sink += time.Now().UnixNano()
		case "host_time":
			sink += hostTime()
		case "path":
			sink += onePath(p.counter)
		}
	}
	return types.ActionContinue
}

// onePath makes the host operations of one allowed request's decision: the
// key header, the key's shared-data value read and written back with its
// CAS (created when missing), a counter and the clock.
func onePath(counter proxywasm.MetricCounter) int64 {
	k, _ := proxywasm.GetHttpRequestHeader("x-api-key")
	key := "bench-path:" + k
	_, cas, err := proxywasm.GetSharedData(key)
	if err != nil {
		cas = 0
	}
	_ = proxywasm.SetSharedData(key, group, cas)
	counter.Increment(1)
	return hostTime() + int64(len(k))
}

// OnHttpResponseHeaders implements types.HttpContext.
func (c *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	switch c.p.op {
	case "add_header":
		for i := 0; i < c.p.n; i++ {
			_ = proxywasm.AddHttpResponseHeader("x-bench-op", "1")
		}
	case "path":
		for i := 0; i < c.p.n; i++ {
			for _, h := range pathHeaders {
				_ = proxywasm.AddHttpResponseHeader(h[0], h[1])
			}
		}
	}
	return types.ActionContinue
}

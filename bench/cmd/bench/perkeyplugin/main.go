// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command perkeyplugin is the comparison plugin of `make bench-memory`: it
// stores one proxy-wasm shared-data key per client, the way most rate-limit
// plugins do, so the benchmark can show what that costs in Envoy's memory.
//
// The model: for every request with an x-api-key header it reads the key
// "perkey:<value>", adds one to the request count it holds and writes it back
// with the CAS it read, retrying a lost race at most maxAttempts times. The
// value is 16 bytes (count and last-seen time, Unix ns), the size of the real
// plugin's bucket state, so the two designs differ only in how many keys they
// create. It never limits: every request continues. Shared data has no delete,
// so each distinct x-api-key stays in Envoy's memory for the life of the
// process; that growth is what the benchmark measures.
//
// Build it like the real plugin (`make build/perkey.wasm`, see mk/memory.mk).
package main

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

const (
	// keyPrefix namespaces the keys in the VM's shared data.
	keyPrefix = "perkey:"
	// valueLen is the stored value: request count (8) and last seen (8).
	valueLen = 16
	// maxAttempts bounds the read-modify-write attempts per request.
	maxAttempts = 8
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (*vmContext) NewPluginContext(uint32) types.PluginContext {
	return &pluginContext{
		updates: proxywasm.DefineCounterMetric("perkey.updates"),
		retries: proxywasm.DefineCounterMetric("perkey.cas_retries"),
		failed:  proxywasm.DefineCounterMetric("perkey.failed"),
	}
}

type pluginContext struct {
	types.DefaultPluginContext
	updates, retries, failed proxywasm.MetricCounter
	key                      []byte // scratch
	val                      [valueLen]byte
}

// NewHttpContext implements types.PluginContext.
func (p *pluginContext) NewHttpContext(uint32) types.HttpContext { return &httpContext{plugin: p} }

type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
}

// OnHttpRequestHeaders implements types.HttpContext.
func (c *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	client, err := proxywasm.GetHttpRequestHeader("x-api-key")
	if err != nil || client == "" {
		return types.ActionContinue
	}
	p := c.plugin
	p.key = append(append(p.key[:0], keyPrefix...), client...)
	key := string(p.key)
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		old, cas, err := proxywasm.GetSharedData(key)
		if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
			break
		}
		var n uint64
		if len(old) == valueLen {
			n = binary.LittleEndian.Uint64(old)
		}
		binary.LittleEndian.PutUint64(p.val[:8], n+1)
		binary.LittleEndian.PutUint64(p.val[8:], uint64(time.Now().UnixNano()))
		err = proxywasm.SetSharedData(key, p.val[:], cas)
		if err == nil {
			p.updates.Increment(1)
			return types.ActionContinue
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			break
		}
		p.retries.Increment(1)
	}
	p.failed.Increment(1)
	return types.ActionContinue
}

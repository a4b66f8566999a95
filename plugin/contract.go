//go:build hostcontract

package plugin

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/ratelimit-wasm/tokenbucket/engine"
)

// App is what the adapter runs in place of the engine in the host-contract
// suite's guest (internal/testing/hostcontract): engine.App and what the
// start's log line reports. This file is built only with the tag
// hostcontract, never into the plugin.
type App = app

// NewContractVMContext is NewVMContext running start's App on the adapter's
// host instead of the engine.
func NewContractVMContext(start func(engine.Host) App) types.VMContext {
	return &vmContext{now: wallClock, sd: sharedData{}, start: func(h *host, _ []byte, _ string, _ engine.Options) (app, error) {
		return start(h), nil
	}}
}

//go:build hostcontract

package filter

import "github.com/ratelimit-wasm/tokenbucket/engine"

// ContractFactory is a ConfigFactory whose workers run start's engine.App
// (internal/testing/hostcontract's driver) on the adapter's host instead
// of the engine: this file is built only with the tag hostcontract, never
// into the module. The filter_config must still be a
// configuration the engine accepts: it is checked, and defines the
// engine's metrics, as always.
func ContractFactory(start func(engine.Host) engine.App) ConfigFactory {
	return ConfigFactory{start: func(h *host, _ *engine.Configuration, _ engine.Options) (engine.App, error) { return start(h), nil }}
}

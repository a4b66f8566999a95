//go:build hostcontract

package filter

import "github.com/ratelimit-wasm/tokenbucket/engine"

// App and Handler are what the adapter runs in place of the engine in the
// host-contract suite's module (internal/testing/hostcontract): this file is
// built only with the tag hostcontract, never into the module.
type (
	App     = app
	Handler = handler
)

// ContractFactory is a ConfigFactory whose workers run start's App on the
// adapter's host instead of the engine. The filter_config must still be a
// configuration the engine accepts: it is checked, and defines the
// engine's metrics, as always.
func ContractFactory(start func(engine.Host) App) ConfigFactory {
	return ConfigFactory{start: func(h *host, _ *engine.Configuration, _ engine.Options) (app, error) { return start(h), nil }}
}

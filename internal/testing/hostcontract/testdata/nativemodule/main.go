// Command nativemodule is the native module's adapter (package
// native/filter) running the host contract's Driver instead of the engine:
// built as a c-shared library with the tag hostcontract by the suite's test
// (envoy_test.go); it lives under testdata so that `go build ./...` ignores
// it.
package main

import (
	"runtime"

	sdk "github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go"
	_ "github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/abi"
	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/hostcontract"
	"github.com/ratelimit-wasm/tokenbucket/native/filter"
)

func main() {}

func init() {
	sdk.RegisterHttpFilterConfigFactories(map[string]shared.HttpFilterConfigFactory{
		filter.Name: filter.ContractFactory(func(h engine.Host) engine.App { return app{hostcontract.New(h)} }),
	})
}

// app is the Driver as the adapter's app.
type app struct{ d *hostcontract.Driver }

func (a app) NewRequest(s engine.Stream) engine.Handler { return a.d.NewRequest(s) }
func (app) Tick(*runtime.MemStats)                      {}

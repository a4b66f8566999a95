// Command wasmguest is the Wasm plugin's adapter (package plugin) running
// the host contract's Driver instead of the engine: built for wasip1 with
// the tag hostcontract by the suite's test (envoy_test.go); it lives under
// testdata so that `go build ./...` ignores it.
package main

import (
	"runtime"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/ratelimit-wasm/tokenbucket/engine"
	"github.com/ratelimit-wasm/tokenbucket/internal/testing/hostcontract"
	"github.com/ratelimit-wasm/tokenbucket/plugin"
)

func main() {}

func init() {
	proxywasm.SetVMContext(plugin.NewContractVMContext(func(h engine.Host) plugin.App { return app{hostcontract.New(h)} }))
}

// app is the Driver as the adapter's app.
type app struct{ d *hostcontract.Driver }

func (a app) NewRequest(s engine.Stream) engine.Handler { return a.d.NewRequest(s) }
func (app) Tick(*runtime.MemStats)                      {}
func (app) Rules() int                                  { return 0 }
func (app) MaxKeys() int                                { return 0 }

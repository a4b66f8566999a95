// Command plugin is the proxy-wasm entry point: build it for wasip1 with
// `make build` (see the Makefile) to get build/plugin.wasm.
package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/ratelimit-wasm/tokenbucket/plugin"
)

func main() {}

func init() { proxywasm.SetVMContext(plugin.NewVMContext()) }

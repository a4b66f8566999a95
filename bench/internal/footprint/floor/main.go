// Command floor is the "Go floor" module of bench/footprint.md: the
// proxy-wasm SDK with an HTTP context whose callbacks do nothing. What the
// plugin costs beyond it is ours. Built by
// `make footprint` (mk/start.mk) with the plugin's recipe.
package main

import (
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct{ types.DefaultPluginContext }

// NewHttpContext implements types.PluginContext.
func (*pluginContext) NewHttpContext(uint32) types.HttpContext { return &types.DefaultHttpContext{} }

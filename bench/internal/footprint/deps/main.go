// Command deps is the "feature floor" module of bench/footprint.md:
// the Go floor (../floor) plus the two libraries the plugin's features need,
// regexp (the `regex` match condition) and gjson (configuration, JWT claims,
// the limit service's answers), each used once at start so the linker keeps
// what the plugin keeps of them. No rate limiter built on them can be smaller
// or compile faster than this. Built by `make footprint` (mk/start.mk) with
// the plugin's recipe.
package main

import (
	"regexp"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tidwall/gjson"
)

func main() {}

func init() { proxywasm.SetVMContext(&vmContext{}) }

type vmContext struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct{ types.DefaultPluginContext }

// OnPluginStart implements types.PluginContext: the first rule's name,
// read with gjson, compiled as a regular expression.
func (*pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	cfg, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		return types.OnPluginStartStatusOK
	}
	name := gjson.GetBytes(cfg, "rules.0.name")
	if _, err := regexp.Compile(name.String()); err != nil {
		proxywasm.LogCritical("deps: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

// NewHttpContext implements types.PluginContext.
func (*pluginContext) NewHttpContext(uint32) types.HttpContext { return &types.DefaultHttpContext{} }

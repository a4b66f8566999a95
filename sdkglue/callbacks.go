// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

//go:build wasip1 && sdkglue

// Exports of the proxy-wasm ABI 0.2.0 for the standard Go compiler: each one
// converts the ABI's 32-bit arguments and calls the SDK's own (unexported)
// callback. See hostcalls.go for how this file reaches the SDK.
//
// Only the callbacks this plugin implements are exported. The host skips a
// callback the module does not export (proxy-wasm-cpp-host treats a missing
// proxy_on_done as "done", a missing body or trailers callback as
// "continue", a missing proxy_on_log as nothing to do), and every call into a
// Go module costs several microseconds of runtime entry and exit, so each
// export left out saves that on every request: proxy_on_log and proxy_on_done
// always. The plugin implements neither OnPluginDone nor any request body,
// request trailer, L4 or queue callback; export one here when it starts to.
// It implements the response body and trailers callbacks (costs read from
// the body). OnHttpStreamDone is called
// from proxy_on_delete (see exportOnDelete).

package internal

import "unsafe"

// pinned keeps buffers handed to the host alive until the host call that
// asked for them returns (see unpinned in hostcalls.go).
var pinned [][]byte

func unpinAll() {
	for i := range pinned {
		pinned[i] = nil
	}
	pinned = pinned[:0]
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

//go:wasmexport proxy_abi_version_0_2_0
func exportABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func exportOnMemoryAllocate(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	buf := make([]byte, size)
	pinned = append(pinned, buf)
	return uint32(uintptr(unsafe.Pointer(&buf[0])))
}

//go:wasmexport proxy_on_vm_start
func exportOnVMStart(rootContextID, vmConfigurationSize uint32) uint32 {
	return b2u(bool(proxyOnVMStart(rootContextID, int(vmConfigurationSize))))
}

//go:wasmexport proxy_on_configure
func exportOnConfigure(pluginContextID, pluginConfigurationSize uint32) uint32 {
	return b2u(bool(proxyOnConfigure(pluginContextID, int(pluginConfigurationSize))))
}

//go:wasmexport proxy_on_context_create
func exportOnContextCreate(contextID, parentContextID uint32) {
	proxyOnContextCreate(contextID, parentContextID)
}

//go:wasmexport proxy_on_request_headers
func exportOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return uint32(proxyOnRequestHeaders(contextID, int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func exportOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	return uint32(proxyOnResponseHeaders(contextID, int(numHeaders), endOfStream != 0))
}

// exportOnResponseBody is exported since costs can come from the response
// body (cost_source response_json). A response without such a cost returns
// at once (plugin.httpContext.OnHttpResponseBody); what the call itself
// costs per response is measured in docs/RATIONALE.md.
//
//go:wasmexport proxy_on_response_body
func exportOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(proxyOnResponseBody(contextID, int(bodySize), endOfStream != 0))
}

// exportOnResponseTrailers is exported for the same costs: trailers end a
// body whose last chunk did not (plugin.httpContext.OnHttpResponseTrailers);
// without it such a body would look cut short.
//
//go:wasmexport proxy_on_response_trailers
func exportOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(proxyOnResponseTrailers(contextID, int(numTrailers)))
}

//go:wasmexport proxy_on_http_call_response
func exportOnHttpCallResponse(pluginContextID, calloutID, numHeaders, bodySize, numTrailers uint32) {
	proxyOnHttpCallResponse(pluginContextID, calloutID, int(numHeaders), int(bodySize), int(numTrailers))
}

//go:wasmexport proxy_on_tick
func exportOnTick(pluginContextID uint32) {
	proxyOnTick(pluginContextID)
}

// exportOnDelete tells an HTTP context that its stream is done
// (OnHttpStreamDone) before the SDK forgets it, as the SDK's proxyOnLog would:
// proxy_on_log is not exported, and the plugin reuses a done context's memory.
//
//go:wasmexport proxy_on_delete
func exportOnDelete(contextID uint32) {
	if streamDoneOnDelete {
		if ctx, ok := currentState.httpContexts[contextID]; ok {
			currentState.setActiveContextID(contextID)
			ctx.OnHttpStreamDone()
		}
	}
	proxyOnDelete(contextID)
}

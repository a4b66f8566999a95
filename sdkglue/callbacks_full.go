// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

//go:build wasip1 && sdkglue && sdkglue_full

// The callbacks the plugin does not export (see callbacks.go), for modules
// that implement them: internal/testing/wasmhost's test guest builds with the tag
// sdkglue_full to exercise the whole ABI.

package internal

import "github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

// streamDoneOnDelete is false: proxy_on_log (exported below) tells an HTTP
// context its stream is done.
const streamDoneOnDelete = false

//go:wasmexport proxy_on_new_connection
func exportOnNewConnection(contextID uint32) uint32 {
	return uint32(proxyOnNewConnection(contextID))
}

//go:wasmexport proxy_on_downstream_data
func exportOnDownstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(proxyOnDownstreamData(contextID, int(dataSize), endOfStream != 0))
}

//go:wasmexport proxy_on_downstream_connection_close
func exportOnDownstreamConnectionClose(contextID, peerType uint32) {
	proxyOnDownstreamConnectionClose(contextID, types.PeerType(peerType))
}

//go:wasmexport proxy_on_upstream_data
func exportOnUpstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	return uint32(proxyOnUpstreamData(contextID, int(dataSize), endOfStream != 0))
}

//go:wasmexport proxy_on_upstream_connection_close
func exportOnUpstreamConnectionClose(contextID, peerType uint32) {
	proxyOnUpstreamConnectionClose(contextID, types.PeerType(peerType))
}

//go:wasmexport proxy_on_request_body
func exportOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	return uint32(proxyOnRequestBody(contextID, int(bodySize), endOfStream != 0))
}

//go:wasmexport proxy_on_request_trailers
func exportOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	return uint32(proxyOnRequestTrailers(contextID, int(numTrailers)))
}

//go:wasmexport proxy_on_queue_ready
func exportOnQueueReady(contextID, queueID uint32) {
	proxyOnQueueReady(contextID, queueID)
}

//go:wasmexport proxy_on_log
func exportOnLog(contextID uint32) {
	proxyOnLog(contextID)
}

//go:wasmexport proxy_on_done
func exportOnDone(contextID uint32) uint32 {
	return b2u(proxyOnDone(contextID))
}

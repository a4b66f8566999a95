// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

//go:build wasip1 && sdkglue

// This file is not part of this module's build. `make build` copies the
// proxy-wasm Go SDK v0.24.0 into build/sdk, drops this file into its package
// proxywasm/internal and builds the plugin against that copy (see the
// Makefile's sdk target and docs/RATIONALE.md).
//
// The SDK was written for TinyGo: its real host imports use TinyGo's //export
// and compile only under the tinygo build tag. Under the standard compiler the
// SDK routes every host call through the package variable currentHost. This
// file sets currentHost to a ProxyWasmHost whose methods call the real host
// functions, imported with //go:wasmimport.
//
// ABI notes:
//   - Go's int and pointers are 64-bit on wasm, the ABI's are 32-bit: sizes are
//     converted, pointers are passed as unsafe.Pointer.
//   - Output pointer and size slots are 8-byte Go variables the SDK declares
//     zeroed; the host writes the low 32 bits, so they read back correctly.
//   - Buffers the host asks for through proxy_on_memory_allocate are pinned in
//     a package slice until the host call that asked for them returns; by then
//     the SDK holds a typed pointer to them, so the collector sees them.

package internal

import "unsafe"

func init() {
	currentHost = wasmHost{}
}

// wasmHost implements ProxyWasmHost with the host's real functions.
type wasmHost struct{}

var _ ProxyWasmHost = wasmHost{}

type ptr = unsafe.Pointer

func u32(n int) uint32 { return uint32(n) }

//go:wasmimport env proxy_log
func hostLog(level uint32, msg ptr, size uint32) uint32

//go:wasmimport env proxy_set_property
func hostSetProperty(path ptr, pathSize uint32, value ptr, valueSize uint32) uint32

//go:wasmimport env proxy_get_property
func hostGetProperty(path ptr, pathSize uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_send_local_response
func hostSendLocalResponse(status uint32, details ptr, detailsSize uint32, body ptr, bodySize uint32, headers ptr, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_get_shared_data
func hostGetSharedData(key ptr, keySize uint32, retData ptr, retSize ptr, retCas ptr) uint32

//go:wasmimport env proxy_set_shared_data
func hostSetSharedData(key ptr, keySize uint32, value ptr, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func hostRegisterSharedQueue(name ptr, nameSize uint32, retID ptr) uint32

//go:wasmimport env proxy_resolve_shared_queue
func hostResolveSharedQueue(vmID ptr, vmIDSize uint32, name ptr, nameSize uint32, retID ptr) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func hostDequeueSharedQueue(queueID uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_enqueue_shared_queue
func hostEnqueueSharedQueue(queueID uint32, value ptr, valueSize uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func hostGetHeaderMapValue(mapType uint32, key ptr, keySize uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_add_header_map_value
func hostAddHeaderMapValue(mapType uint32, key ptr, keySize uint32, value ptr, valueSize uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func hostReplaceHeaderMapValue(mapType uint32, key ptr, keySize uint32, value ptr, valueSize uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func hostRemoveHeaderMapValue(mapType uint32, key ptr, keySize uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func hostGetHeaderMapPairs(mapType uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_set_header_map_pairs
func hostSetHeaderMapPairs(mapType uint32, data ptr, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bufferType uint32, start uint32, maxSize uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_set_buffer_bytes
func hostSetBufferBytes(bufferType uint32, start uint32, maxSize uint32, data ptr, size uint32) uint32

//go:wasmimport env proxy_continue_stream
func hostContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_close_stream
func hostCloseStream(streamType uint32) uint32

//go:wasmimport env proxy_http_call
func hostHttpCall(upstream ptr, upstreamSize uint32, headers ptr, headersSize uint32, body ptr, bodySize uint32, trailers ptr, trailersSize uint32, timeout uint32, retID ptr) uint32

//go:wasmimport env proxy_call_foreign_function
func hostCallForeignFunction(name ptr, nameSize uint32, param ptr, paramSize uint32, retData ptr, retSize ptr) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func hostSetTickPeriodMilliseconds(period uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hostSetEffectiveContext(contextID uint32) uint32

//go:wasmimport env proxy_done
func hostDone() uint32

//go:wasmimport env proxy_define_metric
func hostDefineMetric(metricType uint32, name ptr, nameSize uint32, retID ptr) uint32

//go:wasmimport env proxy_increment_metric
func hostIncrementMetric(metricID uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func hostRecordMetric(metricID uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func hostGetMetric(metricID uint32, retValue ptr) uint32

// unpinned runs after every host call that may have allocated, and returns its
// status unchanged.
func unpinned(s uint32) Status {
	unpinAll()
	return Status(s)
}

func (wasmHost) ProxyLog(logLevel LogLevel, messageData *byte, messageSize int) Status {
	return Status(hostLog(uint32(logLevel), ptr(messageData), u32(messageSize)))
}

func (wasmHost) ProxySetProperty(pathData *byte, pathSize int, valueData *byte, valueSize int) Status {
	return Status(hostSetProperty(ptr(pathData), u32(pathSize), ptr(valueData), u32(valueSize)))
}

func (wasmHost) ProxyGetProperty(pathData *byte, pathSize int, returnValueData **byte, returnValueSize *int) Status {
	return unpinned(hostGetProperty(ptr(pathData), u32(pathSize), ptr(returnValueData), ptr(returnValueSize)))
}

func (wasmHost) ProxySendLocalResponse(statusCode uint32, statusCodeDetailData *byte, statusCodeDetailsSize int, bodyData *byte, bodySize int, headersData *byte, headersSize int, grpcStatus int32) Status {
	return Status(hostSendLocalResponse(statusCode, ptr(statusCodeDetailData), u32(statusCodeDetailsSize),
		ptr(bodyData), u32(bodySize), ptr(headersData), u32(headersSize), grpcStatus))
}

func (wasmHost) ProxyGetSharedData(keyData *byte, keySize int, returnValueData **byte, returnValueSize *int, returnCas *uint32) Status {
	return unpinned(hostGetSharedData(ptr(keyData), u32(keySize), ptr(returnValueData), ptr(returnValueSize), ptr(returnCas)))
}

func (wasmHost) ProxySetSharedData(keyData *byte, keySize int, valueData *byte, valueSize int, cas uint32) Status {
	return Status(hostSetSharedData(ptr(keyData), u32(keySize), ptr(valueData), u32(valueSize), cas))
}

func (wasmHost) ProxyRegisterSharedQueue(nameData *byte, nameSize int, returnID *uint32) Status {
	return Status(hostRegisterSharedQueue(ptr(nameData), u32(nameSize), ptr(returnID)))
}

func (wasmHost) ProxyResolveSharedQueue(vmIDData *byte, vmIDSize int, nameData *byte, nameSize int, returnID *uint32) Status {
	return Status(hostResolveSharedQueue(ptr(vmIDData), u32(vmIDSize), ptr(nameData), u32(nameSize), ptr(returnID)))
}

func (wasmHost) ProxyDequeueSharedQueue(queueID uint32, returnValueData **byte, returnValueSize *int) Status {
	return unpinned(hostDequeueSharedQueue(queueID, ptr(returnValueData), ptr(returnValueSize)))
}

func (wasmHost) ProxyEnqueueSharedQueue(queueID uint32, valueData *byte, valueSize int) Status {
	return Status(hostEnqueueSharedQueue(queueID, ptr(valueData), u32(valueSize)))
}

func (wasmHost) ProxyGetHeaderMapValue(mapType MapType, keyData *byte, keySize int, returnValueData **byte, returnValueSize *int) Status {
	return unpinned(hostGetHeaderMapValue(uint32(mapType), ptr(keyData), u32(keySize), ptr(returnValueData), ptr(returnValueSize)))
}

func (wasmHost) ProxyAddHeaderMapValue(mapType MapType, keyData *byte, keySize int, valueData *byte, valueSize int) Status {
	return Status(hostAddHeaderMapValue(uint32(mapType), ptr(keyData), u32(keySize), ptr(valueData), u32(valueSize)))
}

func (wasmHost) ProxyReplaceHeaderMapValue(mapType MapType, keyData *byte, keySize int, valueData *byte, valueSize int) Status {
	return Status(hostReplaceHeaderMapValue(uint32(mapType), ptr(keyData), u32(keySize), ptr(valueData), u32(valueSize)))
}

func (wasmHost) ProxyContinueStream(streamType StreamType) Status {
	return Status(hostContinueStream(uint32(streamType)))
}

func (wasmHost) ProxyCloseStream(streamType StreamType) Status {
	return Status(hostCloseStream(uint32(streamType)))
}

func (wasmHost) ProxyRemoveHeaderMapValue(mapType MapType, keyData *byte, keySize int) Status {
	return Status(hostRemoveHeaderMapValue(uint32(mapType), ptr(keyData), u32(keySize)))
}

func (wasmHost) ProxyGetHeaderMapPairs(mapType MapType, returnValueData **byte, returnValueSize *int) Status {
	return unpinned(hostGetHeaderMapPairs(uint32(mapType), ptr(returnValueData), ptr(returnValueSize)))
}

func (wasmHost) ProxySetHeaderMapPairs(mapType MapType, mapData *byte, mapSize int) Status {
	return Status(hostSetHeaderMapPairs(uint32(mapType), ptr(mapData), u32(mapSize)))
}

func (wasmHost) ProxyGetBufferBytes(bufferType BufferType, start int, maxSize int, returnBufferData **byte, returnBufferSize *int) Status {
	return unpinned(hostGetBufferBytes(uint32(bufferType), u32(start), u32(maxSize), ptr(returnBufferData), ptr(returnBufferSize)))
}

func (wasmHost) ProxySetBufferBytes(bufferType BufferType, start int, maxSize int, bufferData *byte, bufferSize int) Status {
	return Status(hostSetBufferBytes(uint32(bufferType), u32(start), u32(maxSize), ptr(bufferData), u32(bufferSize)))
}

func (wasmHost) ProxyHttpCall(upstreamData *byte, upstreamSize int, headerData *byte, headerSize int, bodyData *byte, bodySize int, trailersData *byte, trailersSize int, timeout uint32, calloutIDPtr *uint32) Status {
	return Status(hostHttpCall(ptr(upstreamData), u32(upstreamSize), ptr(headerData), u32(headerSize),
		ptr(bodyData), u32(bodySize), ptr(trailersData), u32(trailersSize), timeout, ptr(calloutIDPtr)))
}

func (wasmHost) ProxyCallForeignFunction(funcNamePtr *byte, funcNameSize int, paramPtr *byte, paramSize int, returnData **byte, returnSize *int) Status {
	return unpinned(hostCallForeignFunction(ptr(funcNamePtr), u32(funcNameSize), ptr(paramPtr), u32(paramSize), ptr(returnData), ptr(returnSize)))
}

func (wasmHost) ProxySetTickPeriodMilliseconds(period uint32) Status {
	return Status(hostSetTickPeriodMilliseconds(period))
}

// ProxySetEffectiveContext makes contextID the context of the host calls
// that follow, and the SDK's active context too: an HTTP call dispatched next
// is then registered to that context, as the host registers it. This is how a
// stream hands a callout to its plugin context, so that the answer is still
// delivered after the stream has ended (the SDK drops answers whose caller
// context is gone; Envoy owns every callout by the root context anyway).
func (wasmHost) ProxySetEffectiveContext(contextID uint32) Status {
	st := Status(hostSetEffectiveContext(contextID))
	if st == StatusOK {
		currentState.setActiveContextID(contextID)
	}
	return st
}

func (wasmHost) ProxyDone() Status { return Status(hostDone()) }

func (wasmHost) ProxyDefineMetric(metricType MetricType, metricNameData *byte, metricNameSize int, returnMetricIDPtr *uint32) Status {
	return Status(hostDefineMetric(uint32(metricType), ptr(metricNameData), u32(metricNameSize), ptr(returnMetricIDPtr)))
}

func (wasmHost) ProxyIncrementMetric(metricID uint32, offset int64) Status {
	return Status(hostIncrementMetric(metricID, offset))
}

func (wasmHost) ProxyRecordMetric(metricID uint32, value uint64) Status {
	return Status(hostRecordMetric(metricID, value))
}

func (wasmHost) ProxyGetMetric(metricID uint32, returnMetricValue *uint64) Status {
	return Status(hostGetMetric(metricID, ptr(returnMetricValue)))
}

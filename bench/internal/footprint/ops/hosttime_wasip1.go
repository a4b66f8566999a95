//go:build wasip1

package main

import "unsafe"

//go:wasmimport env proxy_get_current_time_nanoseconds
func hostCurrentTimeNanoseconds(ret unsafe.Pointer) uint32

var hostTimeResult uint64

// hostTime is proxy_get_current_time_nanoseconds: one host call.
func hostTime() int64 {
	hostCurrentTimeNanoseconds(unsafe.Pointer(&hostTimeResult))
	return int64(hostTimeResult)
}

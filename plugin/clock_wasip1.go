//go:build wasip1

package plugin

import (
	"time"
	"unsafe"
)

//go:wasmimport env proxy_get_current_time_nanoseconds
func hostCurrentTimeNanoseconds(ret unsafe.Pointer) uint32

// wallClock is the host's clock in Unix nanoseconds, read with one host
// call (time.Now on wasip1 is two WASI clock_time_get calls, wall and
// monotonic). Every worker of one Envoy reads the same clock, so their
// buckets agree. A host that does not offer the call gets time.Now.
func wallClock() int64 {
	if hostCurrentTimeNanoseconds(unsafe.Pointer(&clockResult)) != 0 {
		return time.Now().UnixNano()
	}
	return int64(clockResult)
}

// clockResult receives the host's answer: a local would escape to the heap
// (one allocation per read), and a VM runs one callback at a time.
var clockResult uint64

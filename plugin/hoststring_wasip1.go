//go:build wasip1

package plugin

import "unsafe"

// hostString lends b to a host call as a string without copying: hosts copy
// header names and values out of the module's memory during the call.
func hostString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

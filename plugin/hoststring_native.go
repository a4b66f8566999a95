//go:build !wasip1

package plugin

// hostString copies b: natively the SDK's emulator keeps the strings it is
// given, where a real host copies them out of the module's memory.
func hostString(b []byte) string { return string(b) }

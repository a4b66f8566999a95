//go:build wasip1

package plugin

// hostString is a value the engine lends for the length of a host call:
// hosts copy header names and values out of the module's memory during the
// call, so it is passed as it is.
func hostString(s string) string { return s }

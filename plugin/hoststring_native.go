//go:build !wasip1

package plugin

import "strings"

// hostString is a value the engine lends for the length of a host call:
// natively the SDK's emulator keeps the strings it is given, so it gets a
// copy (a real host copies them out of the module's memory: see
// hoststring_wasip1.go).
func hostString(s string) string { return strings.Clone(s) }

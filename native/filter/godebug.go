package filter

import "strings"

// cgocheckOff reports whether a GODEBUG value turns the cgo pointer check
// off (cgocheck=0; the last setting wins, as the runtime reads it).
func cgocheckOff(godebug string) bool {
	off := false
	for _, kv := range strings.Split(godebug, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		if k == "cgocheck" {
			off = v == "0"
		}
	}
	return off
}

// errGodebug is the line Envoy logs when its environment lacks
// GODEBUG=cgocheck=0.
const errGodebug = Name + ": refusing to start: Envoy's environment lacks GODEBUG=cgocheck=0, " +
	"without which Go's cgo pointer check aborts Envoy at the first configuration of a Go module " +
	"(the SDK passes Go pointers to Envoy); start Envoy with GODEBUG=cgocheck=0 in its environment " +
	"(for example `GODEBUG=cgocheck=0 envoy -c envoy.yaml`, or the proxy container's env in Kubernetes); " +
	"it cannot be set from inside the module"

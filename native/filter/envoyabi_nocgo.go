//go:build !cgo

package filter

import (
	"errors"

	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"
)

// newEnvoyMetrics fails without cgo: the module only runs in Envoy, built
// with cgo (native/register.go); this keeps the package building elsewhere.
func newEnvoyMetrics(shared.HttpFilterConfigHandle) (sink, error) {
	return nil, errors.New(Name + ": built without cgo: no Envoy to count metrics in")
}

// workerIndex has no Envoy to ask without cgo.
func workerIndex(shared.HttpFilterHandle) (int, bool) { return 0, false }

// modulePath is unknown without cgo: envoyCallbacks then checks nothing.
func modulePath() string { return "" }

// processHasSymbol has no process to ask without cgo.
func processHasSymbol(string) bool { return true }

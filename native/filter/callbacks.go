package filter

import (
	"debug/elf"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// callbackPrefix starts the name of every function Envoy exports to
// dynamic modules.
const callbackPrefix = "envoy_dynamic_module_callback_"

// missingCallbacks returns, sorted, the Envoy callbacks the module's ELF
// file f imports (undefined dynamic symbols named callbackPrefix...) that
// has reports absent from the process.
//
// The dynamic linker binds them lazily, at their first call: on an Envoy
// that lacks one, the module loads and Envoy exits at the first request
// that reaches the call ("symbol lookup error", exit code 127), as Envoy
// 1.37 and 1.38 did (docs/compatibility.md).
func missingCallbacks(f *elf.File, has func(name string) bool) ([]string, error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return nil, fmt.Errorf("%s: the module's dynamic symbols: %w", Name, err)
	}
	var missing []string
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF && strings.HasPrefix(s.Name, callbackPrefix) && !has(s.Name) {
			missing = append(missing, s.Name)
		}
	}
	slices.Sort(missing)
	return slices.Compact(missing), nil
}

// errMissingCallbacks is the line Envoy logs when it lacks callbacks the
// module calls.
func errMissingCallbacks(missing []string) string {
	return fmt.Sprintf("%s: refusing to start: this Envoy lacks %d function(s) the module calls (%s): "+
		"it would exit at the first request that calls one; the module needs Envoy 1.39 or later",
		Name, len(missing), strings.Join(missing, ", "))
}

var (
	callbacksOnce sync.Once
	callbacksErr  string
)

// envoyCallbacks checks once per process that Envoy exports every callback
// the module imports, and returns the refusal line ("" when it does, or
// when the module's own file cannot be found or read: then nothing is
// known, and loading goes on as before).
func envoyCallbacks() string {
	callbacksOnce.Do(func() {
		path := modulePath()
		if path == "" {
			return
		}
		f, err := elf.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		if missing, err := missingCallbacks(f, processHasSymbol); err == nil && len(missing) > 0 {
			callbacksErr = errMissingCallbacks(missing)
		}
	})
	return callbacksErr
}

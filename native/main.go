// Command native is the rate limiter as an Envoy dynamic module: built with
// `make build-native` (go build -buildmode=c-shared, cgo) into
// build/libtokenbucket.so, loaded by Envoy's
// envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter with
// filter_name "tokenbucket" and the Wasm plugin's JSON configuration. See
// package filter for the model and docs/native.md for loading it.
//
// Without cgo (CGO_ENABLED=0, GOOS=wasip1) it is an empty program, so that
// `go vet ./...` and builds of every package keep working there: the SDK's
// ABI package is cgo only (register.go).
package main

func main() {}

package plugin

// counter and gauge are metrics defined in the host, shown in Envoy's
// /stats as wasmcustom.<name>. Natively they are the SDK's (its emulator
// keeps them, metrics_native.go); on wasip1 they call the host directly
// (metrics_wasip1.go): the SDK's own methods build their panic messages
// with fmt, which alone kept fmt and much of reflect in the Wasm module
// (bench/footprint.md).
type (
	counter uint32
	gauge   uint32
)

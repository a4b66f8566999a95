// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Package nullwasm holds the benchmark's no-op Wasm filters, written in the
// WebAssembly text format and compiled by wabt's wat2wasm (Debian: wabt).
package nullwasm

import (
	"context"
	_ "embed"
	"fmt"
	"maps"

	"github.com/tetratelabs/wazero"
)

//go:generate wat2wasm null.wat -o null.wasm
//go:generate wat2wasm null-calls.wat -o null-calls.wasm
//go:generate wat2wasm null-path.wat -o null-path.wasm

// Module is null.wat compiled: every callback returns at once.
//
//go:embed null.wasm
var Module []byte

// HostCalls is how many host calls ModuleCalls makes per request.
const HostCalls = 10

// ModuleCalls is null-calls.wat compiled: Module whose request-headers
// callback calls the host HostCalls times.
//
//go:embed null-calls.wasm
var ModuleCalls []byte

// ModulePath is null-path.wat compiled: a module with no code of its own
// making the host calls of the plugin's allowed request once each.
//
//go:embed null-path.wasm
var ModulePath []byte

// Exports returns the functions wasm exports, each with its signature, as
// wazero reads them.
func Exports(wasm []byte) (map[string]string, error) {
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	defer rt.Close(ctx)
	m, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		return nil, fmt.Errorf("nullwasm: %w", err)
	}
	out := map[string]string{}
	for name, f := range m.ExportedFunctions() {
		out[name] = fmt.Sprint(f.ParamTypes(), f.ResultTypes())
	}
	return out, nil
}

// CheckLike fails unless Module exports exactly the functions plugin
// exports, with the same signatures: then Envoy calls both as often.
func CheckLike(plugin []byte) error {
	want, err := Exports(plugin)
	if err != nil {
		return err
	}
	for _, m := range [][]byte{Module, ModuleCalls, ModulePath} {
		got, err := Exports(m)
		if err != nil {
			return err
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("nullwasm: the no-op module exports %v, the plugin %v: update null.wat, null-calls.wat and null-path.wat", got, want)
		}
	}
	return nil
}

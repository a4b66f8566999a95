// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
)

// nullFilterWasm returns a minimal proxy-wasm ABI 0.2.0 module whose
// callbacks do nothing: every stream continues, nothing is read or
// written. When like is not nil it exports only the callbacks that like
// exports (the plugin's own set, so that Envoy makes the same calls per
// request into both; Envoy skips a callback a module does not export);
// otherwise every callback. Run as a filter it measures what any Wasm
// filter costs in Envoy and V8 before the guest does anything. It is built
// byte by byte (the Wasm binary format) because this project has no
// toolchain for a non-Go module.
//
// hostCalls > 0 makes proxy_on_request_headers call the host that many times
// (WASI clock_time_get, which the plugin also calls): the difference
// measures what one call from a module into Envoy costs.
func nullFilterWasm(like map[string]bool, hostCalls int) []byte {
	const (
		i32        = 0x7f
		funcType   = 0x60
		secType    = 1
		secFunc    = 3
		secMemory  = 5
		secExport  = 7
		secCode    = 10
		exportFunc = 0
		exportMem  = 2
		opI32Const = 0x41
		opI64Const = 0x42
		opCall     = 0x10
		opDrop     = 0x1a
		opEnd      = 0x0b
		i64        = 0x7e
		secImport  = 2
	)
	types := [][2][]byte{
		{nil, nil},                    // 0: () -> ()
		{{i32}, nil},                  // 1: (i32) -> ()
		{{i32, i32}, nil},             // 2: (i32, i32) -> ()
		{{i32}, {i32}},                // 3: (i32) -> i32
		{{i32, i32}, {i32}},           // 4: (i32, i32) -> i32
		{{i32, i32, i32}, {i32}},      // 5: (i32, i32, i32) -> i32
		{{i32, i32, i32, i32}, {i32}}, // 6: (i32, i32, i32, i32) -> i32
	}
	noResult := int32(-1)
	funcs := []struct {
		name   string
		typ    byte
		result int32 // the constant returned, or noResult
	}{
		{"proxy_abi_version_0_2_0", 0, noResult},
		{"_initialize", 0, noResult},
		{"proxy_on_memory_allocate", 3, 1024}, // scratch memory nobody reads
		{"proxy_on_context_create", 2, noResult},
		{"proxy_on_vm_start", 4, 1},
		{"proxy_on_configure", 4, 1},
		{"proxy_on_request_headers", 5, 0}, // Continue
		{"proxy_on_request_body", 5, 0},
		{"proxy_on_request_trailers", 4, 0},
		{"proxy_on_response_headers", 5, 0},
		{"proxy_on_response_body", 5, 0},
		{"proxy_on_response_trailers", 4, 0},
		{"proxy_on_log", 1, noResult},
		{"proxy_on_done", 3, 1},
		{"proxy_on_delete", 1, noResult},
		{"proxy_on_tick", 1, noResult},
		{"proxy_on_queue_ready", 2, noResult},
		{"proxy_on_http_call_response", 6, noResult},
	}
	// proxy_on_http_call_response is (i32 × 5) -> (); fix its type below.
	types = append(types, [2][]byte{{i32, i32, i32, i32, i32}, nil}) // 7
	funcs[len(funcs)-1].typ = 7
	types = append(types, [2][]byte{{i32, i64, i32}, {i32}}) // 8: clock_time_get
	imported := 0
	if hostCalls > 0 {
		imported = 1
	}
	if like != nil {
		kept := funcs[:0]
		for _, f := range funcs {
			if like[f.name] {
				kept = append(kept, f)
			}
		}
		funcs = kept
	}

	vec := func(items ...[]byte) []byte {
		out := uleb(uint32(len(items)))
		for _, it := range items {
			out = append(out, it...)
		}
		return out
	}
	name := func(s string) []byte { return append(uleb(uint32(len(s))), s...) }
	section := func(id byte, body []byte) []byte {
		return append(append([]byte{id}, uleb(uint32(len(body)))...), body...)
	}

	var typeEntries, funcEntries, exportEntries, codeEntries [][]byte
	for _, t := range types {
		e := []byte{funcType}
		e = append(e, vec(bytesOf(t[0])...)...)
		e = append(e, vec(bytesOf(t[1])...)...)
		typeEntries = append(typeEntries, e)
	}
	for i, f := range funcs {
		funcEntries = append(funcEntries, uleb(uint32(f.typ)))
		exportEntries = append(exportEntries, append(name(f.name), append([]byte{exportFunc}, uleb(uint32(i+imported))...)...))
		body := []byte{0} // no locals
		if f.name == "proxy_on_request_headers" {
			for range hostCalls {
				// clock_time_get(realtime, precision 0, result at 16); drop the errno
				body = append(body, opI32Const, 0, opI64Const, 0, opI32Const, 16, opCall, 0, opDrop)
			}
		}
		if f.result != noResult {
			body = append(body, opI32Const)
			body = append(body, sleb(f.result)...)
		}
		body = append(body, opEnd)
		codeEntries = append(codeEntries, append(uleb(uint32(len(body))), body...))
	}
	exportEntries = append(exportEntries, append(name("memory"), exportMem, 0))

	out := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	out = append(out, section(secType, vec(typeEntries...))...)
	if hostCalls > 0 {
		imp := append(name("wasi_snapshot_preview1"), name("clock_time_get")...)
		imp = append(imp, exportFunc, 8)
		out = append(out, section(secImport, vec(imp))...)
	}
	out = append(out, section(secFunc, vec(funcEntries...))...)
	out = append(out, section(secMemory, vec([]byte{0x00, 0x01}))...) // one page, no maximum
	out = append(out, section(secExport, vec(exportEntries...))...)
	out = append(out, section(secCode, vec(codeEntries...))...)
	return out
}

// bytesOf splits b into one-byte items for vec.
func bytesOf(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = b[i : i+1]
	}
	return out
}

// uleb is the unsigned LEB128 encoding of v.
func uleb(v uint32) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

// sleb is the signed LEB128 encoding of v.
func sleb(v int32) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}

// wasmExports returns the names of the functions a Wasm module exports, read
// from its export section, or an error if the binary is malformed.
func wasmExports(wasm []byte) (map[string]bool, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, fmt.Errorf("bench: not a Wasm module")
	}
	r := wasmReader{b: wasm[8:]}
	for len(r.b) > 0 {
		id := r.byte()
		size := r.uleb()
		if r.err != nil || uint64(len(r.b)) < size {
			return nil, fmt.Errorf("bench: malformed Wasm section")
		}
		body := wasmReader{b: r.b[:size]}
		r.b = r.b[size:]
		if id != 7 {
			continue
		}
		out := map[string]bool{}
		for n := body.uleb(); n > 0 && body.err == nil; n-- {
			name := body.bytes(body.uleb())
			kind := body.byte()
			body.uleb() // index
			if kind == 0 {
				out[string(name)] = true
			}
		}
		if body.err != nil {
			return nil, fmt.Errorf("bench: malformed Wasm export section")
		}
		return out, nil
	}
	return map[string]bool{}, nil
}

// wasmReader reads the Wasm binary format; the first error sticks.
type wasmReader struct {
	b   []byte
	err error
}

func (r *wasmReader) byte() byte {
	if len(r.b) == 0 {
		r.err = io.ErrUnexpectedEOF
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *wasmReader) uleb() uint64 {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		c := r.byte()
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
	r.err = fmt.Errorf("bench: LEB128 too long")
	return 0
}

func (r *wasmReader) bytes(n uint64) []byte {
	if uint64(len(r.b)) < n {
		r.err = io.ErrUnexpectedEOF
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

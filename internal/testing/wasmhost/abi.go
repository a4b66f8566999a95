// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
)

// Status is a proxy-wasm ABI 0.2.0 result code, as the host returns it to the
// guest (the SDK's internal.Status; proxy-wasm-cpp-host's WasmResult).
type Status uint32

// The result codes. The SDK knows all but InvalidMemoryAccess by name.
const (
	StatusOK                  Status = 0
	StatusNotFound            Status = 1
	StatusBadArgument         Status = 2
	StatusInvalidMemoryAccess Status = 6
	StatusEmpty               Status = 7
	StatusCasMismatch         Status = 8
	StatusInternalFailure     Status = 10
	StatusUnimplemented       Status = 12
)

// String returns the ABI name of s.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "Ok"
	case StatusNotFound:
		return "NotFound"
	case StatusBadArgument:
		return "BadArgument"
	case StatusInvalidMemoryAccess:
		return "InvalidMemoryAccess"
	case StatusEmpty:
		return "Empty"
	case StatusCasMismatch:
		return "CasMismatch"
	case StatusInternalFailure:
		return "InternalFailure"
	case StatusUnimplemented:
		return "Unimplemented"
	}
	return "Status(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// LogLevel is the level of a proxy_log call.
type LogLevel uint32

// The log levels of the ABI.
const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// String returns the level's lowercase name.
func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return "level(" + strconv.FormatUint(uint64(l), 10) + ")"
}

// Enumerations of the ABI, numbered as in the SDK's internal/abi_enums.go.
const (
	mapRequestHeaders      = 0
	mapRequestTrailers     = 1
	mapResponseHeaders     = 2
	mapResponseTrailers    = 3
	mapCallResponseHeaders = 6
	mapCallResponseTrail   = 7
	mapMax                 = 7

	bufRequestBody      = 0
	bufResponseBody     = 1
	bufDownstreamData   = 2
	bufUpstreamData     = 3
	bufCallResponseBody = 4
	bufGrpcReceive      = 5
	bufVMConfiguration  = 6
	bufPluginConfig     = 7
	bufCallData         = 8

	streamRequest    = 0
	streamResponse   = 1
	streamDownstream = 2
	streamUpstream   = 3

	metricCounter   = 0
	metricGauge     = 1
	metricHistogram = 2

	actionContinue = 0
)

// Headers is an ordered list of header fields, name first. The host stores
// names lowercased, as Envoy does; values as given.
type Headers [][2]string

// Get returns the first value of the header name (case-insensitive), or "".
func (h Headers) Get(name string) string {
	v, _ := h.Lookup(name)
	return v
}

// Lookup returns the first value of the header name (case-insensitive) and
// whether it is present.
func (h Headers) Lookup(name string) (string, bool) {
	for _, kv := range h {
		if strings.EqualFold(kv[0], name) {
			return kv[1], true
		}
	}
	return "", false
}

// Values returns every value of the header name (case-insensitive), in order.
func (h Headers) Values(name string) []string {
	var vs []string
	for _, kv := range h {
		if strings.EqualFold(kv[0], name) {
			vs = append(vs, kv[1])
		}
	}
	return vs
}

// Clone returns a copy of h with lowercased names; nil stays nil.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	out := make(Headers, len(h))
	for i, kv := range h {
		out[i] = [2]string{strings.ToLower(kv[0]), kv[1]}
	}
	return out
}

func (h *Headers) add(name, value string) {
	*h = append(*h, [2]string{strings.ToLower(name), value})
}

// replace sets the first field named name to value and drops the others, or
// appends the field when there is none.
func (h *Headers) replace(name, value string) {
	name = strings.ToLower(name)
	out := (*h)[:0]
	found := false
	for _, kv := range *h {
		if kv[0] == name {
			if found {
				continue
			}
			found = true
			kv[1] = value
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, [2]string{name, value})
	}
	*h = out
}

func (h *Headers) remove(name string) {
	name = strings.ToLower(name)
	out := (*h)[:0]
	for _, kv := range *h {
		if kv[0] != name {
			out = append(out, kv)
		}
	}
	*h = out
}

// encodePairs serializes h in the ABI's map format: a little-endian uint32
// count, then a (name size, value size) uint32 pair per field, then each name
// and value followed by a NUL byte.
func encodePairs(h Headers) []byte {
	size := 4
	for _, kv := range h {
		size += 8 + len(kv[0]) + len(kv[1]) + 2
	}
	b := make([]byte, 4, size)
	binary.LittleEndian.PutUint32(b, uint32(len(h)))
	for _, kv := range h {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(kv[1])))
	}
	for _, kv := range h {
		b = append(b, kv[0]...)
		b = append(b, 0)
		b = append(b, kv[1]...)
		b = append(b, 0)
	}
	return b
}

var errPairs = errors.New("wasmhost: malformed header pairs")

// decodePairs parses the ABI's map format (see encodePairs). An empty input is
// an empty map. Names and values are copied; names are not lowercased.
func decodePairs(b []byte) (Headers, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 {
		return nil, errPairs
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if n > uint64(len(b)-4)/8 {
		return nil, errPairs
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	h := make(Headers, 0, n)
	for i := uint64(0); i < n; i++ {
		var kv [2]string
		for j := range kv {
			size := uint64(binary.LittleEndian.Uint32(sizes[8*i+4*uint64(j):]))
			if size >= uint64(len(data)) || data[size] != 0 {
				return nil, errPairs
			}
			kv[j] = string(data[:size])
			data = data[size+1:]
		}
		h = append(h, kv)
	}
	if len(data) != 0 {
		return nil, errPairs
	}
	return h, nil
}

// PropertyPath joins the segments of a property path the way the ABI passes
// it to proxy_get_property: separated by NUL bytes. Use it for the keys of
// Request.Properties.
func PropertyPath(segments ...string) string { return strings.Join(segments, "\x00") }

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// hostFunc is one env.proxy_* import: its parameter types and its body, which
// reads the parameters from args and returns the status for the guest.
type hostFunc struct {
	params []api.ValueType
	fn     func(vm *VM, mem api.Memory, args []uint64) Status
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func i32s(n int) []api.ValueType {
	ts := make([]api.ValueType, n)
	for i := range ts {
		ts[i] = i32
	}
	return ts
}

// hostFunctions are the env imports the host implements, with the ABI's
// signatures (those of the SDK's wasmimport declarations).
func hostFunctions() map[string]hostFunc {
	return map[string]hostFunc{
		"proxy_log":                          {i32s(3), hostLog},
		"proxy_get_property":                 {i32s(4), hostGetProperty},
		"proxy_send_local_response":          {i32s(8), hostSendLocalResponse},
		"proxy_get_shared_data":              {i32s(5), hostGetSharedData},
		"proxy_set_shared_data":              {i32s(5), hostSetSharedData},
		"proxy_get_header_map_value":         {i32s(5), hostGetHeaderMapValue},
		"proxy_add_header_map_value":         {i32s(5), hostAddHeaderMapValue},
		"proxy_replace_header_map_value":     {i32s(5), hostReplaceHeaderMapValue},
		"proxy_remove_header_map_value":      {i32s(3), hostRemoveHeaderMapValue},
		"proxy_get_header_map_pairs":         {i32s(3), hostGetHeaderMapPairs},
		"proxy_get_buffer_bytes":             {i32s(5), hostGetBufferBytes},
		"proxy_continue_stream":              {i32s(1), hostContinueStream},
		"proxy_http_call":                    {i32s(10), hostHTTPCall},
		"proxy_set_tick_period_milliseconds": {i32s(1), hostSetTickPeriod},
		"proxy_set_effective_context":        {i32s(1), hostSetEffectiveContext},
		"proxy_define_metric":                {i32s(4), hostDefineMetric},
		"proxy_increment_metric":             {[]api.ValueType{i32, i64}, hostIncrementMetric},
		"proxy_record_metric":                {[]api.ValueType{i32, i64}, hostRecordMetric},
		"proxy_get_current_time_nanoseconds": {i32s(1), hostGetCurrentTime},
		"proxy_register_shared_queue":        {i32s(3), hostRegisterSharedQueue},
		"proxy_resolve_shared_queue":         {i32s(5), hostResolveSharedQueue},
		"proxy_enqueue_shared_queue":         {i32s(3), hostEnqueueSharedQueue},
		"proxy_dequeue_shared_queue":         {i32s(3), hostDequeueSharedQueue},
	}
}

// instantiateEnv registers the env host module. Its functions find the
// calling VM in the context of the call. An env import the host does not
// know gets a stub that answers Unimplemented.
func instantiateEnv(ctx context.Context, rt wazero.Runtime, imports []api.FunctionDefinition) error {
	b := rt.NewHostModuleBuilder("env")
	known := hostFunctions()
	for name, f := range known {
		b.NewFunctionBuilder().
			WithGoModuleFunction(wrap(f.fn), f.params, []api.ValueType{i32}).
			Export(name)
	}
	for _, def := range imports {
		mod, name, _ := def.Import()
		if _, ok := known[name]; ok || mod != "env" {
			continue
		}
		results := def.ResultTypes()
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) {
				if len(results) > 0 {
					stack[0] = uint64(StatusUnimplemented)
				}
			}), def.ParamTypes(), results).
			Export(name)
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("wasmhost: instantiating env: %w", err)
	}
	return nil
}

func wrap(fn func(vm *VM, mem api.Memory, args []uint64) Status) api.GoModuleFunc {
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		vm, ok := ctx.Value(vmKey{}).(*VM)
		if !ok {
			stack[0] = uint64(StatusInternalFailure)
			return
		}
		stack[0] = uint64(fn(vm, mod.Memory(), stack))
	}
}

func read(mem api.Memory, ptr, size uint64) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	b, ok := mem.Read(uint32(ptr), uint32(size))
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func readString(mem api.Memory, ptr, size uint64) (string, bool) {
	b, ok := read(mem, ptr, size)
	return string(b), ok
}

// effectiveStream returns the stream the effective context names, or nil.
func (vm *VM) effectiveStream() *stream {
	return vm.streams[vm.effective]
}

// effectiveRoot returns the root context of the effective context.
func (vm *VM) effectiveRoot() *rootContext {
	if r, ok := vm.roots[vm.effective]; ok {
		return r
	}
	if s := vm.effectiveStream(); s != nil {
		return s.root
	}
	return vm.root
}

func (vm *VM) touch(s *stream) {
	for _, t := range vm.touched {
		if t == s {
			return
		}
	}
	vm.touched = append(vm.touched, s)
}

func hostLog(vm *VM, mem api.Memory, a []uint64) Status {
	level := LogLevel(uint32(a[0]))
	msg, ok := readString(mem, a[1], a[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if level > LogCritical {
		return StatusBadArgument
	}
	vm.h.log(LogEntry{VM: vm.id, Level: level, Message: msg})
	return StatusOK
}

func hostGetProperty(vm *VM, mem api.Memory, a []uint64) Status {
	path, ok := readString(mem, a[0], a[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	v, found := vm.property(strings.TrimSuffix(path, "\x00"))
	if !found {
		return StatusNotFound
	}
	return vm.copyOut(mem, v, uint32(a[2]), uint32(a[3]))
}

// property looks path up: the request's Properties, the stream's built-in properties, then the plugin's.
func (vm *VM) property(path string) ([]byte, bool) {
	if s := vm.effectiveStream(); s != nil {
		if v, ok := s.req.Properties[path]; ok {
			return v, true
		}
		if v, ok := s.builtinProperty(path); ok {
			return []byte(v), true
		}
	}
	switch path {
	case "plugin_root_id", "plugin_name":
		return []byte(vm.rootID), true
	case "plugin_vm_id":
		return nil, true
	}
	return nil, false
}

func (s *stream) builtinProperty(path string) (string, bool) {
	header := func(name string) (string, bool) { return s.reqHeaders.Lookup(name) }
	switch path {
	case PropertyPath("source", "address"):
		return s.req.SourceAddress, s.req.SourceAddress != ""
	case PropertyPath("request", "path"):
		return header(":path")
	case PropertyPath("request", "method"):
		return header(":method")
	case PropertyPath("request", "host"):
		return header(":authority")
	case PropertyPath("request", "scheme"):
		return header(":scheme")
	case PropertyPath("request", "id"):
		return header("x-request-id")
	}
	if name, ok := strings.CutPrefix(path, PropertyPath("request", "headers", "")); ok {
		return header(name)
	}
	return "", false
}

func hostSendLocalResponse(vm *VM, mem api.Memory, a []uint64) Status {
	details, ok1 := readString(mem, a[1], a[2])
	body, ok2 := read(mem, a[3], a[4])
	raw, ok3 := read(mem, a[5], a[6])
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	headers, err := decodePairs(raw)
	if err != nil {
		return StatusBadArgument
	}
	if st := vm.h.guestReply(int(uint32(a[0]))); st != StatusOK {
		return st
	}
	s := vm.effectiveStream()
	if s == nil || s.phase == phaseDone {
		return StatusOK // Envoy: no decoder callbacks, nothing happens
	}
	if s.local == nil {
		s.local = &LocalReply{
			Status:     int(uint32(a[0])),
			Headers:    headers.Clone(),
			Body:       body,
			Details:    details,
			GRPCStatus: int32(uint32(a[7])),
		}
	}
	vm.touch(s)
	return StatusOK
}

func hostGetSharedData(vm *VM, mem api.Memory, a []uint64) Status {
	key, ok := readString(mem, a[0], a[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, cas, st := vm.h.guestGetShared(key)
	if st != StatusOK {
		return st
	}
	if st := vm.copyOut(mem, value, uint32(a[2]), uint32(a[3])); st != StatusOK {
		return st
	}
	if !mem.WriteUint32Le(uint32(a[4]), cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hostSetSharedData(vm *VM, mem api.Memory, a []uint64) Status {
	key, ok1 := readString(mem, a[0], a[1])
	value, ok2 := read(mem, a[2], a[3])
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	return vm.h.guestSetShared(key, value, uint32(a[4]))
}

// headerMap returns the header map mt as Envoy offers it to the effective
// context now: nil when it offers none, and whether it may be changed.
func (vm *VM) headerMap(mt uint32) (*Headers, bool) {
	switch mt {
	case mapCallResponseHeaders:
		if cr := vm.callResp; cr != nil && !cr.failed {
			return &cr.headers, false
		}
		return nil, false
	case mapCallResponseTrail:
		if cr := vm.callResp; cr != nil && !cr.failed {
			return &Headers{}, false
		}
		return nil, false
	}
	s := vm.effectiveStream()
	if s == nil {
		return nil, false
	}
	switch mt {
	case mapRequestHeaders:
		if s.reqLive {
			return &s.reqHeaders, true
		}
		if s.logPhase {
			return &s.reqHeaders, false
		}
	case mapResponseHeaders:
		if s.respLive {
			return &s.respHeaders, true
		}
		if s.logPhase && s.respHeaders != nil {
			return &s.respHeaders, false
		}
	}
	return nil, false
}

func (vm *VM) inLogPhase() bool {
	s := vm.effectiveStream()
	return s != nil && s.logPhase
}

func hostGetHeaderMapValue(vm *VM, mem api.Memory, a []uint64) Status {
	mt := uint32(a[0])
	key, ok := readString(mem, a[1], a[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if mt > mapMax {
		return StatusBadArgument
	}
	m, _ := vm.headerMap(mt)
	if m == nil {
		if vm.inLogPhase() {
			return StatusNotFound
		}
		return StatusBadArgument
	}
	v, found := m.Lookup(key)
	if !found {
		return StatusNotFound
	}
	return vm.copyOut(mem, []byte(v), uint32(a[3]), uint32(a[4]))
}

func hostGetHeaderMapPairs(vm *VM, mem api.Memory, a []uint64) Status {
	mt := uint32(a[0])
	if mt > mapMax {
		return StatusBadArgument
	}
	var data []byte
	if m, _ := vm.headerMap(mt); m != nil && len(*m) > 0 {
		data = encodePairs(*m)
	}
	return vm.copyOut(mem, data, uint32(a[1]), uint32(a[2]))
}

// editHeaderMap applies edit to the mutable map mt, or answers BadArgument
// where Envoy offers no mutable map.
func editHeaderMap(vm *VM, mem api.Memory, a []uint64, withValue bool, edit func(m *Headers, key, value string)) Status {
	mt := uint32(a[0])
	key, ok := readString(mem, a[1], a[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	var value string
	if withValue {
		if value, ok = readString(mem, a[3], a[4]); !ok {
			return StatusInvalidMemoryAccess
		}
	}
	if mt > mapMax {
		return StatusBadArgument
	}
	m, mutable := vm.headerMap(mt)
	if m == nil || !mutable {
		return StatusBadArgument
	}
	edit(m, key, value)
	return StatusOK
}

func hostAddHeaderMapValue(vm *VM, mem api.Memory, a []uint64) Status {
	return editHeaderMap(vm, mem, a, true, func(m *Headers, k, v string) { m.add(k, v) })
}

func hostReplaceHeaderMapValue(vm *VM, mem api.Memory, a []uint64) Status {
	return editHeaderMap(vm, mem, a, true, func(m *Headers, k, v string) { m.replace(k, v) })
}

func hostRemoveHeaderMapValue(vm *VM, mem api.Memory, a []uint64) Status {
	return editHeaderMap(vm, mem, a, false, func(m *Headers, k, _ string) { m.remove(k) })
}

func hostGetBufferBytes(vm *VM, mem api.Memory, a []uint64) Status {
	bt, start, max := uint32(a[0]), uint64(uint32(a[1])), uint64(uint32(a[2]))
	var buf []byte
	switch bt {
	case bufVMConfiguration:
		buf = vm.h.opts.vmConfig
	case bufPluginConfig:
		if vm.configuring == nil {
			return StatusNotFound // only during proxy_on_configure
		}
		buf = vm.configuring.config
	case bufCallResponseBody:
		if vm.callResp == nil || vm.callResp.failed {
			return StatusNotFound
		}
		buf = vm.callResp.body
	case bufResponseBody:
		if s := vm.effectiveStream(); s != nil && s.bodyLive {
			buf = s.respBody
		}
	case bufRequestBody, bufDownstreamData, bufUpstreamData, bufGrpcReceive, bufCallData:
		// Envoy offers these as empty buffers here.
	default:
		return StatusBadArgument
	}
	size := uint64(len(buf))
	if start > size {
		start = size
	}
	end := size
	if start+max < end {
		end = start + max
	}
	return vm.copyOut(mem, buf[start:end], uint32(a[3]), uint32(a[4]))
}

// hostContinueStream resumes the request or the response once the callback
// returns. As in Envoy, the request header map is withdrawn at once.
func hostContinueStream(vm *VM, _ api.Memory, a []uint64) Status {
	s := vm.effectiveStream()
	switch uint32(a[0]) {
	case streamRequest:
		if s != nil {
			s.continueReq = true
			s.reqLive = false
			vm.touch(s)
		}
	case streamResponse:
		if s != nil {
			s.continueResp = true
			s.reqLive = false
			vm.touch(s)
		}
	case streamDownstream:
	case streamUpstream:
		return StatusUnimplemented
	default:
		return StatusBadArgument
	}
	return StatusOK
}

func hostHTTPCall(vm *VM, mem api.Memory, a []uint64) Status {
	cluster, ok1 := readString(mem, a[0], a[1])
	rawHeaders, ok2 := read(mem, a[2], a[3])
	body, ok3 := read(mem, a[4], a[5])
	rawTrailers, ok4 := read(mem, a[6], a[7])
	timeout, idPtr := int32(uint32(a[8])), uint32(a[9])
	if !ok1 || !ok2 || !ok3 || !ok4 || !mem.WriteUint32Le(idPtr, 0) {
		return StatusInvalidMemoryAccess
	}
	headers, err1 := decodePairs(rawHeaders)
	trailers, err2 := decodePairs(rawTrailers)
	if err1 != nil || err2 != nil || timeout < 0 {
		return StatusBadArgument
	}
	headers = headers.Clone()
	for _, required := range []string{":method", ":path", ":authority"} {
		if _, ok := headers.Lookup(required); !ok {
			return StatusBadArgument
		}
	}
	if st := vm.h.guestHTTPCall(cluster); st != StatusOK {
		return st
	}
	if len(body) > 0 {
		headers.replace("content-length", fmt.Sprint(len(body)))
	}
	vm.nextCall++
	c := &Callout{
		ID:        vm.nextCall,
		Cluster:   cluster,
		Headers:   headers,
		Body:      body,
		Trailers:  trailers.Clone(),
		Timeout:   time.Duration(timeout) * time.Millisecond,
		ContextID: vm.effective,
		root:      vm.effectiveRoot().id,
	}
	vm.callouts[c.ID] = c
	if !mem.WriteUint32Le(idPtr, c.ID) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hostSetTickPeriod(vm *VM, _ api.Memory, a []uint64) Status {
	vm.effectiveRoot().tickPeriod = time.Duration(uint32(a[0])) * time.Millisecond
	return StatusOK
}

func hostSetEffectiveContext(vm *VM, _ api.Memory, a []uint64) Status {
	id := uint32(a[0])
	if _, ok := vm.streams[id]; !ok {
		if _, ok := vm.roots[id]; !ok {
			return StatusBadArgument
		}
	}
	vm.effective = id
	return StatusOK
}

func hostDefineMetric(vm *VM, mem api.Memory, a []uint64) Status {
	name, ok := readString(mem, a[1], a[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	id, st := vm.h.defineMetric(uint32(a[0]), name)
	if st != StatusOK {
		return st
	}
	if !mem.WriteUint32Le(uint32(a[3]), id) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hostIncrementMetric(vm *VM, _ api.Memory, a []uint64) Status {
	return vm.h.incrementMetric(uint32(a[0]), int64(a[1]))
}

func hostRecordMetric(vm *VM, _ api.Memory, a []uint64) Status {
	return vm.h.recordMetric(uint32(a[0]), a[1])
}

// hostGetCurrentTime writes the Host's clock (the one WASI clock_time_get
// reads) as Unix ns.
func hostGetCurrentTime(vm *VM, mem api.Memory, a []uint64) Status {
	if !mem.WriteUint64Le(uint32(a[0]), uint64(vm.h.now.Load())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

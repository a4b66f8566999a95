// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// VM is one worker's instance of the module with its root context and its
// streams. Its methods serialise on a mutex; distinct VMs run concurrently.
// After the guest traps (a Go panic, for example) every method returns the
// error that describes the trap.
type VM struct {
	h      *Host
	id     int
	rootID string

	mu        sync.Mutex
	ctx       context.Context
	mod       api.Module
	fn        exports
	failed    error
	nextCtxID uint32
	root      *rootContext
	roots     map[uint32]*rootContext
	streams   map[uint32]*stream
	ended     map[uint32]Response // recently ended streams, for late callouts
	callouts  map[uint32]*Callout
	nextCall  uint32
	stderr    *lineLog
	stdout    *lineLog

	postMu sync.Mutex   // guards posted: another VM's enqueue posts too
	posted []queueReady // proxy_on_queue_ready callbacks to run (queue.go)

	// State of the callback in progress.
	effective   uint32        // context the host calls act on
	configuring *rootContext  // PLUGIN_CONFIGURATION is readable
	callResp    *callResponse // HTTP_CALL_RESPONSE_* are readable
	touched     []*stream     // streams with actions to take after the callback
}

type exports struct {
	initialize, malloc, contextCreate, vmStart, configure, requestHeaders,
	responseHeaders, responseBody, callResponse, tick, queueReady, log, done, delete api.Function
}

type rootContext struct {
	id         uint32
	config     []byte
	tickPeriod time.Duration
	streams    int  // streams created under it and not yet deleted
	retired    bool // replaced by Reconfigure: delete once streams == 0
	awaitDone  bool // proxy_on_done returned false: never deleted (no proxy_done)
}

type callResponse struct {
	failed  bool
	headers Headers
	body    []byte
}

type vmKey struct{}

// NewVM starts a worker: it instantiates the module, runs _initialize, then
// creates the root context, runs proxy_on_vm_start and proxy_on_configure with
// pluginConfig. rootID is the plugin's root_id (properties plugin_root_id and
// plugin_name). It fails if either callback returns false.
func (h *Host) NewVM(pluginConfig []byte, rootID string) (*VM, error) {
	h.mu.Lock()
	h.nextVM++
	id := h.nextVM
	h.mu.Unlock()

	vm := &VM{
		h:        h,
		id:       id,
		rootID:   rootID,
		roots:    make(map[uint32]*rootContext),
		streams:  make(map[uint32]*stream),
		callouts: make(map[uint32]*Callout),
	}
	vm.stdout = &lineLog{vm: vm, level: LogInfo}
	vm.stderr = &lineLog{vm: vm, level: LogError, keepTail: true}
	vm.ctx = context.WithValue(context.Background(), vmKey{}, vm)

	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(vm.stdout).
		WithStderr(vm.stderr).
		WithWalltime(h.walltime, 1).
		WithNanotime(h.nanotime, 1)
	mod, err := h.eng.rt.InstantiateModule(vm.ctx, h.eng.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("wasmhost: instantiating module: %w", err)
	}
	vm.mod = mod
	for name, f := range map[string]*api.Function{
		"_initialize":                 &vm.fn.initialize,
		"proxy_on_memory_allocate":    &vm.fn.malloc,
		"proxy_on_context_create":     &vm.fn.contextCreate,
		"proxy_on_vm_start":           &vm.fn.vmStart,
		"proxy_on_configure":          &vm.fn.configure,
		"proxy_on_request_headers":    &vm.fn.requestHeaders,
		"proxy_on_response_headers":   &vm.fn.responseHeaders,
		"proxy_on_response_body":      &vm.fn.responseBody,
		"proxy_on_http_call_response": &vm.fn.callResponse,
		"proxy_on_tick":               &vm.fn.tick,
		"proxy_on_queue_ready":        &vm.fn.queueReady,
		"proxy_on_log":                &vm.fn.log,
		"proxy_on_done":               &vm.fn.done,
		"proxy_on_delete":             &vm.fn.delete,
	} {
		*f = mod.ExportedFunction(name)
	}

	vm.mu.Lock()
	defer vm.mu.Unlock()
	if _, err := vm.call(vm.fn.initialize, "_initialize", 0); err != nil {
		mod.Close(vm.ctx)
		return nil, err
	}
	root, err := vm.startRoot(pluginConfig)
	if err != nil {
		mod.Close(vm.ctx)
		return nil, err
	}
	vm.root = root

	h.mu.Lock()
	h.vms = append(h.vms, vm)
	h.mu.Unlock()
	return vm, nil
}

// startRoot creates a root context and runs proxy_on_vm_start and
// proxy_on_configure on it, as proxy-wasm-cpp-host's ContextBase::onStart and
// onConfigure do. On failure the root context is deleted again.
func (vm *VM) startRoot(config []byte) (*rootContext, error) {
	vm.nextCtxID++
	r := &rootContext{id: vm.nextCtxID, config: append([]byte(nil), config...)}
	vm.roots[r.id] = r
	if _, err := vm.call(vm.fn.contextCreate, "proxy_on_context_create", r.id, uint64(r.id), 0); err != nil {
		return nil, err
	}
	ok, err := vm.call(vm.fn.vmStart, "proxy_on_vm_start", r.id, uint64(r.id), uint64(len(vm.h.opts.vmConfig)))
	if err != nil {
		return nil, err
	}
	if uint32(ok) == 0 {
		vm.retire(r)
		return nil, fmt.Errorf("wasmhost: worker %d: proxy_on_vm_start returned false%s", vm.id, vm.warnings())
	}
	vm.configuring = r
	ok, err = vm.call(vm.fn.configure, "proxy_on_configure", r.id, uint64(r.id), uint64(len(r.config)))
	vm.configuring = nil
	if err != nil {
		return nil, err
	}
	if uint32(ok) == 0 {
		vm.retire(r)
		return nil, fmt.Errorf("wasmhost: worker %d: proxy_on_configure returned false%s", vm.id, vm.warnings())
	}
	return r, nil
}

// Reconfigure applies a new plugin configuration as Envoy does on a
// configuration update: a new root context (a new context id) gets
// proxy_on_context_create, proxy_on_vm_start and proxy_on_configure. If that
// fails, the old root context stays in force and the error is returned.
// Otherwise new streams use the new root context and the old one is retired
// (proxy_on_done, then proxy_on_delete) once its streams have ended; its
// pending callouts are cancelled then.
func (vm *VM) Reconfigure(pluginConfig []byte) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return vm.failed
	}
	r, err := vm.startRoot(pluginConfig)
	if err != nil {
		return err
	}
	old := vm.root
	vm.root = r
	old.retired = true
	if old.streams == 0 {
		vm.retire(old)
	}
	return vm.failed
}

// retire runs proxy_on_done on a root context and, when it returns true,
// proxy_on_delete; otherwise the root stays (the host has no proxy_done).
func (vm *VM) retire(r *rootContext) {
	for id, c := range vm.callouts {
		if c.root == r.id {
			delete(vm.callouts, id)
		}
	}
	done, err := vm.call(vm.fn.done, "proxy_on_done", r.id, uint64(r.id))
	if err != nil {
		return
	}
	if uint32(done) == 0 {
		r.awaitDone = true
		return
	}
	vm.deleteRoot(r)
}

func (vm *VM) deleteRoot(r *rootContext) {
	delete(vm.roots, r.id)
	vm.call(vm.fn.delete, "proxy_on_delete", r.id, uint64(r.id))
}

// RootContextID returns the id of the root context in force.
func (vm *VM) RootContextID() uint32 {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.root.id
}

// TickPeriod returns the tick period the root context in force asked for
// with proxy_set_tick_period_milliseconds (0: none).
func (vm *VM) TickPeriod() time.Duration {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.root.tickPeriod
}

// MemoryBytes is the size of the module's linear memory: what the guest
// took from the host and never gives back (wasm memory only grows).
func (vm *VM) MemoryBytes() uint64 {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return uint64(vm.mod.Memory().Size())
}

// Tick runs proxy_on_tick on the root context in force. The test decides when
// ticks happen; the host never fires them on its own.
func (vm *VM) Tick() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.failed != nil {
		return vm.failed
	}
	if _, err := vm.call(vm.fn.tick, "proxy_on_tick", vm.root.id, uint64(vm.root.id)); err != nil {
		return err
	}
	return vm.endStep()
}

// Close retires the root contexts (proxy_on_done, proxy_on_delete) and closes
// the module instance. Streams in flight are abandoned.
func (vm *VM) Close() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.mod == nil {
		return nil
	}
	if vm.failed == nil {
		ids := make([]uint32, 0, len(vm.roots))
		for id := range vm.roots {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			if r := vm.roots[id]; r != nil && !r.awaitDone {
				vm.retire(r)
			}
		}
	}
	err := vm.mod.Close(vm.ctx)
	vm.mod = nil
	if vm.failed == nil {
		vm.failed = errors.New("wasmhost: vm closed")
	}
	return err
}

// call runs the guest export f for context ctxID: the effective context is
// ctxID for the duration. A trap marks the VM failed. A callback the module
// does not export is skipped, as proxy-wasm-cpp-host does: it returns what
// the host assumes then (proxy_on_done: true; a body callback: Continue).
func (vm *VM) call(f api.Function, name string, ctxID uint32, args ...uint64) (uint64, error) {
	if vm.failed != nil {
		return 0, vm.failed
	}
	if f == nil {
		if name == "proxy_on_done" {
			return 1, nil
		}
		return 0, nil
	}
	prev := vm.effective
	vm.effective = ctxID
	res, err := f.Call(vm.ctx, args...)
	vm.effective = prev
	if err != nil {
		vm.failed = fmt.Errorf("wasmhost: worker %d: %s: %w%s", vm.id, name, err, vm.logTail())
		return 0, vm.failed
	}
	if vm.failed != nil {
		return 0, vm.failed
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// warnings returns the worker's last few log lines at warn or above, for an
// error message.
func (vm *VM) warnings() string {
	var lines []string
	for _, e := range vm.h.LogsAtLeast(LogWarn) {
		if e.VM == vm.id {
			lines = append(lines, e.Level.String()+": "+e.Message)
		}
	}
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	if len(lines) == 0 {
		return ""
	}
	return "; guest log: " + strings.Join(lines, "; ")
}

func (vm *VM) logTail() string {
	if t := vm.stderr.tail(); t != "" {
		return "\nguest stderr:\n" + t
	}
	return ""
}

// malloc asks the guest for size bytes with proxy_on_memory_allocate.
func (vm *VM) malloc(size uint32) (uint32, bool) {
	res, err := vm.fn.malloc.Call(vm.ctx, uint64(size))
	if err != nil {
		vm.failed = fmt.Errorf("wasmhost: worker %d: proxy_on_memory_allocate: %w%s", vm.id, err, vm.logTail())
		return 0, false
	}
	if len(res) == 0 || uint32(res[0]) == 0 {
		return 0, false
	}
	return uint32(res[0]), true
}

// copyOut hands data to the guest as Envoy's copyToPointerSize does: it
// allocates guest memory, copies data there and writes the address and size
// to the guest's out slots; empty data writes 0 and 0 without allocating.
func (vm *VM) copyOut(mem api.Memory, data []byte, ptrPtr, sizePtr uint32) Status {
	var ptr uint32
	if len(data) > 0 {
		p, ok := vm.malloc(uint32(len(data)))
		if !ok {
			return StatusInvalidMemoryAccess
		}
		if !mem.Write(p, data) {
			return StatusInvalidMemoryAccess
		}
		ptr = p
	}
	if !mem.WriteUint32Le(ptrPtr, ptr) || !mem.WriteUint32Le(sizePtr, uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// lineLog turns the guest's stdout or stderr into log entries, one per line,
// as Envoy logs them. The stderr one keeps a tail for error messages.
type lineLog struct {
	vm       *VM
	level    LogLevel
	keepTail bool
	mu       sync.Mutex
	partial  []byte
	last     []string
}

const tailLines = 40

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, p...)
	var lines []string
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		lines = append(lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	if l.keepTail {
		l.last = append(l.last, lines...)
		if len(l.last) > tailLines {
			l.last = l.last[len(l.last)-tailLines:]
		}
	}
	l.mu.Unlock()
	for _, line := range lines {
		l.vm.h.log(LogEntry{VM: l.vm.id, Level: l.level, Message: line})
	}
	return len(p), nil
}

func (l *lineLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := append([]string(nil), l.last...)
	if len(l.partial) > 0 {
		lines = append(lines, string(l.partial))
	}
	return strings.Join(lines, "\n")
}

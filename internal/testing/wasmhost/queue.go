// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

package wasmhost

import (
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// Shared queues, as proxy-wasm-cpp-host's SharedQueue keeps them: one per
// name in the process (a Host has one vm_id, the empty one), holding its
// items in the host. A registration creates the queue or takes it over: the
// last one names the VM and the root context that proxy_on_queue_ready goes
// to (a stream registers for its root context). An enqueue posts
// proxy_on_queue_ready to that VM, as Envoy posts it to the registering
// worker's event loop: the VM runs it once the callbacks of its current step
// (HTTP, AnswerCallout, FailCallout, ResetStream, Tick) have returned, or at
// its next step when another VM enqueued.

type sharedQueue struct {
	vm    *VM
	ctxID uint32
	items [][]byte
}

// queueReady is a posted proxy_on_queue_ready.
type queueReady struct {
	ctxID, token uint32
}

// maxPosted bounds the proxy_on_queue_ready callbacks one step runs: a guest
// that enqueues again in each of them would never let the step end.
const maxPosted = 10000

func (h *Host) registerQueue(vm *VM, ctxID uint32, name string) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	token, ok := h.queueTokens[name]
	if !ok {
		h.nextQueue++
		token = h.nextQueue
		h.queueTokens[name] = token
		h.queues[token] = &sharedQueue{}
	}
	q := h.queues[token]
	q.vm, q.ctxID = vm, ctxID // the items stay
	return token
}

func (h *Host) resolveQueue(name string) (uint32, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	token, ok := h.queueTokens[name]
	return token, ok
}

func (h *Host) enqueue(token uint32, data []byte) Status {
	h.mu.Lock()
	q, ok := h.queues[token]
	if !ok {
		h.mu.Unlock()
		return StatusNotFound
	}
	q.items = append(q.items, data)
	vm, ctxID := q.vm, q.ctxID
	h.mu.Unlock()
	vm.postMu.Lock()
	vm.posted = append(vm.posted, queueReady{ctxID: ctxID, token: token})
	vm.postMu.Unlock()
	return StatusOK
}

func (h *Host) dequeue(token uint32) ([]byte, Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	q, ok := h.queues[token]
	switch {
	case !ok:
		return nil, StatusNotFound
	case len(q.items) == 0:
		return nil, StatusEmpty
	}
	item := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return item, StatusOK
}

// QueueLen returns the number of items in the shared queue name, and
// whether it is registered.
func (h *Host) QueueLen(name string) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	token, ok := h.queueTokens[name]
	if !ok {
		return 0, false
	}
	return len(h.queues[token].items), true
}

// runPosted runs the proxy_on_queue_ready callbacks posted to the VM, in
// order, each followed by the stream actions it asked for, until none is
// left (those posted meanwhile included). A callback for a root context
// deleted since is dropped, as Envoy drops it.
func (vm *VM) runPosted() error {
	for range maxPosted {
		vm.postMu.Lock()
		if len(vm.posted) == 0 {
			vm.postMu.Unlock()
			return nil
		}
		r := vm.posted[0]
		vm.posted = vm.posted[1:]
		vm.postMu.Unlock()
		if _, ok := vm.roots[r.ctxID]; !ok {
			continue
		}
		if _, err := vm.call(vm.fn.queueReady, "proxy_on_queue_ready", r.ctxID, uint64(r.ctxID), uint64(r.token)); err != nil {
			return err
		}
		if err := vm.settleTouched(); err != nil {
			return err
		}
	}
	return fmt.Errorf("wasmhost: worker %d: more than %d proxy_on_queue_ready callbacks in one step", vm.id, maxPosted)
}

// endStep takes the actions the step's callbacks asked for, then runs the
// callbacks posted meanwhile.
func (vm *VM) endStep() error {
	if err := vm.settleTouched(); err != nil {
		return err
	}
	return vm.runPosted()
}

func hostRegisterSharedQueue(vm *VM, mem api.Memory, a []uint64) Status {
	name, ok := readString(mem, a[0], a[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	token := vm.h.registerQueue(vm, vm.effectiveRoot().id, name)
	if !mem.WriteUint32Le(uint32(a[2]), token) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hostResolveSharedQueue(vm *VM, mem api.Memory, a []uint64) Status {
	vmID, ok1 := readString(mem, a[0], a[1])
	name, ok2 := readString(mem, a[2], a[3])
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	token, found := vm.h.resolveQueue(name)
	if vmID != "" || !found {
		return StatusNotFound
	}
	if !mem.WriteUint32Le(uint32(a[4]), token) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hostEnqueueSharedQueue(vm *VM, mem api.Memory, a []uint64) Status {
	data, ok := read(mem, a[1], a[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	return vm.h.enqueue(uint32(a[0]), data)
}

func hostDequeueSharedQueue(vm *VM, mem api.Memory, a []uint64) Status {
	item, st := vm.h.dequeue(uint32(a[0]))
	if st != StatusOK {
		return st
	}
	return vm.copyOut(mem, item, uint32(a[1]), uint32(a[2]))
}

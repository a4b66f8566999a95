;; A proxy-wasm ABI 0.2.0 filter whose callbacks do nothing: every stream
;; continues, nothing is read or written. It exports exactly the callbacks
;; the plugin exports (TestNullWasmExportsLikePlugin checks), so Envoy makes
;; the same calls per request into both. Run as a filter it measures what any
;; Wasm filter costs in Envoy and V8 before the guest does anything.
;; Regenerate the .wasm with `go generate ./cmd/bench/nullwasm` (wabt's wat2wasm).
(module
  (memory (export "memory") 1)
  (func (export "_initialize"))
  (func (export "proxy_abi_version_0_2_0"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32)
    i32.const 1024) ;; scratch memory nobody reads
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32)
    i32.const 1)
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    i32.const 1)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    i32.const 0) ;; Continue
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_response_trailers") (param i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_delete") (param i32))
  ;; The rest of the successor SDK's exports: Envoy calls proxy_on_log and
  ;; proxy_on_done on every stream; the others are never called by an HTTP
  ;; filter, but a module exporting them is what Envoy loads.
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_done") (param i32) (result i32)
    i32.const 1) ;; done
  (func (export "proxy_on_queue_ready") (param i32 i32))
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_request_trailers") (param i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_new_connection") (param i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_downstream_data") (param i32 i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_downstream_connection_close") (param i32 i32))
  (func (export "proxy_on_upstream_data") (param i32 i32 i32) (result i32)
    i32.const 0)
  (func (export "proxy_on_upstream_connection_close") (param i32 i32))
  (func (export "proxy_on_tick") (param i32))
  (func (export "proxy_on_http_call_response") (param i32 i32 i32 i32 i32)))

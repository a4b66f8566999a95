;; A proxy-wasm ABI 0.2.0 filter with no code of its own that makes, once per
;; request, the host calls of the plugin's allowed request: it reads the
;; x-api-key request header, reads the shared-data value under that key and
;; writes a 128-byte value back with the CAS it read (0 when missing),
;; increments a counter, reads the host clock, and adds the five RateLimit
;; response headers. It exports exactly the callbacks the plugin exports
;; (TestNullWasmExportsLikePlugin checks), so Envoy makes the same calls into
;; both. Its difference to null.wat is what those host calls cost Envoy made
;; once each, with no guest code around them: the floor of any module that
;; makes them, in any language.
;;
;; Memory: 16..63 the host's output slots; 64.. names and values (data);
;; 8192.. the 128-byte value written; 16384.. what the host hands over
;; through proxy_on_memory_allocate (a bump pointer reset per request).
;; Regenerate the .wasm with `go generate ./cmd/bench/nullwasm` (wabt's wat2wasm).
(module
  (import "env" "proxy_get_header_map_value"
    (func $get_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value"
    (func $add_header (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_get_shared_data"
    (func $get_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_shared_data"
    (func $set_shared (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_define_metric"
    (func $define_metric (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_increment_metric"
    (func $increment_metric (param i32 i64) (result i32)))
  (import "env" "proxy_get_current_time_nanoseconds"
    (func $now (param i32) (result i32)))
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 16384))
  ;; 64: the header's name (9); 80: the counter's name (10); 96..: the
  ;; response headers' names and values, as (offset, length) below.
  (data (i32.const 64) "x-api-key")
  (data (i32.const 80) "bench_path")
  (data (i32.const 96) "ratelimit-policy")            ;; 96, 16
  (data (i32.const 112) "\"per-key\";q=1000000000;w=1") ;; 112, 26
  (data (i32.const 144) "ratelimit")                   ;; 144, 9
  (data (i32.const 160) "\"per-key\";r=999999999;t=0")  ;; 160, 25
  (data (i32.const 192) "ratelimit-limit")             ;; 192, 15
  (data (i32.const 208) "1000000000")                  ;; 208, 10
  (data (i32.const 224) "ratelimit-remaining")         ;; 224, 19
  (data (i32.const 244) "999999999")                   ;; 244, 9
  (data (i32.const 256) "ratelimit-reset")             ;; 256, 15
  (data (i32.const 272) "0")                           ;; 272, 1
  (func (export "_initialize"))
  (func (export "proxy_abi_version_0_2_0"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (local.get $p) (i32.and (i32.add (local.get $size) (i32.const 15)) (i32.const -16))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32)
    i32.const 1)
  ;; The counter's id goes to 40.
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $define_metric (i32.const 0) (i32.const 80) (i32.const 10) (i32.const 40)))
    i32.const 1)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (local $cas i32)
    (global.set $next (i32.const 16384))
    ;; the key: its pointer at 16, its size at 20
    (if (i32.ne (call $get_header (i32.const 0) (i32.const 64) (i32.const 9) (i32.const 16) (i32.const 20)) (i32.const 0))
      (then (return (i32.const 0))))
    ;; its value (pointer 24, size 28) and CAS (32); 0 when missing
    (if (i32.eq (call $get_shared (i32.load (i32.const 16)) (i32.load (i32.const 20)) (i32.const 24) (i32.const 28) (i32.const 32)) (i32.const 0))
      (then (local.set $cas (i32.load (i32.const 32)))))
    (drop (call $set_shared (i32.load (i32.const 16)) (i32.load (i32.const 20)) (i32.const 8192) (i32.const 128) (local.get $cas)))
    (drop (call $increment_metric (i32.load (i32.const 40)) (i64.const 1)))
    (drop (call $now (i32.const 48)))
    i32.const 0) ;; Continue
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add_header (i32.const 2) (i32.const 96) (i32.const 16) (i32.const 112) (i32.const 26)))
    (drop (call $add_header (i32.const 2) (i32.const 144) (i32.const 9) (i32.const 160) (i32.const 25)))
    (drop (call $add_header (i32.const 2) (i32.const 192) (i32.const 15) (i32.const 208) (i32.const 10)))
    (drop (call $add_header (i32.const 2) (i32.const 224) (i32.const 19) (i32.const 244) (i32.const 9)))
    (drop (call $add_header (i32.const 2) (i32.const 256) (i32.const 15) (i32.const 272) (i32.const 1)))
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

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// host.js runs the plugin's guest code under V8 with nothing else around it,
// for `make bench-guest`: a minimal proxy-wasm host in Node (V8, TurboFan
// only, as Envoy runs it) that answers the host calls an allowed request
// makes from JavaScript stubs (a request header, shared data with CAS, the
// clock, metrics and response headers accepted) and drives the callbacks
// Envoy drives per request: context create, request headers, response
// headers, response body, delete. It prints the time per request; mode
// body reads a response_json cost from a 1 MiB body, `{"pad":"xxx...`, in
// 16 KiB chunks (the string scan a stalled answer costs; its time is the
// process's CPU time, and GC runs: poll_oneoff answers). Under
// `perf record` with Node's --perf-basic-prof, V8 names each Wasm function
// (from the module's name section: build an unstripped module) and
// report.js sums the samples per function.
//
//	node --no-liftoff --no-wasm-lazy-compilation host.js plugin-full.wasm [requests] [allow|idle|body]
//
// It is not a test of the plugin (package plugin and e2e are): the stubs
// answer only what these two paths ask.
const fs = require('fs');
'use strict';
const [,, wasmPath, nStr, mode] = process.argv;
const N = parseInt(nStr || '200000');
const CHUNK = 16384, BODY = 1 << 20;
const chunk = Buffer.alloc(CHUNK, 'x'), firstChunk = Buffer.alloc(CHUNK, 'x');
firstChunk.write('{"pad":"', 0);
let bodyAt = 0; // the offset in the body of the chunk being delivered
const cfg = Buffer.from(mode === 'body'
  ? '{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1000000000,"burst":1000000000,"cost_source":"response_json:usage.total_tokens"}}]}'
  : mode === 'idle'
  ? '{"rules":[{"name":"per-key","match":{"header:x-bench-never":{"present":true}},"limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1000000000,"burst":1000000000}}]}'
  : '{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":1000000000,"burst":1000000000}}]}');
let mem, ex;
const u8 = () => new Uint8Array(mem.buffer);
const dv = () => new DataView(mem.buffer);
const str = (p, n) => Buffer.from(mem.buffer, p, n).toString();
function give(bytes, retPtr, retSize) {
  const p = ex.proxy_on_memory_allocate(bytes.length);
  u8().set(bytes, p);
  dv().setUint32(retPtr, p, true); dv().setUint32(retSize, bytes.length, true);
}
const shared = new Map(); // key -> [Buffer, cas]
let casSeq = 1;
let apiKey = Buffer.from('key-0');
let now = 1700000000000000000n;
const env = {
  proxy_log: () => 0,
  proxy_get_property: () => 1,
  proxy_send_local_response: () => 0,
  proxy_get_shared_data: (kp, ks, rd, rs, rc) => {
    const e = shared.get(str(kp, ks));
    if (!e) return 1;
    give(e[0], rd, rs); dv().setUint32(rc, e[1], true); return 0;
  },
  proxy_set_shared_data: (kp, ks, vp, vs, cas) => {
    const k = str(kp, ks); const e = shared.get(k);
    if (cas !== 0 && e && e[1] !== cas) return 8;
    shared.set(k, [Buffer.from(u8().slice(vp, vp + vs)), casSeq++]); return 0;
  },
  proxy_get_header_map_value: (mt, kp, ks, rd, rs) => {
    const k = str(kp, ks);
    if (mt === 0 && k === 'x-api-key') { give(apiKey, rd, rs); return 0; }
    if (mt === 2 && k === ':status') { give(Buffer.from('200'), rd, rs); return 0; }
    if (mt === 2 && k === 'content-type') { give(Buffer.from('application/json'), rd, rs); return 0; }
    return 1;
  },
  proxy_add_header_map_value: () => 0,
  proxy_replace_header_map_value: () => 0,
  proxy_get_header_map_pairs: () => 1,
  proxy_get_buffer_bytes: (bt, start, max, rd, rs) => {
    if (bt === 7) { give(cfg, rd, rs); return 0; }
    if (bt === 1) { give((bodyAt === 0 ? firstChunk : chunk).subarray(start, Math.min(start + max, CHUNK)), rd, rs); return 0; }
    if (bt === 6) { return 1; }
    return 1;
  },
  proxy_continue_stream: () => 0,
  proxy_http_call: () => 12,
  proxy_set_tick_period_milliseconds: () => 0,
  proxy_set_effective_context: () => 0,
  proxy_register_shared_queue: (np, ns, rp) => { dv().setUint32(rp, 1, true); return 0; },
  proxy_enqueue_shared_queue: () => 0,
  proxy_dequeue_shared_queue: () => 7, // empty
  proxy_get_current_time_nanoseconds: (rp) => { now += 1000n; dv().setBigUint64(rp, now, true); return 0; },
  proxy_define_metric: (t, np, ns, rp) => { dv().setUint32(rp, 1, true); return 0; },
  proxy_increment_metric: () => 0,
};
const wasi = {
  sched_yield: () => 0, proc_exit: (c) => { throw new Error('exit ' + c); },
  args_get: () => 0, args_sizes_get: (a, b) => { dv().setUint32(a, 0, true); dv().setUint32(b, 0, true); return 0; },
  environ_get: () => 0, environ_sizes_get: (a, b) => { dv().setUint32(a, 0, true); dv().setUint32(b, 0, true); return 0; },
  clock_time_get: (id, prec, rp) => { now += 1000n; dv().setBigUint64(rp, now, true); return 0; },
  fd_write: (fd, iovs, n, rp) => { let t = 0; for (let i = 0; i < n; i++) t += dv().getUint32(iovs + 8 * i + 4, true); dv().setUint32(rp, t, true); return 0; },
  random_get: (p, n) => { u8().fill(7, p, p + n); return 0; },
  // A clock subscription's event, at once (the Go runtime sleeps so in a collection).
  poll_oneoff: (inp, out, n, rp) => {
    const d = dv();
    for (let i = 0; i < n; i++) {
      d.setBigUint64(out + 32 * i, d.getBigUint64(inp + 48 * i, true), true);
      d.setUint16(out + 32 * i + 8, 0, true);
      d.setUint8(out + 32 * i + 10, d.getUint8(inp + 48 * i + 8));
    }
    d.setUint32(rp, n, true);
    return 0;
  },
  fd_close: () => 0, fd_fdstat_get: () => 0, fd_fdstat_set_flags: () => 0,
  fd_prestat_get: () => 8, fd_prestat_dir_name: () => 8,
  fd_read: () => 8, // EBADF: the guest has no files to read (Go's os package imports it)
  fd_seek: () => 8, // EBADF, as fd_read
  path_open: () => 44, // ENOENT: no zone files here (package calendar's time zones fall back to the compiled-in database)
};
const mod = new WebAssembly.Module(fs.readFileSync(wasmPath));
const inst = new WebAssembly.Instance(mod, { env, wasi_snapshot_preview1: wasi });
ex = inst.exports; mem = ex.memory;
ex._initialize();
ex.proxy_on_context_create(1, 0);
if (!ex.proxy_on_vm_start(1, 0)) throw new Error('vm start');
if (!ex.proxy_on_configure(1, cfg.length)) throw new Error('configure');
const keys = []; for (let i = 0; i < 100; i++) keys.push(Buffer.from('key-' + i));
function run(n) {
  for (let i = 0; i < n; i++) {
    const id = 2 + (i % 1000);
    apiKey = keys[i % 100];
    ex.proxy_on_context_create(id, 1);
    ex.proxy_on_request_headers(id, 5, 1);
    ex.proxy_on_response_headers(id, 3, 0);
    if (mode === 'body') {
      for (bodyAt = 0; bodyAt < BODY; bodyAt += CHUNK) ex.proxy_on_response_body(id, CHUNK, bodyAt + CHUNK >= BODY ? 1 : 0);
    } else {
      ex.proxy_on_response_body(id, 2, 1);
    }
    ex.proxy_on_log(id); // as Envoy: the stream is done
    ex.proxy_on_done(id);
    ex.proxy_on_delete(id);
  }
}
run(mode === 'body' ? 20 : 20000);
const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
run(N);
if (mode === 'body') {
  const cu = process.cpuUsage(c0), us = (cu.user + cu.system) / N;
  console.log(`body: ${(us / 1000).toFixed(2)} ms of CPU per 1 MiB body (${(BODY / us).toFixed(0)} MB/s; ${N} requests)`);
} else {
  const dt = Number(process.hrtime.bigint() - t0) / N;
  console.log(`${mode || 'allow'}: ${(dt / 1000).toFixed(2)} µs per request (${N} requests), shared keys ${shared.size}`);
}

// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// report.js reads `perf report --no-children --sort sym` of a host.js run on
// standard input and prints the share of samples in the Wasm guest (V8's
// TurboFan code for Wasm functions), by Go package and by function. V8's
// own compile work and the JavaScript stubs are left out of the guest.
'use strict';
const lines = require('fs').readFileSync(0, 'utf8').split('\n');
let total = 0, guest = 0;

// group names a function's package: ours by their last element, the SDK,
// the Go runtime (runtime, internal/..., sync), the module's exported entry
// points and V8's wrappers around imports.
function group(name) {
  if (name.startsWith('runtime.') || name.startsWith('internal_') || name.startsWith('sync')) return 'Go runtime';
  if (name.startsWith('wasm-to-js:')) return 'V8 import wrappers';
  if (name.startsWith('proxy_on_') || name.startsWith('_initialize')) return 'exported entry points';
  const m = /^github\.com_([^.]*)\./.exec(name);
  if (!m) return name.split('.')[0];
  if (m[1].startsWith('tetratelabs_proxy_wasm_go_sdk')) return 'proxy-wasm SDK';
  if (m[1].startsWith('ratelimit_wasm_tokenbucket_')) return m[1].slice('ratelimit_wasm_tokenbucket_'.length).replace(/_/g, '/');
  return m[1].replace(/_/g, '/');
}
const groups = new Map(), funcs = [];
for (const l of lines) {
  const m = /^\s*([\d.]+)%\s+\[.\]\s+(.*)$/.exec(l);
  if (!m) continue;
  const p = parseFloat(m[1]), sym = m[2];
  total += p;
  if (!sym.startsWith('JS:') || !sym.endsWith('-turbofan') || sym.includes('host.js')) continue;
  guest += p;
  const name = sym.slice(3).replace(/-\d+-turbofan$/, '');
  funcs.push([p, name]);
  groups.set(group(name), (groups.get(group(name)) || 0) + p);
}
console.log(`samples in the Wasm guest: ${guest.toFixed(1)}% of all (the rest: V8 compiling, the JavaScript host stubs, Node)`);
console.log('by package (share of the guest\'s samples):');
for (const [g, p] of [...groups].sort((a, b) => b[1] - a[1]).slice(0, 12)) {
  console.log(`  ${(100 * p / guest).toFixed(1).padStart(5)}%  ${g}`);
}
console.log('hottest functions (share of the guest\'s samples):');
for (const [p, n] of funcs.slice(0, 25)) console.log(`  ${(100 * p / guest).toFixed(1).padStart(5)}%  ${n}`);

// Command fnvcollide finds two printable header values that an unkeyed
// bucket identity (the one engine/hash.go computed before it was keyed: a
// 64-bit FNV-1a over the length-prefixed rule name, key sources and values,
// finished by a bijective mix) gives the same identity, for the rule
// "tenant" keyed by header:x-tenant. It found the pair that
// engine.TestCollidingKeysKeepTheirBuckets uses; it is not run by any test
// (go run ./engine/testdata/fnvcollide, a few minutes to hours on one core).
//
// The search is a parallel collision search with distinguished points
// (van Oorschot and Wiener): f(x) is the FNV state after the value "x as 16
// hex digits", a function of 64 bits to 64 bits; walks x, f(x), f(f(x)), ...
// from random starts stop at a point whose low dpBits bits are 0, and two
// walks that reach the same point have merged, at a collision of f (about
// 2^32 evaluations in all). The mix is a bijection, so a collision of the
// FNV state is a collision of the identity.
package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
	dpBits    = 20
	dpMask    = 1<<dpBits - 1
	maxWalk   = 40 << dpBits // a walk this long without a distinguished point is a cycle: dropped
	lanes     = 8            // walks stepped together, so their multiplications overlap
	rule      = "tenant"
	keyName   = "x-tenant"
	keyKind   = 1 // config.SourceHeader
)

type fnv uint64

func (h fnv) byte(b byte) fnv { return (h ^ fnv(b)) * fnvPrime }

func (h fnv) uvarint(n int) fnv {
	for n >= 0x80 {
		h = h.byte(byte(n) | 0x80)
		n >>= 7
	}
	return h.byte(byte(n))
}

func (h fnv) field(s string) fnv {
	h = h.uvarint(len(s))
	for i := 0; i < len(s); i++ {
		h = h.byte(s[i])
	}
	return h
}

// mix is the splitmix64 finaliser the identity ended with.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// prefix is the rule's state: name, key kind and key name.
var prefix = fnv(fnvOffset).field(rule).uvarint(keyKind).field(keyName)

// identity is the old identity of a request whose x-tenant is v.
func identity(v string) uint64 { return mix(uint64(prefix.field(v))) }

const digits = "0123456789abcdef"

func value(x uint64) string {
	var b [16]byte
	for i := range b {
		b[i] = digits[x>>(60-4*uint(i))&0xf]
	}
	return string(b[:])
}

// f is the FNV state after value(x).
func f(x uint64) uint64 {
	h := prefix.byte(16)
	for s := 60; s >= 0; s -= 4 {
		h = h.byte(digits[x>>uint(s)&0xf])
	}
	return uint64(h)
}

type walk struct{ start, length uint64 }

type table struct {
	mu   sync.Mutex
	dps  map[uint64]walk
	done chan [2]uint64
	once sync.Once
}

func random() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// search runs lanes walks at a time until a collision is found.
func (t *table) search(evals *atomic.Uint64) {
	var x, start, n [lanes]uint64
	for i := range x {
		start[i] = random()
		x[i] = start[i]
	}
	p := uint64(prefix.byte(16))
	for {
		select {
		case <-t.done:
			return
		default:
		}
		for step := 0; step < 1<<12; step++ {
			for i := 0; i < lanes; i++ {
				h, v := p, x[i]
				for s := 60; s >= 0; s -= 4 {
					h = (h ^ uint64(digits[v>>uint(s)&0xf])) * fnvPrime
				}
				x[i] = h
			}
			for i := 0; i < lanes; i++ {
				n[i]++
				if x[i]&dpMask == 0 || n[i] > maxWalk {
					if n[i] <= maxWalk {
						t.found(x[i], walk{start[i], n[i]})
					}
					start[i] = random()
					x[i], n[i] = start[i], 0
				}
			}
		}
		evals.Add(lanes << 12)
	}
}

// found records a distinguished point; a second walk to it locates the
// collision.
func (t *table) found(dp uint64, w walk) {
	t.mu.Lock()
	o, seen := t.dps[dp]
	if !seen {
		t.dps[dp] = w
	}
	t.mu.Unlock()
	if !seen {
		return
	}
	a, b := w, o
	if a.length < b.length {
		a, b = b, a
	}
	x, y := a.start, b.start
	for i := uint64(0); i < a.length-b.length; i++ {
		x = f(x)
	}
	if x == y {
		return // one walk started on the other
	}
	for {
		fx, fy := f(x), f(y)
		if fx == fy {
			t.once.Do(func() { t.done <- [2]uint64{x, y}; close(t.done) })
			return
		}
		x, y = fx, fy
	}
}

func main() {
	workers := runtime.GOMAXPROCS(0)
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "usage: fnvcollide [workers]")
			os.Exit(2)
		}
		workers = n
	}
	t := &table{dps: map[uint64]walk{}, done: make(chan [2]uint64, 1)}
	var evals atomic.Uint64
	began := time.Now()
	for range workers {
		go t.search(&evals)
	}
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case pair := <-t.done:
			a, b := value(pair[0]), value(pair[1])
			fmt.Printf("x-tenant %q and %q: identity %016x and %016x (%d evaluations, %v, %d workers)\n",
				a, b, identity(a), identity(b), evals.Load(), time.Since(began).Round(time.Second), workers)
			if identity(a) != identity(b) || a == b {
				fmt.Fprintln(os.Stderr, "fnvcollide: not a collision")
				os.Exit(1)
			}
			return
		case <-tick.C:
			t.mu.Lock()
			n := len(t.dps)
			t.mu.Unlock()
			fmt.Fprintf(os.Stderr, "%v: %.2e evaluations, %d distinguished points\n", time.Since(began).Round(time.Second), float64(evals.Load()), n)
		}
	}
}

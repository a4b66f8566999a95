// Package wasmsize splits an unstripped Go Wasm module's code by Go package:
// the bytes of each function body (code section) grouped by the package in
// the function's name (name section), and the data section's size. It reads
// only what it needs of the binary format (sections, imports, names).
//
//	go run ./internal/wasmsize build/plugin-full.wasm
package wasmsize

import (
	"errors"
	"sort"
	"strconv"
	"strings"
)

// Report is one module's footprint.
type Report struct {
	Total    int            // the file's size
	Code     int            // the code section's size
	Data     int            // the data section's size
	Packages map[string]int // function body bytes per package
	Funcs    map[string]int // body bytes per function name
}

// Package is one row of Report.Sorted.
type Package struct {
	Name  string
	Bytes int
}

// Sorted returns the packages, largest first.
func (r Report) Sorted() []Package {
	ps := make([]Package, 0, len(r.Packages))
	for n, b := range r.Packages {
		ps = append(ps, Package{n, b})
	}
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].Bytes != ps[j].Bytes {
			return ps[i].Bytes > ps[j].Bytes
		}
		return ps[i].Name < ps[j].Name
	})
	return ps
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(msg string) {
	if r.err == nil {
		r.err = errors.New("wasmsize: " + msg + " at byte " + strconv.Itoa(r.off))
	}
}

func (r *reader) byte() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.fail("unexpected end")
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) u32() int {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int(v)
		}
	}
	r.fail("bad LEB128")
	return 0
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n < 0 || r.off+n > len(r.b) {
		r.fail("unexpected end")
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) name() string { return string(r.bytes(r.u32())) }

// Analyze reads a Wasm module.
func Analyze(wasm []byte) (Report, error) {
	rep := Report{Total: len(wasm), Packages: map[string]int{}, Funcs: map[string]int{}}
	r := &reader{b: wasm}
	if string(r.bytes(8)) != "\x00asm\x01\x00\x00\x00" {
		return rep, errors.New("wasmsize: not a Wasm module (version 1)")
	}
	imported := 0    // imported functions come first in the index space
	var bodies []int // body sizes, in order
	names := map[int]string{}
	for r.err == nil && r.off < len(wasm) {
		id := r.byte()
		size := r.u32()
		sec := &reader{b: r.bytes(size)}
		if r.err != nil {
			break
		}
		switch id {
		case 0: // custom
			if sec.name() != "name" {
				continue
			}
			for sec.err == nil && sec.off < len(sec.b) {
				sub := sec.byte()
				ss := &reader{b: sec.bytes(sec.u32())}
				if sub != 1 {
					continue
				}
				for n := ss.u32(); n > 0 && ss.err == nil; n-- {
					i := ss.u32()
					names[i] = ss.name()
				}
				if ss.err != nil {
					return rep, ss.err
				}
			}
		case 2: // imports
			for n := sec.u32(); n > 0 && sec.err == nil; n-- {
				sec.name()
				sec.name()
				switch kind := sec.byte(); kind {
				case 0:
					sec.u32()
					imported++
				case 1: // table: reftype, limits
					sec.byte()
					limits(sec)
				case 2:
					limits(sec)
				case 3: // global: valtype, mut
					sec.byte()
					sec.byte()
				default:
					sec.fail("unknown import kind")
				}
			}
		case 10: // code
			rep.Code = size
			for n := sec.u32(); n > 0 && sec.err == nil; n-- {
				s := sec.u32()
				sec.bytes(s)
				bodies = append(bodies, s)
			}
		case 11: // data
			rep.Data = size
		}
		if sec.err != nil {
			return rep, sec.err
		}
	}
	if r.err != nil {
		return rep, r.err
	}
	for i, s := range bodies {
		rep.Packages[PackageOf(names[imported+i])] += s
		rep.Funcs[names[imported+i]] += s
	}
	return rep, nil
}

func limits(r *reader) {
	if flags := r.byte(); flags&1 != 0 {
		r.u32()
	}
	r.u32()
}

// PackageOf is the Go package of a function name as the linker writes it:
// the import path up to the first '.' after the last '/' ("runtime.mallocgc",
// "github.com/tidwall/gjson.Get", "encoding/json.(*decodeState).value",
// "slices.Index[...]"). Names mangled with '_' for '/' ("encoding_json.x",
// "github.com_tidwall_gjson.Get") keep a leading host's dot. Names without
// a package are "(no package)".
func PackageOf(fn string) string {
	if fn == "" {
		return "(unnamed)"
	}
	head := fn
	if i := strings.IndexAny(head, "(["); i >= 0 {
		head = head[:i] // type arguments and receivers hold dots and slashes
	}
	start := strings.LastIndexByte(head, '/') + 1
	if start == 0 {
		for _, host := range []string{"github.com_", "golang.org_", "google.golang.org_", "gopkg.in_"} {
			if strings.HasPrefix(head, host) {
				start = len(host)
				break
			}
		}
	}
	i := strings.IndexByte(head[start:], '.')
	if i < 0 {
		return "(no package)"
	}
	return fn[:start+i]
}

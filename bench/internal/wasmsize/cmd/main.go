// Command wasmsize prints a Go Wasm module's code bytes per package and its
// data section (see package wasmsize). Build the module without -s -w.
//
//	go run ./internal/wasmsize/cmd [-top N] module.wasm [module.wasm...]
package main

import (
	"flag"
	"fmt"
	"os"
	"sort"

	"github.com/ratelimit-wasm/tokenbucket/bench/internal/wasmsize"
)

func main() {
	top := flag.Int("top", 25, "packages to list per module (0: all)")
	funcs := flag.String("funcs", "", "list the functions of this package instead (largest first)")
	flag.Parse()
	for _, f := range flag.Args() {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		rep, err := wasmsize.Analyze(b)
		if err != nil {
			fmt.Fprintln(os.Stderr, f+":", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %d bytes, code section %d, data section %d\n", f, rep.Total, rep.Code, rep.Data)
		if *funcs != "" {
			var fs []wasmsize.Package
			for n, b := range rep.Funcs {
				if wasmsize.PackageOf(n) == *funcs {
					fs = append(fs, wasmsize.Package{Name: n, Bytes: b})
				}
			}
			sort.Slice(fs, func(i, j int) bool { return fs[i].Bytes > fs[j].Bytes })
			for i, f := range fs {
				if *top > 0 && i == *top {
					break
				}
				fmt.Printf("  %9d  %s\n", f.Bytes, f.Name)
			}
			continue
		}
		for i, p := range rep.Sorted() {
			if *top > 0 && i == *top {
				break
			}
			fmt.Printf("  %9d  %s\n", p.Bytes, p.Name)
		}
	}
}

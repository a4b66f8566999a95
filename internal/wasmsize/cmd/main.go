// Command wasmsize prints a Go Wasm module's code bytes per package and its
// data section (see package wasmsize). Build the module without -s -w.
//
//	go run ./internal/wasmsize/cmd [-top N] module.wasm [module.wasm...]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ratelimit-wasm/tokenbucket/internal/wasmsize"
)

func main() {
	top := flag.Int("top", 25, "packages to list per module (0: all)")
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
		for i, p := range rep.Sorted() {
			if *top > 0 && i == *top {
				break
			}
			fmt.Printf("  %9d  %s\n", p.Bytes, p.Name)
		}
	}
}

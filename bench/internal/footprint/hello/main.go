// Command hello is the Go wasip1 hello world of bench/footprint.md:
// what any module built by the standard Go compiler carries.
package main

import "os"

func main() { os.Stdout.WriteString("hello, world\n") }

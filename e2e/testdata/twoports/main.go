// Copyright 2026 The tokenbucket authors. SPDX-License-Identifier: Apache-2.0

// Command twoports stands in for limitd in TestLimitdStartWaitsForEveryPort:
// it opens --grpc-listen at once, appending a line to --accepts for every
// connection it accepts there, and opens --listen only once the file
// --gate exists. It ignores limitd's other flags and runs until killed.
package main

import (
	"fmt"
	"net"
	"os"
	"time"
)

func main() {
	flags := map[string]string{}
	for i := 1; i+1 < len(os.Args); i++ {
		flags[os.Args[i]] = os.Args[i+1]
	}
	grpc, err := net.Listen("tcp", flags["--grpc-listen"])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go acceptAll(grpc, func() {
		f, err := os.OpenFile(flags["--accepts"], os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			fmt.Fprintln(f, "accepted")
			f.Close()
		}
	})
	for {
		if _, err := os.Stat(flags["--gate"]); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	http, err := net.Listen("tcp", flags["--listen"])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	acceptAll(http, func() {})
}

// acceptAll closes every connection l accepts, calling accepted after each.
func acceptAll(l net.Listener, accepted func()) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
		accepted()
	}
}

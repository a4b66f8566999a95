//go:build !wasip1

package main

import "time"

// hostTime is the wall clock natively (the module only runs in a host).
func hostTime() int64 { return time.Now().UnixNano() }

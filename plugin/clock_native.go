//go:build !wasip1

package plugin

import "time"

// wallClock is the clock in Unix nanoseconds (see clock_wasip1.go).
func wallClock() int64 { return time.Now().UnixNano() }

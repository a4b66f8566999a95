// Package loopback finds free ports on 127.0.0.1 for the processes the tests
// and benchmarks start (Envoy, redis-server, the limit service).
package loopback

import (
	"fmt"
	"net"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it; callers that can, retry.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("loopback: %w", err)
	}
	defer l.Close()
	a, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("loopback: listener address %v is not TCP", l.Addr())
	}
	return a.Port, nil
}

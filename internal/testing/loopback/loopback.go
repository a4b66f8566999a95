// Package loopback finds free ports on 127.0.0.1 for the processes the tests
// and benchmarks start (Envoy, redis-server, the limit service).
package loopback

import (
	"fmt"
	"net"
	"sync"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that it has not returned before in this process: two calls in a row (the
// ports of two listeners of one Envoy) get different ports even when the
// kernel hands the same one out twice. Another process may take it before
// the caller binds it; callers that can, retry.
func FreePort() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("loopback: %w", err)
		}
		a, ok := l.Addr().(*net.TCPAddr)
		l.Close()
		if !ok {
			return 0, fmt.Errorf("loopback: listener address %v is not TCP", l.Addr())
		}
		if !given[a.Port] {
			given[a.Port] = true
			return a.Port, nil
		}
	}
	return 0, fmt.Errorf("loopback: no port that was not handed out already in 100 tries")
}

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

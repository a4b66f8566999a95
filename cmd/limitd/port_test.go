package main

import (
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestListenDefaultIsNotThePeers: --listen's default port is none that
// envoyproxy/ratelimit's environment defaults to (its HTTP, gRPC, debug,
// statsd and Prometheus ports, read from ratelimitEnv, the one home of
// those defaults), so limitd beside the peer, or a fleet moving from it,
// does not meet its ports (before, --listen defaulted to 127.0.0.1:8081,
// the peer's GRPC_PORT).
func TestListenDefaultIsNotThePeers(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(o.listen)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("--listen defaults to %q: want 127.0.0.1:<port> (%v)", o.listen, err)
	}
	peers := map[string]string{} // port -> the variable defaulting to it
	named := map[string]bool{}
	for _, s := range ratelimitEnv {
		p := s.Default
		if _, pp, err := net.SplitHostPort(p); err == nil {
			p = pp
		} else if s.Name != "PORT" && !strings.HasSuffix(s.Name, "_PORT") {
			continue
		}
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n < 65536 {
			peers[p] = s.Name
			named[s.Name] = true
		}
	}
	for _, name := range []string{"PORT", "GRPC_PORT", "DEBUG_PORT"} { // the table must still say these
		if !named[name] {
			t.Fatalf("no port default found for %s in ratelimitEnv: %v", name, peers)
		}
	}
	if name, ok := peers[port]; ok {
		t.Errorf("--listen defaults to %s, port %s: envoyproxy/ratelimit's %s default", o.listen, port, name)
	}
}

package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
)

// TestPortClashNamesTheFlag: a listener that cannot bind names the flag of
// its address, for every listener limitd opens (before, --listen's said
// only "listen tcp 127.0.0.1:8081: bind: address already in use").
func TestPortClashNamesTheFlag(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().String()
	cfg := writeConfig(t, rlsYAML)
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"--listen", []string{"--listen", busy}},
		{"--grpc-listen", []string{"--listen", "127.0.0.1:0", "--grpc-listen", busy, "--rls-config", cfg}},
		{"--metrics-listen", []string{"--listen", "127.0.0.1:0", "--metrics-listen", busy}},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		err := run(ctx, tc.args, env(), io.Discard, func(string) { cancel() })
		cancel()
		if err == nil || !strings.HasPrefix(err.Error(), tc.flag+":") || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("%s on a port in use: %v, want an error starting %q", tc.flag, err, tc.flag+":")
		}
	}
}
